"""Offline checks of the local demo stack: docker-compose.yaml and the files it mounts.

No Docker engine is needed: the Compose file is validated against the Compose Specification schema
(tests/fixtures/schemas/compose-spec.json), Prometheus's configuration with Prometheus's own promtool, the
agent's command and example configuration with the agent's own settings loader, and the wiring between the
services (addresses, ports, mounted paths) is followed by hand.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from otel_numa.cli.main import load_settings
from otel_numa.cli.settings import Settings
from otel_numa.instruments.catalogue import MetricGroup
from otel_numa.testing.compose import interpolate
from otel_numa.testing.demo import demo_podresources_state
from otel_numa.testing.kubelet_scenario import labels, series
from otel_numa.testing.podresources_server import PodResourcesServer, load_state, short_socket_dir
from tests.support import FIXTURES, REPO

COMPOSE = REPO / "docker-compose.yaml"
COMPOSE_SCHEMA = FIXTURES / "schemas" / "compose-spec.json"
COLLECTOR_CONFIG = REPO / "config" / "otel-collector.yaml"
PROMETHEUS_CONFIG = REPO / "config" / "prometheus" / "prometheus.yaml"
DEMO_PODRESOURCES = REPO / "config" / "demo" / "podresources.json"
GRAFANA = REPO / "config" / "grafana"
AGENT_EXAMPLE = REPO / "config" / "agent.example.yaml"

# The demo reads no host path: the whole node it describes lives in the repository.
HOST_SYSTEM_PATHS: set[str] = set()

# Keys of the YAML configuration file as documented: the flags with underscores, `exporters` as a
# list, and `disable`.
CONFIG_KEYS = {
    "sysfs_root",
    "procfs_root",
    "kubelet_root",
    "podresources_socket",
    "pod_logs_root",
    "reserved_cpus",
    "cgroup_root",
    "container_logs_root",
    "node_name",
    "exporters",
    "prometheus_address",
    "otlp_endpoint",
    "otlp_protocol",
    "interval",
    "compat",
    "health_address",
    "disable",
}
METRIC_GROUPS = {str(group) for group in MetricGroup}

# Defaults from the documented command-line table, written out by hand.
DOCUMENTED_DEFAULTS: dict[str, Any] = {
    "sysfs_root": "/sys",
    "procfs_root": "/proc",
    "kubelet_root": "/var/lib/kubelet",
    "podresources_socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
    "pod_logs_root": "/var/log/pods",
    "cgroup_root": "/sys/fs/cgroup",
    "container_logs_root": "/var/log/containers",
    "exporters": ["prometheus"],
    "prometheus_address": "0.0.0.0:9464",
    "otlp_endpoint": "http://localhost:4317",
    "otlp_protocol": "grpc",
    "interval": 15,
    "health_address": "0.0.0.0:9465",
}

PINNED_IMAGE = re.compile(r"^[a-z0-9./_-]+:v?\d+\.\d+\.\d+$")


def clear_agent_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent also reads OTEL_NUMA_*, OTEL_EXPORTER_OTLP_* and NODE_NAME: keep the test's own out."""
    for name in list(os.environ):
        if name.startswith(("OTEL_NUMA_", "OTEL_EXPORTER_OTLP_")) or name == "NODE_NAME":
            monkeypatch.delenv(name)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = load_yaml(COMPOSE)
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return dict(compose["services"])


@pytest.fixture(scope="module")
def collector() -> dict[str, Any]:
    document = load_yaml(COLLECTOR_CONFIG)
    assert isinstance(document, dict)
    return document


def agent_flags(service: dict[str, Any]) -> dict[str, str]:
    flags: dict[str, str] = {}
    for word in map(interpolate, service["command"]):
        assert word.startswith("--") and "=" in word, f"write agent flags as --name=value: {word!r}"
        name, _, value = word[2:].partition("=")
        flags[name] = value
    return flags


def bind_mounts(service: dict[str, Any]) -> list[dict[str, Any]]:
    mounts = []
    for volume in service.get("volumes", []):
        assert isinstance(volume, dict), "use the long volume syntax, it states read_only explicitly"
        if volume["type"] == "bind":
            mounts.append(volume)
    return mounts


def mount_target(service: dict[str, Any], source: str) -> str:
    matches = [m["target"] for m in bind_mounts(service) if m["source"] == source]
    assert len(matches) == 1, f"{source} is mounted {len(matches)} times"
    return str(matches[0])


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def pipeline_problems(config: dict[str, Any]) -> list[str]:
    """Components named by the service section but not defined, as the collector checks at start-up."""
    problems = []
    service = config.get("service", {})
    for extension in service.get("extensions", []):
        if extension not in (config.get("extensions") or {}):
            problems.append(f"extension {extension} is not defined")
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        problems.append("no pipeline")
    for name, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            defined = config.get(kind) or {}
            for component in pipeline.get(kind, []):
                if component not in defined:
                    problems.append(f"pipeline {name}: {kind[:-1]} {component} is not defined")
        if not pipeline.get("receivers") or not pipeline.get("exporters"):
            problems.append(f"pipeline {name} needs receivers and exporters")
    return problems


# ---------------------------------------------------------------- compose file


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(compose)


def test_schema_check_rejects_a_broken_compose_file(compose: dict[str, Any]) -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    broken = copy.deepcopy(compose)
    broken["services"]["agent"]["read_onyl"] = True
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(broken)


def test_compose_has_the_five_services(services: dict[str, Any]) -> None:
    assert set(services) == {"agent", "podresources", "otel-collector", "prometheus", "grafana"}


def test_images_are_pinned_to_a_version(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if "build" in service:
            build = service["build"]
            dockerfile = REPO / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
            assert dockerfile.is_file(), f"{name}: {dockerfile} is missing"
            continue
        assert PINNED_IMAGE.match(service["image"]), f"{name}: {service['image']} is not pinned to X.Y.Z"


def test_every_mounted_repository_path_exists(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for mount in bind_mounts(service):
            source = str(mount["source"])
            if source.startswith("/"):
                assert source in HOST_SYSTEM_PATHS, f"{name}: unexpected host path {source}"
            else:
                assert (REPO / source).exists(), f"{name}: {source} does not exist in the repository"
            assert mount.get("read_only") is True, f"{name}: {source} must be mounted read-only"


def test_ports_are_published_on_loopback_only(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port} is reachable from the network"


def test_agent_reads_the_host_and_the_demo_kubelet_read_only(services: dict[str, Any]) -> None:
    agent = services["agent"]
    flags = agent_flags(agent)
    assert flags["sysfs-root"] == mount_target(agent, "./config/demo/sysfs")
    assert flags["procfs-root"] == mount_target(agent, "./config/demo/procfs")
    assert flags["kubelet-root"] == mount_target(agent, "./config/demo/kubelet")
    assert flags["pod-logs-root"] == mount_target(agent, "./config/demo/pod-logs")
    assert flags["container-logs-root"] == mount_target(agent, "./config/demo/container-logs")
    assert flags["cgroup-root"] == mount_target(agent, "./config/demo/cgroup")
    assert agent.get("read_only") is True
    assert agent.get("cap_drop") == ["ALL"]


def test_agent_exports_both_ways(services: dict[str, Any]) -> None:
    exporters = set(agent_flags(services["agent"])["exporter"].split(","))
    assert exporters == {"prometheus", "otlp"}


def test_agent_accepts_its_compose_command(services: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    clear_agent_environment(monkeypatch)
    settings, once = load_settings([interpolate(word) for word in services["agent"]["command"]])
    assert not once
    assert settings.sysfs_root == Path("/demo/sysfs")
    assert settings.kubelet_root == Path("/demo/kubelet")
    assert settings.podresources_socket_path == Path("/run/podresources/kubelet.sock")
    assert settings.exporters == ("prometheus", "otlp")
    assert settings.otlp_url == "http://otel-collector:4317"
    assert settings.node_name == "demo-node"


def test_agent_pushes_to_the_collectors_otlp_receiver(
    services: dict[str, Any], collector: dict[str, Any]
) -> None:
    flags = agent_flags(services["agent"])
    endpoint = urlsplit(flags["otlp-endpoint"])
    assert endpoint.hostname in services, f"{endpoint.hostname} is not a compose service"
    assert endpoint.hostname == "otel-collector"
    protocol = {"grpc": "grpc", "http/protobuf": "http"}[flags["otlp-protocol"]]
    receiver = collector["receivers"]["otlp"]["protocols"][protocol]
    host, port = host_port(receiver["endpoint"])
    assert host == "0.0.0.0", "inside a container the receiver must listen on every interface"
    assert port == endpoint.port


def test_agent_health_port_matches_the_image_healthcheck(services: dict[str, Any]) -> None:
    flags = agent_flags(services["agent"])
    assert host_port(flags["health-address"])[1] == 9465
    assert "127.0.0.1:9465:9465" in [interpolate(port) for port in services["agent"]["ports"]]


def test_demo_node_is_coherent(services: dict[str, Any]) -> None:
    """The agent on the demo node as compose runs it, with the podresources test server answering from the
    same file: every allocation lies on the demo's own NUMA nodes, and allocatable CPUs and device capacity
    (which only podresources gives) are there."""
    agent = services["agent"]
    targets = {m["target"]: str(REPO / m["source"]) for m in bind_mounts(agent)}
    command = [interpolate(word) for word in agent["command"]]
    for target, source in targets.items():
        command = [word.replace(f"={target}", f"={source}") for word in command]
    socket_dir = short_socket_dir()
    command = [
        f"--podresources-socket={socket_dir / 'kubelet.sock'}"
        if word.startswith("--podresources-socket=")
        else word
        for word in command
    ]
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_NUMA_", "OTEL_EXPORTER_"))}
    try:
        with PodResourcesServer(socket_dir / "kubelet.sock", load_state(DEMO_PODRESOURCES)):
            completed = subprocess.run(
                [sys.executable, "-m", "otel_numa", *command, "--exporter=prometheus", "--once"],
                capture_output=True, text=True, timeout=60, env=environment,
            )  # fmt: skip
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
    assert completed.returncode == 0, completed.stderr
    text = completed.stdout
    capacity = series(text, "numa_cpu_capacity")
    nodes = {key for key in capacity}
    assert series(text, "numa_node_count") == {labels(): 4} and len(nodes) == 4
    assert sum(capacity.values()) == 16
    for name in ("numa_cpu_allocated", "numa_memory_allocated_bytes", "numa_memory_allocatable_bytes"):
        assert set(series(text, name)) == nodes, name
    allocated = series(text, "numa_cpu_allocated")
    assert all(allocated[node] <= capacity[node] for node in nodes)
    assert sum(series(text, "numa_container_cpu_allocated").values()) == sum(allocated.values()) == 10
    # postgres-0's pod-level CPUs are its container's: counted once in the per-NUMA totals
    assert sum(series(text, "numa_pod_cpu_allocated").values()) == 2
    assert sum(series(text, "numa_pod_memory_allocated_bytes").values()) == 1024**3
    # an aligned container beside two that span NUMA nodes, for the dashboard's alignment panels
    assert sorted(series(text, "numa_container_aligned").values()) == [0, 0, 1]
    memory = series(text, "numa_memory_allocated_bytes")
    assert sum(series(text, "numa_container_memory_allocated_bytes").values()) == sum(memory.values())
    errors = {key: value for key, value in series(text, "numa_agent_source_errors_total").items() if value}
    assert errors == {}, completed.stderr
    # podresources' allocatable CPUs 2-15, and its devices per NUMA node
    assert series(text, "numa_cpu_allocatable") == {
        labels(numa_node_id=n): 4 - (n == 0) * 2 for n in range(4)
    }
    assert sum(series(text, "numa_device_capacity").values()) == 6


def test_the_podresources_answer_is_the_demo_state() -> None:
    """config/demo/podresources.json is what generate.py writes: the demo's pods as the kubelet lists them."""
    state = load_state(DEMO_PODRESOURCES)
    expected = demo_podresources_state()
    assert list(state.pods) == list(expected.pods)
    assert state.allocatable == expected.allocatable


def test_podresources_server_and_agent_share_the_socket(services: dict[str, Any]) -> None:
    flags = agent_flags(services["agent"])
    server = services["podresources"]
    assert f"--socket={flags['podresources-socket']}" in server["command"]
    socket_dir = str(Path(flags["podresources-socket"]).parent)
    shared = {
        name: {
            v["source"]: v for v in service["volumes"] if v["type"] == "volume" and v["target"] == socket_dir
        }
        for name, service in (("agent", services["agent"]), ("podresources", server))
    }
    assert set(shared["agent"]) == set(shared["podresources"]) == {"podresources"}
    assert shared["agent"]["podresources"]["read_only"] is True
    assert mount_target(server, "./config/demo/podresources.json") in " ".join(server["command"])
    assert server["image"] == services["agent"]["image"]


# ---------------------------------------------------------------- collector


def test_collector_pipelines_use_only_defined_components(collector: dict[str, Any]) -> None:
    assert pipeline_problems(collector) == []


def test_pipeline_check_reports_undefined_components() -> None:
    config = {
        "receivers": {"otlp": {}},
        "exporters": {"prometheus": {}},
        "extensions": {},
        "service": {
            "extensions": ["health_check"],
            "pipelines": {
                "metrics": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["debug"]}
            },
        },
    }
    assert sorted(pipeline_problems(config)) == [
        "extension health_check is not defined",
        "pipeline metrics: exporter debug is not defined",
        "pipeline metrics: processor batch is not defined",
    ]


def test_collector_serves_prometheus_with_resource_labels(collector: dict[str, Any]) -> None:
    exporter = collector["exporters"]["prometheus"]
    assert host_port(exporter["endpoint"]) == ("0.0.0.0", 8889)
    assert exporter["resource_to_telemetry_conversion"]["enabled"] is True
    assert "prometheus" in collector["service"]["pipelines"]["metrics"]["exporters"]


def test_collector_receives_otlp_over_grpc_and_http(collector: dict[str, Any]) -> None:
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert host_port(protocols["grpc"]["endpoint"]) == ("0.0.0.0", 4317)
    assert host_port(protocols["http"]["endpoint"]) == ("0.0.0.0", 4318)


def test_collector_config_is_the_mounted_one(services: dict[str, Any]) -> None:
    service = services["otel-collector"]
    target = mount_target(service, "./config/otel-collector.yaml")
    assert f"--config={target}" in service["command"]


# ---------------------------------------------------------------- prometheus


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    return path


def test_prometheus_config_passes_promtool() -> None:
    result = subprocess.run(
        [promtool(), "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rejects_a_broken_config(tmp_path: Path) -> None:
    broken = load_yaml(PROMETHEUS_CONFIG)
    broken["scrape_configs"][0]["scrape_interval"] = "fifteen seconds"
    path = tmp_path / "prometheus.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = subprocess.run(
        [promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0


def test_prometheus_scrapes_the_agent_and_the_collector(
    services: dict[str, Any], collector: dict[str, Any]
) -> None:
    config = load_yaml(PROMETHEUS_CONFIG)
    targets = {
        job["job_name"]: [target for static in job["static_configs"] for target in static["targets"]]
        for job in config["scrape_configs"]
    }
    agent_port = host_port(agent_flags(services["agent"])["prometheus-address"])[1]
    collector_port = host_port(collector["exporters"]["prometheus"]["endpoint"])[1]
    assert targets == {
        "otel-numa": [f"agent:{agent_port}"],
        "otel-collector": [f"otel-collector:{collector_port}"],
    }
    by_name = {job["job_name"]: job for job in config["scrape_configs"]}
    assert by_name["otel-collector"].get("honor_labels", False) is False, (
        "the two paths need distinct job labels"
    )


def test_prometheus_reads_the_mounted_config_and_the_rules(services: dict[str, Any]) -> None:
    service = services["prometheus"]
    target = mount_target(service, "./config/prometheus")
    assert f"--config.file={target}/{PROMETHEUS_CONFIG.name}" in service["command"]
    rules = load_yaml(PROMETHEUS_CONFIG)["rule_files"]
    assert rules == ["otel-numa.rules.yaml"]
    assert (PROMETHEUS_CONFIG.parent / rules[0]).is_file(), "relative to the configuration, as mounted"


# ---------------------------------------------------------------- grafana


def test_grafana_datasource_points_at_prometheus(services: dict[str, Any]) -> None:
    documents = [
        load_yaml(path) for path in sorted((GRAFANA / "provisioning" / "datasources").glob("*.yaml"))
    ]
    datasources = [source for document in documents for source in document["datasources"]]
    assert len(datasources) == 1
    source = datasources[0]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    url = urlsplit(source["url"])
    assert url.hostname in services and url.hostname == "prometheus"
    assert url.port == 9090


def test_grafana_loads_the_dashboard_from_its_mount(services: dict[str, Any]) -> None:
    grafana = services["grafana"]
    assert mount_target(grafana, "./config/grafana/provisioning") == "/etc/grafana/provisioning"
    dashboards_target = mount_target(grafana, "./config/grafana/dashboards")
    documents = [load_yaml(path) for path in sorted((GRAFANA / "provisioning" / "dashboards").glob("*.yaml"))]
    providers = [provider for document in documents for provider in document["providers"]]
    assert [provider["options"]["path"] for provider in providers] == [dashboards_target]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dashboards_target + "/")
    assert (GRAFANA / "dashboards" / home.removeprefix(dashboards_target + "/")).is_file()


def test_grafana_lets_anonymous_visitors_view_only(services: dict[str, Any]) -> None:
    environment = services["grafana"]["environment"]
    assert environment["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert environment["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


# ---------------------------------------------------------------- agent example configuration


def test_example_config_uses_only_known_keys() -> None:
    config = load_yaml(AGENT_EXAMPLE)
    known = set(Settings.model_fields) - {"config"}
    assert set(config) <= known, set(config) - known


def test_example_config_mentions_every_setting() -> None:
    text = AGENT_EXAMPLE.read_text()
    mentioned = set(re.findall(r"^#?\s?([a-z_]+):", text, flags=re.MULTILINE))
    settings = set(Settings.model_fields) - {"config"}
    assert mentioned >= CONFIG_KEYS | settings, (CONFIG_KEYS | settings) - mentioned


def test_agent_loads_the_example_config_as_its_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_agent_environment(monkeypatch)
    from_file, _ = load_settings(["--config", str(AGENT_EXAMPLE)])
    defaults, _ = load_settings([])
    assert from_file.podresources_socket_path == defaults.podresources_socket_path
    assert from_file.otlp_url == defaults.otlp_url
    differing = {
        name for name in Settings.model_fields if getattr(from_file, name) != getattr(defaults, name)
    }
    assert differing == {"config", "podresources_socket", "otlp_endpoint"}


def test_example_config_shows_the_documented_defaults() -> None:
    config = load_yaml(AGENT_EXAMPLE)
    for key, value in DOCUMENTED_DEFAULTS.items():
        assert config[key] == value, key


def test_example_config_lists_valid_choices() -> None:
    config = load_yaml(AGENT_EXAMPLE)
    assert set(config["exporters"]) <= {"prometheus", "otlp", "console"}
    assert set(config["disable"]) <= METRIC_GROUPS
    comment = next(line for line in AGENT_EXAMPLE.read_text().splitlines() if "Metric groups" in line)
    assert {word.strip(" .,") for word in comment.split(":", 1)[1].split(",")} == METRIC_GROUPS
