"""Real machines captured by this project (tests/fixtures/machines/), read by the sysfs reader and by the
whole agent, checked against Debian's hwloc (lstopo), which reads the same files."""

from __future__ import annotations

import tarfile
from pathlib import Path

from otel_numa.sources import sysfs
from otel_numa.testing.hwloc import hwloc_topology
from otel_numa.testing.peers import REPO
from tests.support import run_cli, samples

MACHINES = REPO / "tests" / "fixtures" / "machines"


def extracted(name: str, dest: Path) -> Path:
    with tarfile.open(MACHINES / f"{name}.tar.bz2") as archive:
        archive.extractall(dest, filter="data")
    return dest / name


def test_the_gpu_guest_reads_as_hwloc_sees_it(tmp_path: Path) -> None:
    top = extracted("h200-vm", tmp_path)
    topology = sysfs.read_topology(top / "sys")
    hwloc = hwloc_topology(top)
    assert topology.node_ids == tuple(sorted(hwloc.nodes)) == (0,)
    assert topology.nodes[0].cpus == hwloc.nodes[0].cpus == frozenset(range(16))
    files = sysfs.NodeFiles(top / "sys", topology, top / "proc")
    assert files.memory()[0].total_bytes == hwloc.nodes[0].local_memory == 4681200 * 1024
    pools = {pool.size_kib: pool.total_pages for pool in files.hugepages()[0]}
    assert pools == {2048: 0, 1048576: 0}


def test_the_agent_pages_the_gpu_guest_without_an_error(tmp_path: Path) -> None:
    top = extracted("h200-vm", tmp_path)
    nothing = tmp_path / "no-kubelet"
    done = run_cli(
        "--once",
        "--node-name",
        "h200",
        *("--sysfs-root", str(top / "sys"), "--procfs-root", str(top / "proc")),
        *("--kubelet-root", str(nothing), "--cgroup-root", str(nothing), "--podresources-socket", "none"),
    )
    assert done.returncode == 0, done.stderr
    found = samples(done.stdout)
    assert found["numa_node_count"] == [({"k8s_node_name": "h200"}, 1)]
    assert [value for _, value in found["numa_cpu_capacity"]] == [16]
    assert [value for _, value in found["numa_memory_capacity_bytes"]] == [4681200 * 1024]
    sizes = {labels["k8s_hugepage_size"]: value for labels, value in found["numa_hugepages_capacity_bytes"]}
    assert sizes == {"2Mi": 0, "1Gi": 0}
    errors = {
        (labels["numa_source"], labels["error_type"]): value
        for labels, value in found["numa_agent_source_errors_total"]
    }
    assert {source for source, _ in errors} >= {"sysfs", "procfs"} and not any(errors.values())
    assert all(value == 1 for _, value in found["numa_agent_source_success"])
