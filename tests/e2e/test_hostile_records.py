"""Hostile records against the agent as it serves: CDI specs that cost more to parse than they weigh,
podresources answers beyond the machine, and nodes of thousands of containers.

In the style of :mod:`tests.e2e.test_hostile_files`: the agent runs as a daemon with both readers pushing to
rotel, each test attacks it while it serves and shows what an operator sees: the page still answers within
1 s, pushes still arrive, the peak RSS stays bounded, the error is counted on
``numa_agent_source_errors_total{numa_source,error_type}``, and nothing past a limit becomes a series.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from otel_numa.model import DraClaim, DraDevice
from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.testing.checkpoints import write_atomically
from otel_numa.testing.device_tree import add_iommu_group, add_pci_function, cdi_spec, write_cdi_spec
from otel_numa.testing.dra_checkpoint import dra_checkpoint_bytes
from otel_numa.testing.hostile_cdi import aliased_spec, laughing_spec, plain_yaml_spec
from otel_numa.testing.kubelet_scenario import series
from otel_numa.testing.large_node import LargeNode, crowded, write_large_node
from otel_numa.testing.peers import AgentProcess, run_agent, run_prometheus, run_rotel, wait_for
from otel_numa.testing.podresources_server import PodResourcesServer, load_state
from tests.e2e.test_hostile_files import SPEC, Serving, serving

pytestmark = pytest.mark.e2e

CDI_GROWTH_BYTES = 32 << 20  # over the first page's peak (a spec within its budget: ~10-20 MB parsed)


@pytest.fixture
def node(tmp_path: Path) -> LargeNode:
    return write_large_node(tmp_path / "node", SPEC)


@contextmanager
def serving_cdi(node: LargeNode, tmp_path: Path) -> Iterator[tuple[Serving, Path]]:
    cdi = tmp_path / "cdi"
    cdi.mkdir(exist_ok=True)
    with serving(node, tmp_path, extra_args=["--cdi-spec-dirs", str(cdi)]) as agent:
        yield agent, cdi


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def source_duration(page: str, source: str) -> float:
    durations = series(page, "numa_agent_source_duration_seconds")
    return next(value for labels, value in durations.items() if dict(labels)["numa_source"] == source)


# --- CDI specs cost what they weigh ----------------------------------------------------------------


def test_aliased_cdi_specs_are_refused_without_growing(node: LargeNode, tmp_path: Path) -> None:
    """A 1.5 MB spec of 20,000 devices sharing one aliased list of 50,000 device nodes (it took the agent
    from 30 to 654 MB in 30 s) and a 0.5 KB one of nine levels of nested aliases: each refused at the
    alias that crosses the node budget (``over_limit``), with the peak RSS and every scrape unmoved."""
    with serving_cdi(node, tmp_path) as (agent, cdi):
        write_atomically(cdi / "alias.yaml", aliased_spec())
        write_atomically(cdi / "laughs.yaml", laughing_spec())
        wait_for(lambda: agent.errors("cdi").get("over_limit", 0) >= 2, 20, "both specs to be refused")
        agent.still_serving()
        assert agent.peak_rss() < agent.peak_before + CDI_GROWTH_BYTES
        agent.stop()
    assert "more than 100000 YAML nodes (aliases expanded)" in agent.agent.log()


def test_a_large_plain_yaml_spec_costs_no_more_than_its_budget(node: LargeNode, tmp_path: Path) -> None:
    """A 4 MiB spec of plain YAML (23,000 devices, ~480,000 nodes; it cost 32 s of CPU and 447 MB) is
    refused at the 100,000th node; one of 0.4 MB (2,100 devices) is read, its devices kept."""
    with serving_cdi(node, tmp_path) as (agent, cdi):
        write_atomically(cdi / "huge.yaml", plain_yaml_spec((4 << 20) - 4096))
        agent.wait_counted("cdi", "over_limit")
        write_atomically(cdi / "large.yaml", plain_yaml_spec(400_000))
        time.sleep(2)
        assert agent.errors("cdi").get("invalid_spec", 0) == 0
        agent.still_serving()
        assert agent.peak_rss() < agent.peak_before + CDI_GROWTH_BYTES
        agent.stop()


def test_unchanged_specs_are_not_parsed_again(node: LargeNode, tmp_path: Path) -> None:
    """A refused 4 MiB spec (~0.4 s of CPU to parse to its budget), its directory and itself stamped ten
    years ahead, then a driver adding and removing a claim's spec every 10 ms: scrapes every 0.2 s stay
    fast and the spec directory's read stays under 50 ms (it was re-parsed on every snapshot build: scrapes
    of 0.4-0.6 s, 0.7 of a core)."""
    with serving_cdi(node, tmp_path) as (agent, cdi):
        write_atomically(cdi / "huge.yaml", plain_yaml_spec((4 << 20) - 4096))
        agent.wait_counted("cdi", "over_limit")
        future = time.time_ns() + 10 * 365 * 86400 * 10**9
        for path in (cdi / "huge.yaml", cdi):
            os.utime(path, ns=(future, future))
        time.sleep(1.2)  # the stamping changed their ctime: read once more, out of its second
        wait_for(lambda: source_duration(agent.scrape(), "cdi") < 0.05, 10, "the spec read once more")
        idle_cpu = scraping_cpu(agent, seconds=4)
        stop = threading.Event()
        churn = threading.Thread(target=churn_claim_spec, args=(cdi, stop))
        churn.start()
        try:
            churning_cpu = scraping_cpu(agent, seconds=4)
        finally:
            stop.set()
            churn.join()
        assert idle_cpu < 0.5 and churning_cpu < 0.5, (idle_cpu, churning_cpu)  # of one core
        agent.still_serving()
        agent.stop()


def scraping_cpu(agent: Serving, seconds: float) -> float:
    """Scrape every 0.2 s for ``seconds``; the agent's CPU over that time, in cores. Each scrape within 1 s
    and each read of the spec directory under 50 ms."""
    pid = agent.agent.process.pid
    began, cpu_before = time.monotonic(), cpu_seconds(pid)
    while time.monotonic() - began < seconds:
        assert source_duration(agent.scrape(), "cdi") < 0.05
        time.sleep(0.2)
    return (cpu_seconds(pid) - cpu_before) / (time.monotonic() - began)


def churn_claim_spec(cdi: Path, stop: threading.Event) -> None:
    claim = cdi_spec("k8s.gpu.example.com/claim", {"gpu-0": [{"path": "/dev/gpu0"}]})
    while not stop.is_set():
        write_cdi_spec(cdi, "claim.json", claim)
        stop.wait(0.01)
        (cdi / "claim.json").unlink()
        stop.wait(0.01)


def test_a_spec_edited_in_place_is_read_again(node: LargeNode, tmp_path: Path) -> None:
    """A DRA device placed by its CDI spec's VFIO group, the spec then rewritten in place (truncated and
    written, its mtime put back as ``cp -p`` leaves it; the directory does not change): the device moves to
    the other NUMA node at once (the spec was never read again)."""
    add_pci_function(node.sysfs_root, "0000:d8:00.0", "0x120000", numa_node="0")
    add_pci_function(node.sysfs_root, "0000:d9:00.0", "0x120000", numa_node="1")
    add_iommu_group(node.sysfs_root, 42, ["0000:d8:00.0"])
    add_iommu_group(node.sysfs_root, 43, ["0000:d9:00.0"])
    device = DraDevice("vfio.example.com", "pool", "vf-a", ("example.com/vfio=vf-a",))
    claim = DraClaim("vf", SPEC.namespace, (device,), "claim-uid", frozenset({node.pods[0].uid}))
    write_atomically(node.kubelet_root / "dra_manager_state", dra_checkpoint_bytes([claim]))
    cdi = tmp_path / "cdi"
    spec = write_cdi_spec(
        cdi, "vfio.json", cdi_spec("example.com/vfio", {"vf-a": [{"path": "/dev/vfio/42"}]})
    )

    def vfio_node(agent: Serving) -> set[str]:
        found = series(agent.scrape(), "numa_device_allocated")
        return {
            dict(labels)["numa_node_id"]
            for labels, value in found.items()
            if dict(labels)["numa_resource_name"] == "vfio.example.com" and value == 1
        }

    with serving(node, tmp_path, extra_args=["--cdi-spec-dirs", str(cdi)]) as agent:
        assert vfio_node(agent) == {"0"}
        before, directory = os.stat(spec), os.stat(cdi)
        time.sleep(1.1)  # out of the second the spec was written in: its stat is trusted now
        agent.scrape()
        with open(spec, "r+b") as file:
            text = file.read().replace(b"/dev/vfio/42", b"/dev/vfio/43")
            file.seek(0)
            file.truncate()
            file.write(text)
        os.utime(spec, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert os.stat(cdi).st_mtime_ns == directory.st_mtime_ns
        wait_for(lambda: vfio_node(agent) == {"1"}, 10, "the device on NUMA node 1")
        agent.still_serving()
        agent.stop()


# --- podresources answers bounded like the checkpoints ---------------------------------------------


def node_answer(node: LargeNode, tmp_path: Path) -> PodResourcesServer:
    state_file = tmp_path / "podresources.json"
    state_file.write_text(json.dumps(node.podresources_state()))
    return PodResourcesServer(state=load_state(state_file))


def many_devices(count: int, numa_nodes: int) -> pb.AllocatableResourcesResponse:
    return pb.AllocatableResourcesResponse(
        devices=[
            pb.ContainerDevices(
                resource_name="example.com/many",
                device_ids=[f"d{index}"],
                topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=index % numa_nodes)]),
            )
            for index in range(count)
        ]
    )


def test_podresources_answers_beyond_the_machine_are_refused(node: LargeNode, tmp_path: Path) -> None:
    """Allocatable CPUs 0..3,999,999 (13.9 MB: it held 301 MB) and 200,000 devices on NUMA nodes
    0..199,999 (7.3 MB: they made 100,001 series) are not received (``resource_exhausted``); 100,000 devices
    (2.9 MB) are refused unparsed (``over_limit``); a CPU or NUMA nodes the 2-node, 32-CPU machine lacks
    refuse their answer (``out_of_range``). Each time the last good answer is served meanwhile. Each
    answer comes after a device plugin registered (its socket made in the kubelet's device-plugins
    directory), as the kubelet's allocatable resources change only then or when it restarts."""
    with (
        node_answer(node, tmp_path) as server,
        serving(node, tmp_path, extra_args=["--podresources-socket", str(server.socket_path)]) as agent,
    ):
        wait_for(lambda: series(agent.scrape(), "numa_device_capacity"), 20, "the allocatable devices")
        capacity = series(agent.scrape(), "numa_device_capacity")
        good = server.state.allocatable
        attacks = [
            ("resource_exhausted", pb.AllocatableResourcesResponse(cpu_ids=range(4_000_000))),
            ("resource_exhausted", many_devices(200_000, 200_000)),
            ("over_limit", many_devices(100_000, SPEC.numa_nodes)),
            ("out_of_range", pb.AllocatableResourcesResponse(cpu_ids=[*good.cpu_ids, SPEC.cpus + 8])),
            ("out_of_range", many_devices(10, 10)),
        ]
        for attack, (error_type, answer) in enumerate(attacks):
            seen = agent.errors("podresources").get(error_type, 0)
            server.state.allocatable = answer
            (node.kubelet_root / "device-plugins" / f"plugin-{attack}.sock").touch()
            wait_for(
                lambda: agent.errors("podresources").get(error_type, 0) > seen,  # noqa: B023 (waited for here)
                20,
                f"an answer refused as {error_type}",
            )
            assert series(agent.scrape(), "numa_device_capacity") == capacity, "the last good answer"
        agent.still_serving()
        agent.stop()
    assert "a CPU the machine does not have; the answer is left out" in agent.agent.log()


# --- nodes of thousands of containers --------------------------------------------------------------

# The chart's memory limit for nodes of up to 5,000 containers (docs/kubernetes.md, Resources); measured
# peaks are in docs/decisions/hostile-input.md (benchmarks/bench_containers.py).
CROWDED_MEMORY_LIMIT = 256 << 20
CONTAINER_SERIES_CAP = 2000


@pytest.mark.parametrize(("containers", "protocol"), [(2000, "grpc"), (5000, "http/protobuf")])
def test_thousands_of_containers_fit_the_charts_limit(containers: int, protocol: str, tmp_path: Path) -> None:
    """Per-container series stop at 2,000 containers, the per-NUMA totals count them all, and the agent's
    peak RSS stays under the chart's limit for such nodes while Prometheus scrapes it every 2 s (5,000
    containers peaked at 185 MB with a first scrape over 5 s, and every one of them had series). Their
    pushes (~24,000 points, ~5 MB in one request) go as requests of at most 10,000 points, which a gRPC
    receiver's default 4 MiB message limit lets through: none fails."""
    node = write_large_node(tmp_path / "node", crowded(containers))
    with node_answer(node, tmp_path) as server, run_rotel(tmp_path) as rotel:
        port = rotel.grpc_port if protocol == "grpc" else rotel.http_port
        args = [
            *node.cli_args(),
            *("--podresources-socket", str(server.socket_path), "--interval", "5"),
            *("--exporter", "prometheus,otlp", "--otlp-protocol", protocol),
            *("--otlp-endpoint", f"http://127.0.0.1:{port}"),
        ]
        with run_agent(args, tmp_path) as agent:
            peak = crowded_node_served(agent, tmp_path, containers, node)
            page = agent.metrics_text(timeout_s=30)  # thousands of containers on a loaded machine
        received = rotel.batches()
    # none refused (a message over the receiver's limit is a "failed" push); a push past --otlp-timeout on
    # a busy machine is the deadline at work, and the next one carries the data
    failures = {
        dict(labels)["error_type"]: value
        for labels, value in series(page, "numa_agent_export_failures_total").items()
    }
    assert failures.get("failed") == 0, failures
    on_page = {
        (dict(labels)["k8s_pod_uid"], dict(labels)["k8s_container_name"])
        for labels in series(page, "numa_container_memory_usage_bytes")
    }
    pushed = {
        (point.attributes["k8s.pod.uid"], point.attributes["k8s.container.name"])
        for batch in received
        for metric in batch.metrics
        if metric.name == "numa.container.memory.usage"
        for point in metric.points
    }
    assert len(pushed) == len(on_page) == CONTAINER_SERIES_CAP and pushed == on_page
    points = [sum(len(metric.points) for metric in batch.metrics) for batch in received]
    assert max(points) <= 10_000 < sum(points), points
    assert peak < CROWDED_MEMORY_LIMIT, f"peak RSS {peak >> 20} MB"


def crowded_node_served(agent: AgentProcess, tmp_path: Path, containers: int, node: LargeNode) -> int:
    """Prometheus' view of the crowded node checked; the agent's peak RSS."""
    expected = node.expected()
    assert agent.prometheus_port is not None
    target = f"127.0.0.1:{agent.prometheus_port}"
    with run_prometheus(tmp_path, [target], scrape_interval="2s") as prometheus:
        wait_for(lambda: prometheus.series("numa_container_memory_usage_bytes"), 60, "the cgroup walk")
        time.sleep(6)  # a few scrapes and a background round more
        assert prometheus.targets_up(), prometheus.targets()
        allocated = prometheus.series("numa_cpu_allocated")
        assert sum(allocated.values()) == sum(expected.cpus_by_numa.values())
        for name in ("numa_container_cpu_allocated", "numa_container_memory_usage_bytes"):
            stored = prometheus.series(name)
            containers_seen = {
                (dict(labels)["k8s_pod_uid"], dict(labels)["k8s_container_name"]) for labels in stored
            }
            assert 0 < len(containers_seen) <= CONTAINER_SERIES_CAP, (name, len(containers_seen))
        errors = {
            (dict(labels)["numa_source"], dict(labels)["error_type"]): value
            for labels, value in prometheus.series("numa_agent_source_errors_total").items()
        }
    assert (errors.get(("cgroup", "over_limit"), 0) > 0) == (containers > CONTAINER_SERIES_CAP)
    assert (errors.get(("cpu_manager", "over_limit"), 0) > 0) == (expected.containers > CONTAINER_SERIES_CAP)
    return int(Path(f"/proc/{agent.process.pid}/status").read_text().split("VmHWM:")[1].split()[0]) * 1024
