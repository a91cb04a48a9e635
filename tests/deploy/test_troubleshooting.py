"""docs/troubleshooting.md stays true to the agent: it explains every health series the catalogue has, and
quotes the start-up warnings and exit messages the agent really prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from otel_numa.instruments import catalogue
from otel_numa.instruments.catalogue import MetricGroup
from tests.support import REPO

GUIDE = (REPO / "docs" / "troubleshooting.md").read_text()


def test_every_health_series_is_explained() -> None:
    rows = set(re.findall(r"^\| `([a-z_]+)(?:\{[^`]*\})?` \|", GUIDE, re.MULTILINE))
    health = {spec.prometheus_name for spec in catalogue.METRICS if spec.group == MetricGroup.HEALTH}
    assert health <= rows, health - rows


def test_wrong_root_warnings_are_quoted_as_the_agent_prints_them(tmp_path: Path) -> None:
    empty = tmp_path / "DIR"
    empty.mkdir()
    done = subprocess.run(
        [
            *(sys.executable, "-m", "otel_numa", "--once", "--podresources-socket", "none"),
            *("--sysfs-root", str(empty), "--kubelet-root", str(empty), "--cgroup-root", str(empty)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    warnings = [line for line in done.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 3, done.stderr
    for line in warnings:
        # the message up to "; numa.agent.source.success ...", with the directory written as DIR
        message = line.split(": ", 1)[1].split("; numa.agent.source.success")[0].replace(str(empty), "DIR")
        quoted = re.sub(r"\(cpu_manager_state.*?\)", "(...)", message)
        quoted = re.sub(r"\(no cgroup\.controllers.*?\)", "(...)", quoted)
        assert f"`{quoted}`" in GUIDE, quoted
