"""The command line as users meet it: --once on this machine, bad settings, precedence of sources."""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil
import pytest
import yaml

from otel_numa.cli.main import load_settings, settings_markdown
from otel_numa.cli.settings import FLAGS, Settings
from otel_numa.instruments import catalogue
from otel_numa.instruments.catalogue import MetricGroup
from tests.support import REPO, run_cli, samples


def node_mem_totals() -> dict[int, int]:
    """MemTotal per node, read with a plain split (sandboxes may disagree with /proc/meminfo here)."""
    totals = {}
    for directory in Path("/sys/devices/system/node").glob("node[0-9]*"):
        for line in (directory / "meminfo").read_text().splitlines():
            fields = line.split()
            if fields[2:3] == ["MemTotal:"]:
                totals[int(fields[1])] = int(fields[3]) * 1024
    return totals or {0: psutil.virtual_memory().total}


def test_once_on_this_machine() -> None:
    done = run_cli("--once", "--node-name", "live")
    assert done.returncode == 0, done.stderr
    found = samples(done.stdout)
    # psutil reads the machine independently of the agent's parsers
    cpus = sum(value for _, value in found["numa_cpu_capacity"])
    assert cpus == psutil.cpu_count(logical=True)
    memory = {int(labels["numa_node_id"]): value for labels, value in found["numa_memory_capacity_bytes"]}
    assert memory == node_mem_totals()
    assert found["numa_node_count"] == [({"k8s_node_name": "live"}, len(found["numa_cpu_capacity"]))]
    for name, series in found.items():
        if name != "target_info":
            assert all(labels.get("k8s_node_name") == "live" for labels, _ in series), name
    # no kubelet on this machine: no allocation series, never a 0 that looks like data
    assert "numa_cpu_allocated" not in found and "numa_memory_allocatable_bytes" not in found


def test_once_with_groups_disabled(tmp_path: Path) -> None:
    done = run_cli("--once", "--disable", "usage,distances", "--disable", "health")
    assert done.returncode == 0, done.stderr
    found = samples(done.stdout)
    assert "numa_cpu_capacity" in found
    for absent in ("numa_node_distance", "numa_cpu_time_seconds_total", "numa_agent_source_age_seconds"):
        assert absent not in found


@pytest.mark.parametrize(
    ("args", "env", "config", "named"),
    [
        (["--interval", "soon"], {}, None, "interval"),
        (["--interval", "-1"], {}, None, "interval"),
        (["--interval", "1e-9"], {}, None, "interval"),  # at least 0.1: a smaller one spun a core
        (["--interval", "0.09"], {}, None, "interval"),
        (["--exporter", "statsd"], {}, None, "exporters"),
        (["--otlp-protocol", "udp"], {}, None, "otlp_protocol"),
        (["--otlp-endpoint", "localhost:4317"], {}, None, "otlp_endpoint"),
        (["--prometheus-address", "nowhere"], {}, None, "prometheus_address"),
        (["--reserved-cpus", "3-1"], {}, None, "reserved_cpus"),
        (["--disable", "everything"], {}, None, "disable"),
        (["--no-such-flag"], {}, None, "--no-such-flag"),
        ([], {"OTEL_NUMA_INTERVAL": "0"}, None, "interval"),
        ([], {"OTEL_NUMA_EXPORTERS": "prometheus,carrier-pigeon"}, None, "exporters"),
        ([], {}, "interval: 15\nintervall: 30\n", "intervall"),
        ([], {}, "exporters: [otlp, smoke-signals]\n", "exporters"),
        ([], {}, "interval: [1, 2\n", "config"),
        ([], {}, "- just\n- a list\n", "config"),
    ],
)
def test_bad_setting_exits_2_with_one_line(
    tmp_path: Path, args: list[str], env: dict[str, str], config: str | None, named: str
) -> None:
    if config is not None:
        path = tmp_path / "agent.yaml"
        path.write_text(config)
        args = [*args, "--config", str(path)]
    done = run_cli(*args, "--once", env=env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert named in lines[0]
    assert done.stdout == ""


def test_unreadable_config_file(tmp_path: Path) -> None:
    done = run_cli("--config", str(tmp_path / "missing.yaml"), "--once")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "config" in done.stderr and "missing.yaml" in done.stderr


def test_flags_over_environment_over_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(
        "interval: 30\nnode_name: from-file\nexporters: [otlp]\nreserved_cpus: 0-1\ndisable: [usage]\n"
    )
    for key in list(os.environ):
        if key.startswith(("OTEL_", "NODE_NAME")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("OTEL_NUMA_INTERVAL", "20")
    monkeypatch.setenv("NODE_NAME", "from-downward-api")
    settings, once = load_settings(["--config", str(config), "--interval", "10"])
    assert not once
    assert settings.interval == 10  # flag
    assert settings.node_name == "from-downward-api"  # NODE_NAME env beats the file
    assert settings.exporters == ("otlp",)  # file
    assert settings.reserved_cpus == frozenset({0, 1})
    assert settings.disable == frozenset({MetricGroup.USAGE})
    monkeypatch.setenv("OTEL_NUMA_NODE_NAME", "explicit")
    assert load_settings(["--config", str(config)])[0].node_name == "explicit"


def test_otlp_endpoint_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    assert load_settings([])[0].otlp_url == "http://localhost:4317"
    assert (
        load_settings(["--otlp-protocol", "http/protobuf"])[0].otlp_url == "http://localhost:4318/v1/metrics"
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert load_settings([])[0].otlp_url == "http://collector:4318/v1/metrics"
    # the metrics-specific variables win over the general ones; a URL with a path is kept as given
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "https://gw.example:443/otlp/v1/metrics")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc")
    settings = load_settings([])[0]
    assert settings.otlp_protocol == "grpc"
    assert settings.otlp_url == "https://gw.example:443/otlp/v1/metrics"


def test_podresources_socket_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings(["--kubelet-root", "/k"])[0]
    assert settings.podresources_socket_path == Path("/k/pod-resources/kubelet.sock")
    assert load_settings(["--podresources-socket", "none"])[0].podresources_socket_path is None


def help_entries(text: str) -> dict[str, str]:
    """--help's option entries: first option name -> its whole (joined) text."""
    entries: dict[str, str] = {}
    current = ""
    for line in text.splitlines():
        match = re.match(r"  (-\S+)", line)
        if match:
            current = match.group(1).split(",")[0]
            entries[current] = line
        elif current and line.startswith("    "):
            entries[current] += " " + line.strip()
        else:
            current = ""
    return entries


def test_help_gives_every_option_a_description_default_and_environment() -> None:
    done = run_cli("--help", env={"COLUMNS": "300"})
    assert done.returncode == 0, done.stderr
    entries = help_entries(done.stdout)
    commands = {"-h", "--once", "--list-metrics", "--version"}
    assert set(entries) == {flag.option for flag in FLAGS} | commands
    for flag in FLAGS:
        entry = entries[flag.option]
        match = re.search(rf"{re.escape(flag.option)} \S+\s+(.+?) Default: (.+?)\. Env: (.+)\.$", entry)
        assert match, entry
        description, default, environment = match.groups()
        assert len(description) > 15, entry
        assert environment.split(", then ")[0].startswith(("OTEL_NUMA_", "OTEL_EXPORTER_OTLP_")), entry
        assert default
    for command in commands:
        assert len(entries[command].split(None, 1)[1]) > 15, entries[command]
    # the groups are listed where they are asked for
    for group in MetricGroup:
        assert f"{group}: " in entries["--disable"]
    assert "--list-metrics" in entries["--metrics-exclude"]


def test_help_defaults_are_the_defaults_in_force(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("OTEL_", "NODE_NAME")):
            monkeypatch.delenv(key)
    settings = load_settings([])[0]
    entries = help_entries(run_cli("--help", env={"COLUMNS": "300"}).stdout)
    for option, setting, default in [
        ("--sysfs-root", "sysfs_root", "/sys"),
        ("--interval", "interval", "15"),
        ("--exporter", "exporters", "prometheus"),
        ("--container-memory-types", "container_memory_types", "anon,file"),
        ("--push-min-interval", "push_min_interval", "0.2"),
        ("--prometheus-address", "prometheus_address", "0.0.0.0:9464"),
    ]:
        assert f"Default: {default}." in entries[option]
        value = getattr(settings, setting)
        shown = ",".join(sorted(value)) if isinstance(value, frozenset | tuple) else str(value)
        assert shown.removesuffix(".0") == default


def test_environment_names_in_help_set_the_setting() -> None:
    entries = help_entries(run_cli("--help", env={"COLUMNS": "300"}).stdout)
    environment = re.search(r"Env: (\S+)\.$", entries["--push-min-interval"])
    assert environment is not None
    done = run_cli("--once", "--push-min-interval", "x")
    assert done.returncode == 2 and "push_min_interval" in done.stderr
    done = run_cli("--once", env={environment.group(1): "x"})
    assert done.returncode == 2 and "push_min_interval" in done.stderr


def test_version_and_list_metrics() -> None:
    done = run_cli("--version")
    assert done.returncode == 0 and re.fullmatch(r"otel-numa \d+\.\d+\.\d+\S*\n", done.stdout)
    done = run_cli("--list-metrics")
    assert done.returncode == 0, done.stderr
    listed = {line.split("\t")[1] for line in done.stdout.splitlines()}
    assert listed == set(catalogue.prometheus_names())


@pytest.mark.parametrize(
    ("config", "setting", "expected"),
    [
        ("exporter: otlp\n", "exporters", ("otlp",)),
        ("exporter: [otlp, prometheus]\n", "exporters", ("otlp", "prometheus")),
        ("sysfs-root: /host/sys\n", "sysfs_root", Path("/host/sys")),
        ("enrich-pod-label: [team]\n", "enrich_pod_labels", frozenset({"team"})),
        ("enrich_pod_label: team\n", "enrich_pod_labels", frozenset({"team"})),
        ("push-min-interval: 1\n", "push_min_interval", 1.0),
    ],
)
def test_config_keys_accept_the_flag_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str, setting: str, expected: object
) -> None:
    for key in list(os.environ):
        if key.startswith(("OTEL_", "NODE_NAME")):
            monkeypatch.delenv(key)
    path = tmp_path / "agent.yaml"
    path.write_text(config)
    assert getattr(load_settings(["--config", str(path)])[0], setting) == expected


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("exporterz: otlp\n", "unknown key 'exporterz'; did you mean 'exporter'?"),
        ("sysfs_rot: /sys\n", "unknown key 'sysfs_rot'; did you mean 'sysfs_root'?"),
        ("kubelet-dir: /x\n", "unknown key 'kubelet-dir'; did you mean 'kubelet-root'?"),
        ("colour: blue\n", "unknown key 'colour'; the keys are the flag names of otel-numa --help"),
        ("exporter: otlp\nexporters: [otlp]\n", "'exporters' and 'exporter' both set exporters"),
    ],
)
def test_unknown_config_key_names_the_nearest(tmp_path: Path, config: str, message: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(config)
    done = run_cli("--config", str(path), "--once")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr and str(path) in done.stderr


def test_readme_settings_table_is_generated_from_the_code() -> None:
    readme = (REPO / "README.md").read_text()
    assert settings_markdown() in readme, "run: python -m otel_numa.cli.main --update-readme README.md"


def test_example_config_lists_every_setting_and_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    example = REPO / "config" / "agent.example.yaml"
    text = example.read_text()
    # set, or shown commented out with an example value
    shown = set(re.findall(r"^(?:# )?([a-z_]+):", text, re.MULTILINE))
    assert shown >= {flag.setting for flag in FLAGS} - {"config"}
    assert set(yaml.safe_load(text)) <= set(Settings.model_fields)
    for key in list(os.environ):
        if key.startswith(("OTEL_", "NODE_NAME")):
            monkeypatch.delenv(key)
    assert load_settings(["--config", str(example)])[0].push_min_interval == 0.2
