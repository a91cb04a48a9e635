"""What several test modules share: where the repository and its fixtures are, the command line run as a
user runs it, a page's samples, and the node states the export paths are compared over."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m otel_numa ARGS`` without the caller's OTEL_* settings, as a user would run it."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "NODE_NAME"))}
    clean.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "otel_numa", *args],
        capture_output=True,
        text=True,
        env=clean,
        cwd=REPO,
        timeout=60,
    )


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A Prometheus text page's samples by name: (labels, value) each."""
    result: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            result.setdefault(sample.name, []).append((sample.labels, sample.value))
    return result


def generations(node: Any, agent: Any) -> Iterator[int]:
    """Five states of a large ``node``, each read by ``agent`` before it is yielded: 0 and 1 the same, 2 and
    3 new cgroup values for the same series, 4 one pod fewer."""
    for generation in range(5):
        if generation in (2, 3):
            node.write_cgroup_usage(generation)
        if generation == 4:
            shutil.rmtree(next((node.root / "pod-logs").iterdir()))
        agent.refresh_background()
        yield generation


class InProcessExporter(MetricExporter):
    """A metric exporter of the tests': nothing to flush or shut down; each says what its export does."""

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None
