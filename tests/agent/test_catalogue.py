"""The metric catalogue is the one description of every metric: the README's table is generated from it,
a real scrape shows exactly its metrics, and the layers it implies hold (what imports what, what is read)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_numa.cli.settings import Settings
from otel_numa.daemon.agent import Agent
from otel_numa.instruments import catalogue
from otel_numa.testing.cri_server import CriServer, one_running_container
from otel_numa.testing.demo import DEMO, demo_podresources_state
from otel_numa.testing.device_tree import add_pci_function
from otel_numa.testing.large_node import LargeNodeSpec, write_large_node
from otel_numa.testing.peers import REPO, free_port, http_get, run_agent, run_prometheus, wait_for
from otel_numa.testing.podresources_server import PodResourcesServer, short_socket_dir

WEB_UID = "6f1c1e4e-3d4b-4c55-9a57-0d7f4c2b1a01"  # config/demo: default/web-0, container app


def test_readme_metric_table_is_generated_from_the_catalogue() -> None:
    readme = (REPO / "README.md").read_text()
    assert catalogue.replace_table(readme) == readme, (
        "README.md's metric table differs from the catalogue: run "
        "`python -m otel_numa.instruments.catalogue --update-readme README.md`"
    )


def test_prometheus_names_follow_the_exporters_rules() -> None:
    names = {spec.name: spec.prometheus_name for spec in catalogue.METRICS}
    assert names["numa.memory.capacity"] == "numa_memory_capacity_bytes"
    assert names["numa.cpu.time"] == "numa_cpu_time_seconds_total"
    assert names["numa.memory.page.allocations"] == "numa_memory_page_allocations_total"
    assert names["numa.container.memory.locality"] == "numa_container_memory_locality"
    assert names["numa.agent.source.age"] == "numa_agent_source_age_seconds"
    assert len(set(names.values())) == len(names)


def test_excluding_by_either_name_or_glob_and_groups_that_take_others_along() -> None:
    def names(*args: object, **kwargs: bool) -> set[str]:
        return {spec.name for spec in catalogue.select(*args, **kwargs)}  # type: ignore[arg-type]

    every = names()
    assert "numa.cpu.time" not in names((), ["numa_cpu_time_seconds_total"])
    assert not {n for n in names((), ["numa.container.*"]) if n.startswith("numa.container.")}
    assert not {n for n in names([catalogue.MetricGroup.CONTAINERS]) if n.startswith("numa.container.")}
    assert not {n for n in every if n.startswith("numainfo")}
    assert {n for n in names(compat=True) if n.startswith("numainfo")} == {
        "numainfo_node_count",
        "numainfo_core_count",
        "numainfo_version",
    }


def test_accounting_imports_neither_grpc_nor_opentelemetry() -> None:
    probe = (
        "import sys, otel_numa.accounting.allocation, otel_numa.accounting.usage, otel_numa.accounting.join; "
        "print([m for m in sys.modules if m.split('.')[0] in ('grpc', 'opentelemetry', 'pydantic')])"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_import_layers_hold() -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.split("Contracts:")[-1].replace("0 broken", "")


def _mapped_files(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_the_serving_process_loads_neither_pydantic_nor_an_unneeded_grpc(tmp_path: Path) -> None:
    """The settings machinery stays in the process that exec'ed; gRPC (about 13 MB) is loaded only for a
    gRPC peer that is configured and present: here the podresources socket is configured but absent and
    there is no OTLP gRPC exporter."""
    absent = tmp_path / "pod-resources" / "kubelet.sock"
    with run_agent(["--podresources-socket", str(absent), "--interval", "1"], tmp_path) as agent:
        wait_for(lambda: "podresources is not available" in agent.log(), 10, "a podresources attempt")
        maps = _mapped_files(agent.process.pid)
        cmdline = Path(f"/proc/{agent.process.pid}/cmdline").read_bytes().split(b"\0")
        assert b"otel_numa.daemon.serve" in cmdline  # the same PID, exec'ed into the serving module
        environment = Path(f"/proc/{agent.process.pid}/environ").read_bytes().split(b"\0")
        assert b"MALLOC_ARENA_MAX=1" in environment  # one malloc arena, from the program's start
        assert b"GLIBC_TUNABLES=glibc.malloc.tcache_count=0" in environment  # no per-thread block cache
        assert "pydantic_core" not in maps
        assert "cygrpc" not in maps
        assert http_get(f"http://127.0.0.1:{agent.prometheus_port}/metrics")[0] == 200


def test_a_real_scrape_shows_exactly_the_catalogues_metrics(
    tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    """Every group on, compat on, runtime enrichment on: the demo node's page has every catalogue metric
    and nothing else."""
    machine, procfs = hwloc_root("16amd64-4n4c-cgroup-distance-merge")
    sysfs = tmp_path / "sys"
    shutil.copytree(machine, sysfs, symlinks=True)
    nic = sysfs / "bus/pci/devices/0000:3b:00.0"  # the snapshot has no PCI bus: one NIC on node 1
    nic.mkdir(parents=True)
    (nic / "class").write_text("0x020000\n")
    (nic / "numa_node").write_text("1\n")
    state = demo_podresources_state()
    pod = state.pods[1]  # matcher-0 with pod-level resources: its containers' CPUs and memory
    pod.cpu_ids.extend(cpu for container in pod.containers for cpu in container.cpu_ids)
    pod.memory.extend(block for container in pod.containers for block in container.memory)
    demo = tmp_path / "demo"
    shutil.copytree(DEMO, demo, symlinks=True)
    cri_dir = short_socket_dir()
    try:
        with (
            PodResourcesServer(state=state) as server,
            CriServer(cri_dir / "containerd.sock") as runtime,
        ):
            one_running_container(
                runtime, (WEB_UID, "web-0", "default"), ("c1", "app"), labels={"team": "web"}
            )
            args = [
                "--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--node-name", "catalogue-node",
                "--kubelet-root", str(demo / "kubelet"), "--pod-logs-root", str(demo / "pod-logs"),
                "--container-logs-root", str(demo / "container-logs"), "--cgroup-root", str(demo / "cgroup"),
                "--podresources-socket", str(server.socket_path), "--interval", "1",
                "--reserved-cpus", "0-1", "--compat", "numainfo",
                "--cri-socket", str(runtime.socket_path), "--enrich-pod-label", "team",
                # the push series are there only with the otlp exporter; nobody listens at the endpoint
                "--exporter", "prometheus,otlp", "--otlp-endpoint", f"http://127.0.0.1:{free_port()}",
            ]  # fmt: skip
            with (
                run_agent(args, tmp_path) as agent,
                run_prometheus(tmp_path, [f"127.0.0.1:{agent.prometheus_port}"]) as prom,
            ):
                wait_for(lambda: prom.query("numa_container_info"), 40, "the runtime's enrichment")
                wait_for(lambda: prom.query("numa_container_memory_locality"), 40, "container usage")
                status, body = http_get(f"http://127.0.0.1:{prom.port}/api/v1/label/__name__/values")
    finally:
        shutil.rmtree(cri_dir, ignore_errors=True)
    assert status == 200
    scraped = set(json.loads(body)["data"]) - {"up", "target_info"}
    scraped = {name for name in scraped if not name.startswith("scrape_")}
    assert scraped == catalogue.prometheus_names()


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is installed by scripts/setup.sh --test")
def test_a_switched_off_group_reads_nothing(tmp_path: Path) -> None:
    """Everything but topology switched off: an strace of scrapes shows no access to /proc/stat or to any
    kubelet file; the same agent with every group on opens both (so the trace can tell)."""
    kubelet = tmp_path / "kubelet"
    shutil.copytree(DEMO / "kubelet", kubelet)

    def opened_during_scrapes(*extra: str) -> str:
        args = ["--kubelet-root", str(kubelet), "--podresources-socket", "none", "--interval", "600", *extra]
        trace = tmp_path / "trace.txt"
        with run_agent(args, tmp_path) as agent:
            # -f: each scrape is served by a new thread
            tracer = subprocess.Popen(
                [
                    "strace",
                    "-f",
                    "-qq",
                    "-e",
                    "trace=%file",
                    "-o",
                    str(trace),
                    "-p",
                    str(agent.process.pid),
                ],
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_for(lambda: trace.exists(), 10, "strace to attach")
                time.sleep(0.5)
                for _ in range(2):
                    assert http_get(f"http://127.0.0.1:{agent.prometheus_port}/metrics")[0] == 200
            finally:
                tracer.send_signal(signal.SIGINT)
                tracer.wait(timeout=10)
        return trace.read_text()

    everything = opened_during_scrapes()
    assert '"/proc/stat"' in everything and str(kubelet) in everything
    topology_only = opened_during_scrapes(
        "--disable", "distances,usage,allocation,containers,container_usage,health"
    )
    assert "/devices/system/node" in topology_only or "/devices/system/cpu" in topology_only
    assert '"/proc/stat"' not in topology_only
    assert str(kubelet) not in topology_only


def test_each_metric_alone_still_has_its_series(tmp_path: Path) -> None:
    """What a metric needs read is declared in its catalogue entry and nowhere else: with every other
    metric excluded, each metric of a small Kubernetes node's page is still there (a forgotten machine part
    or source would leave it silently empty)."""
    spec = LargeNodeSpec(
        numa_nodes=2,
        cpus_per_node=4,
        mem_per_node_kib=4 << 20,
        hugepage_sizes_kib=(2048,),
        pods=2,
        containers_per_pod=2,
        device_resources=("example.com/gpu",),
        devices_per_resource=2,
        exclusive_pod_every=2,
    )
    node = write_large_node(tmp_path / "node", spec)
    add_pci_function(node.sysfs_root, "0000:3b:00.0", "0x020000", numa_node="1")

    def page(excluded: list[str]) -> str:
        settings = Settings(**node.settings_values(), metrics_exclude=excluded)  # type: ignore[arg-type]
        return Agent(settings.to_options()).exposition_once().decode()

    for name in sorted(EVERY_METRIC_OF_A_SMALL_NODE):
        others = [other.name for other in catalogue.METRICS if other.name != name]
        alone = {family.name for family in text_string_to_metric_families(page(others)) if family.samples}
        assert by_family_name(name) in alone, f"{name} is empty when it is the only metric enabled"
    every = {family.name for family in text_string_to_metric_families(page([])) if family.samples}
    assert every == {by_family_name(name) for name in EVERY_METRIC_OF_A_SMALL_NODE} | {"target_info"}


# What the node of the test above shows with every default group on: written out, not derived from the
# catalogue, so that a metric the catalogue leaves unread is missed here.
EVERY_METRIC_OF_A_SMALL_NODE = frozenset(
    {
        *(
            "numa.node.count",
            "numa.node.distance",
            "numa.cpu.capacity",
            "numa.cpu.allocated",
            "numa.cpu.time",
        ),
        *("numa.memory.capacity", "numa.memory.usage", "numa.memory.allocatable", "numa.memory.allocated"),
        *("numa.hugepages.capacity", "numa.hugepages.free", "numa.hugepages.allocatable"),
        *("numa.hugepages.allocated", "numa.device.allocated", "numa.memory.page.allocations"),
        "numa.pci.device.count",
        *("numa.container.cpu.allocated", "numa.container.memory.allocated", "numa.container.aligned"),
        *("numa.container.hugepages.allocated", "numa.container.device.allocated"),
        *("numa.container.memory.usage", "numa.container.cpu.time", "numa.container.memory.locality"),
        "numa.container.cpuset.nodes",
        *("numa.cpu.pinned", "numa.container.allocation.mismatch"),
        *("numa.agent.source.errors", "numa.agent.source.age", "numa.agent.source.duration"),
        *("numa.agent.source.success", "numa.agent.stage.duration", "numa.agent.stage.success"),
        "numa.agent.fast_path",
        *("process.cpu.time", "process.memory.usage", "process.open_file_descriptor.count"),
        "process.thread.count",
    }
)


def by_family_name(name: str) -> str:
    return catalogue.BY_NAME[name].prometheus_name.removesuffix("_total")
