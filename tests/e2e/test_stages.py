"""A bug in one snapshot build stage costs that stage's series only: an exception injected into each stage
of a serving agent leaves every other stage's series on a real Prometheus scrape and in an OTLP push to
rotel, and is counted as ``error_type="internal"``."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_numa.snapshot import builder as builder_module
from otel_numa.snapshot.collectors.background import BackgroundSources
from otel_numa.snapshot.collectors.cgroups import CgroupCollector
from otel_numa.snapshot.collectors.machine import MachineCollector
from otel_numa.testing.cgroup_tree import FakeContainer, FakePod, write_cgroup_tree
from otel_numa.testing.checkpoints import write_cpu_manager_state
from otel_numa.testing.cri_server import CriServer, one_running_container
from otel_numa.testing.kubelet_scenario import KubeletScenario, ScenarioPod, build_scenario
from otel_numa.testing.peers import Prometheus, free_port, run_prometheus, run_rotel, wait_for
from otel_numa.testing.podresources_server import short_socket_dir
from otel_numa.testing.sysfs_tree import uniform_nodes

pytestmark = pytest.mark.e2e

UID = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d"
CONTAINER_ID = "e" * 64

# stage -> (its source, a series only it yields, a series of another stage that must survive)
STAGES = {
    "machine": ("sysfs", "numa_cpu_capacity", "numa_agent_stage_success"),
    "allocation": ("cpu_manager", "numa_cpu_allocated", "numa_cpu_capacity"),
    "container_usage": ("cgroup", "numa_container_memory_usage_bytes", "numa_cpu_allocated"),
    "enrichment": ("cri", "numa_container_info", "numa_cpu_capacity"),
}


def _boom(*_args: Any, **_kwargs: Any) -> Any:
    raise RuntimeError("injected bug")


INJECT = {
    "machine": (MachineCollector, "collect"),
    "allocation": (builder_module, "compute_allocation"),
    "container_usage": (CgroupCollector, "join"),
    "enrichment": (BackgroundSources, "enrich"),
}


@pytest.fixture
def node(tmp_path: Path) -> KubeletScenario:
    scenario = build_scenario(tmp_path, uniform_nodes(2, 4), [ScenarioPod(UID, "api-0", "shop")])
    write_cpu_manager_state(scenario.cpu_manager_path, "static", {0, 1, 2, 3, 6, 7}, {UID: {"api": {4, 5}}})
    return scenario


@pytest.fixture
def runtime() -> Iterator[CriServer]:
    directory = short_socket_dir()
    with CriServer(directory / "containerd.sock") as server:
        one_running_container(server, (UID, "api-0", "shop"), (CONTAINER_ID, "api"), labels={"team": "shop"})
        yield server
    shutil.rmtree(directory, ignore_errors=True)


def _cgroups(tmp_path: Path) -> tuple[Path, Path]:
    cgroup, logs = tmp_path / "cgroup", tmp_path / "containers"
    pod = FakePod(UID, "guaranteed", (FakeContainer(CONTAINER_ID, {"anon": {0: 4096, 1: 8192}}),))
    write_cgroup_tree(cgroup, "v2", "systemd", [pod])
    logs.mkdir()
    (logs / f"api-0_shop_api-{CONTAINER_ID}.log").symlink_to("/var/log/pods/shop_api-0/api/0.log")
    return cgroup, logs


def _names(prom: Prometheus) -> set[str]:
    return {sample["metric"]["__name__"] for sample in prom.query('{__name__=~"numa.*"}')}


@pytest.mark.parametrize("stage", list(STAGES))
def test_an_exception_in_one_stage_costs_only_its_series(
    stage: str,
    node: KubeletScenario,
    runtime: CriServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source, own_series, surviving_series = STAGES[stage]
    cgroup, logs = _cgroups(tmp_path)
    port = free_port()
    with run_rotel(tmp_path) as rotel:
        agent = node.agent(
            cgroup_root=cgroup,
            container_logs_root=logs,
            cri_socket=str(runtime.socket_path),
            enrich_pod_labels="team",
            exporters="prometheus,otlp",
            otlp_endpoint=f"http://127.0.0.1:{rotel.grpc_port}",
            prometheus_address=f"127.0.0.1:{port}",
            health_address="none",
            interval=1,
        )
        target, name = INJECT[stage]
        monkeypatch.setattr(target, name, _boom)
        agent.start()
        try:
            with run_prometheus(tmp_path, [f"127.0.0.1:{port}"]) as prom:
                wait_for(lambda: surviving_series in _names(prom), 30, f"{surviving_series} scraped")
                names = _names(prom)
                internal = prom.query(
                    f'numa_agent_source_errors_total{{numa_source="{source}",error_type="internal"}}'
                )
                failed_stage = prom.query(f'numa_agent_stage_success{{numa_stage="{stage}"}}')
            pushed = wait_for(lambda: rotel.latest("numa.agent.stage.success"), 30, "an OTLP push")
        finally:
            agent.stop(timeout_s=2)
    assert own_series not in names
    assert surviving_series in names
    assert float(internal[0]["value"][1]) >= 1
    assert float(failed_stage[0]["value"][1]) == 0
    # the push carries the other stages' series too
    pushed_names = {metric.name for batch in rotel.batches() for metric in batch.metrics}
    assert pushed is not None and "numa.agent.source.errors" in pushed_names
    if stage != "machine":
        assert "numa.cpu.capacity" in pushed_names
    else:
        assert "numa.cpu.capacity" not in pushed_names


def test_an_exception_in_one_instruments_callback_costs_only_its_series(
    node: KubeletScenario, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from otel_numa.instruments import machine

    _observe, part = machine.OBSERVERS["numa.memory.capacity"]
    monkeypatch.setitem(machine.OBSERVERS, "numa.memory.capacity", (_boom, part))
    text = node.exposition()
    assert "numa_memory_capacity_bytes{" not in text
    assert "numa_cpu_capacity{" in text and "numa_cpu_allocated{" in text
    assert "internal error observing numa.memory.capacity" in caplog.text
