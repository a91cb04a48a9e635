"""Cost of reading the kubelet's checkpoints and accounting the allocation on a large node.

Run from the repository root::

    .venv/bin/python benchmarks/bench_allocation.py [--rounds N]

The node: 8 NUMA nodes x 128 CPUs; 250 live pods x 4 containers, each container holding one exclusive
CPU, one memory block and one block of 2Mi pages (every tenth pod's blocks span two NUMA nodes), the first
container of each pod one GPU and the second one NIC function without NUMA affinity. Checkpoints are
written with the kubelet's layouts and checksums (otel_numa/testing/checkpoints.py), pods have their
``<kubelet-root>/pods/`` and ``/var/log/pods`` directories.

Measured, each ``--rounds`` times (median and 95th percentile):

- parsing each checkpoint from its bytes (checksum verification included);
- ``compute_allocation`` over the three parsed states;
- a snapshot round with nothing changed (stat checks only, accounting skipped), and one in which the
  kubelet rewrote ``cpu_manager_state`` (one file parsed again, accounting redone);
- a whole Prometheus scrape (snapshot, instruments, text exposition) in both cases.

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prometheus_client import generate_latest  # noqa: E402

from otel_numa.accounting.allocation import compute_allocation  # noqa: E402
from otel_numa.export.pipeline import build_pipeline  # noqa: E402
from otel_numa.model import DeviceEntry, KubeletState, MemoryBlock, MemoryTable, NumaMemoryState  # noqa: E402
from otel_numa.sources.checkpoints import (  # noqa: E402
    parse_cpu_manager_state,
    parse_device_checkpoint,
    parse_memory_manager_state,
)
from otel_numa.sources.sysfs import read_topology  # noqa: E402
from otel_numa.testing.checkpoints import (  # noqa: E402
    write_cpu_manager_state,
    write_device_checkpoint,
    write_memory_manager_state,
)
from otel_numa.testing.kubelet_scenario import KubeletScenario, ScenarioPod, build_scenario  # noqa: E402
from otel_numa.testing.sysfs_tree import uniform_nodes  # noqa: E402

NUMA_NODES = 8
CPUS_PER_NODE = 128
PODS = 250
CONTAINERS = 4
RESERVED_CPUS = frozenset({0, CPUS_PER_NODE})  # the first CPU of nodes 0 and 1
MIB = 1 << 20
GIB = 1 << 30


def pod_uid(index: int) -> str:
    return f"00000000-0000-4000-8000-{index:012x}"


def exclusive_cpus(pod: int, container: int) -> set[int]:
    """One CPU per container, spread over the nodes, skipping the reserved CPUs."""
    slot = pod * CONTAINERS + container  # 0..999
    node, offset = slot % NUMA_NODES, 1 + slot // NUMA_NODES  # offset 1..125 of 128
    return {node * CPUS_PER_NODE + offset}


def write_cpu_state(scenario: KubeletScenario, generation: int) -> None:
    """``cpu_manager_state``; odd generations hand one more CPU to the last pod (a change every time)."""
    entries = {
        pod_uid(pod): {f"container-{c}": exclusive_cpus(pod, c) for c in range(CONTAINERS)}
        for pod in range(PODS)
    }
    if generation % 2:
        entries[pod_uid(PODS - 1)]["container-0"] |= {NUMA_NODES * CPUS_PER_NODE - 1}
    taken = set().union(*(cpus for containers in entries.values() for cpus in containers.values()))
    default_set = set(range(NUMA_NODES * CPUS_PER_NODE)) - taken
    write_cpu_manager_state(scenario.cpu_manager_path, "static", default_set, entries)


def write_checkpoints(scenario: KubeletScenario) -> None:
    write_cpu_state(scenario, 0)
    memory_entries: dict[str, dict[str, list[MemoryBlock]]] = {}
    devices: list[DeviceEntry] = []
    memory_reserved = dict.fromkeys(range(NUMA_NODES), 0)
    hugepages_reserved = dict.fromkeys(range(NUMA_NODES), 0)
    for pod in range(PODS):
        uid = pod_uid(pod)
        node = pod % NUMA_NODES
        affinity = (node, (node + 1) % NUMA_NODES) if pod % 10 == 0 else (node,)
        memory_entries[uid] = {}
        for container in range(CONTAINERS):
            memory_entries[uid][f"container-{container}"] = [
                MemoryBlock(affinity, "memory", 256 * MIB),
                MemoryBlock(affinity, "hugepages-2Mi", 64 * MIB),
            ]
            memory_reserved[affinity[0]] += 256 * MIB
            hugepages_reserved[affinity[0]] += 64 * MIB
        devices.append(DeviceEntry(uid, "container-0", "example.com/gpu", {node: (f"gpu-{pod}",)}))
        devices.append(DeviceEntry(uid, "container-1", "example.com/nic", {-1: (f"vf-{pod}",)}))

    machine_state = {
        numa: NumaMemoryState(
            PODS * CONTAINERS // NUMA_NODES,
            (numa,),
            {
                "memory": MemoryTable(
                    128 * GIB, 2 * GIB, 126 * GIB, memory_reserved[numa], 126 * GIB - memory_reserved[numa]
                ),
                "hugepages-2Mi": MemoryTable(
                    16 * GIB, 0, 16 * GIB, hugepages_reserved[numa], 16 * GIB - hugepages_reserved[numa]
                ),
            },
        )
        for numa in range(NUMA_NODES)
    }
    write_memory_manager_state(scenario.memory_manager_path, "Static", machine_state, memory_entries)
    registered = {
        "example.com/gpu": [f"gpu-{pod}" for pod in range(PODS)],
        "example.com/nic": [f"vf-{pod}" for pod in range(PODS)],
    }
    write_device_checkpoint(scenario.device_checkpoint_path, devices, registered)


def timed(
    action: Callable[[], object], rounds: int, before: Callable[[], object] | None = None
) -> list[float]:
    """Seconds per call of ``action``; ``before`` runs untimed ahead of each call."""
    samples = []
    for _ in range(rounds):
        if before is not None:
            before()
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return samples


def row(what: str, samples: list[float]) -> str:
    p95 = statistics.quantiles(samples, n=20, method="inclusive")[18]
    return f"| {what} | {statistics.median(samples) * 1000:.2f} | {p95 * 1000:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="timed calls per measurement (default 40)")
    rounds = parser.parse_args().rounds

    with tempfile.TemporaryDirectory(prefix="bench-allocation-") as directory:
        pods = [ScenarioPod(pod_uid(pod), f"pod-{pod}", "bench") for pod in range(PODS)]
        nodes = uniform_nodes(
            NUMA_NODES, CPUS_PER_NODE, mem_total_kib=128 << 20, hugepages={2048: (8192, 4096)}
        )
        scenario = build_scenario(Path(directory), nodes, pods)
        write_checkpoints(scenario)

        files: dict[str, tuple[Path, Callable[[bytes], object]]] = {
            "cpu_manager_state": (scenario.cpu_manager_path, parse_cpu_manager_state),
            "memory_manager_state": (scenario.memory_manager_path, parse_memory_manager_state),
            "kubelet_internal_checkpoint": (scenario.device_checkpoint_path, parse_device_checkpoint),
        }
        results: list[tuple[str, list[float]]] = []
        sizes = []
        for name, (path, parse) in files.items():
            data = path.read_bytes()
            sizes.append(f"{name} {len(data) / 1024:.0f} KiB")
            results.append((f"parse {name}", timed(functools.partial(parse, data), rounds)))

        topology = read_topology(scenario.sysfs_root)
        state = KubeletState(
            cpu=parse_cpu_manager_state(scenario.cpu_manager_path.read_bytes()),
            memory=parse_memory_manager_state(scenario.memory_manager_path.read_bytes()),
            devices=parse_device_checkpoint(scenario.device_checkpoint_path.read_bytes()),
            live_pods=frozenset(pod_uid(pod) for pod in range(PODS)),
            pod_names={pod_uid(pod): ("bench", f"pod-{pod}") for pod in range(PODS)},
        )
        results.append(
            ("compute_allocation", timed(lambda: compute_allocation(state, topology, RESERVED_CPUS), rounds))
        )

        agent = scenario.agent(reserved_cpus=RESERVED_CPUS)
        generation = [0]

        def kubelet_rewrites_cpu_state() -> None:
            generation[0] += 1
            write_cpu_state(scenario, generation[0])

        agent.store.refresh()
        results.append(("snapshot round, nothing changed", timed(agent.store.refresh, rounds)))
        results.append(
            (
                "snapshot round, cpu_manager_state rewritten",
                timed(agent.store.refresh, rounds, before=kubelet_rewrites_cpu_state),
            )
        )
        pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus",))
        assert pipeline.registry is not None
        registry = pipeline.registry
        exposition = generate_latest(registry)
        results.append(
            ("Prometheus scrape, nothing changed", timed(lambda: generate_latest(registry), rounds))
        )
        results.append(
            (
                "Prometheus scrape, cpu_manager_state rewritten",
                timed(lambda: generate_latest(registry), rounds, before=kubelet_rewrites_cpu_state),
            )
        )
        pipeline.shutdown(timeout_s=1)

    print(
        f"{NUMA_NODES} NUMA nodes x {CPUS_PER_NODE} CPUs, {PODS} pods x {CONTAINERS} containers; "
        f"{', '.join(sizes)}; scrape {len(exposition) / 1024:.0f} KiB, "
        f"{sum(1 for line in exposition.splitlines() if not line.startswith(b'#'))} samples"
    )
    print(
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{rounds} rounds each\n"
    )
    print("| measurement | median (ms) | p95 (ms) |")
    print("|---|---:|---:|")
    for what, samples in results:
        print(row(what, samples))


if __name__ == "__main__":
    main()
