"""The hwloc snapshots under tests/fixtures/hwloc/, and Debian's hwloc (lstopo) as an independent reader.

lstopo parses the same ``sys/`` trees as the agent, so its XML gives expected values that do not come
from the code under test. Where hwloc's rules differ from the agent's (see the README beside the
snapshots) the tests adjust its answer explicitly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import pytest

SNAPSHOT_DIR = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hwloc"
LSTOPO_NAMES = ("lstopo-no-graphics", "lstopo")


def snapshot_names() -> list[str]:
    """Every snapshot tarball in the fixtures directory, without its ``.tar.bz2``."""
    return sorted(path.name.removesuffix(".tar.bz2") for path in SNAPSHOT_DIR.glob("*.tar.bz2"))


def _relative(member: tarfile.TarInfo) -> str:
    """A member's path below the tarball's top directory ("" for the top directory itself)."""
    return member.name.partition("/")[2]


def snapshot_files(name: str) -> set[str]:
    """Paths of the regular files in snapshot ``name``, relative to its top directory (no extraction)."""
    with tarfile.open(SNAPSHOT_DIR / f"{name}.tar.bz2") as archive:
        return {_relative(member) for member in archive.getmembers() if member.isfile()}


def extract_snapshot(name: str, dest: Path, *, only: Collection[str] | None = None) -> Path:
    """Extract snapshot ``name`` under ``dest`` and return its top directory (the one holding ``sys/``).

    ``only`` limits the extraction to some top-level directories (e.g. ``("proc",)``), which is much
    faster than a whole tree. The directory inside a tarball is not always named like the tarball
    (48amd64-4pa2n6c-sparse holds 48amd64-4d2n6c-sparse), so it is found rather than guessed.
    """
    target = dest / name
    target.mkdir(parents=True, exist_ok=False)
    with tarfile.open(SNAPSHOT_DIR / f"{name}.tar.bz2") as archive:
        members = archive.getmembers()
        if only is not None:
            # the top directory itself ("") and everything below the chosen subdirectories
            members = [member for member in members if _relative(member).partition("/")[0] in {"", *only}]
        archive.extractall(target, members=members, filter="data")
    tops = [path for path in target.iterdir() if path.is_dir()]
    if len(tops) != 1:
        raise AssertionError(f"{name}: expected one top directory, found {sorted(p.name for p in tops)}")
    return tops[0]


def lstopo_path() -> str:
    """The lstopo binary; fails the test (never skips) when hwloc is not installed."""
    for name in LSTOPO_NAMES:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(
        "lstopo-no-graphics not found: the sysfs tests compare against Debian's hwloc "
        "(apt-get install hwloc)",
        pytrace=False,
    )


def run_lstopo(fsroot: Path) -> str:
    """hwloc's XML for the tree under ``fsroot`` (the directory holding ``sys/`` and ``proc/``).

    ``--disallowed`` keeps the CPUs and nodes that the snapshot's cgroup would hide; ``--no-io`` skips
    PCI discovery, which the topology does not need.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("HWLOC_")}
    command = [
        lstopo_path(),
        "-i",
        str(fsroot),
        "--if",
        "fsroot",
        "--disallowed",
        "--no-io",
        "--of",
        "xml",
        "-",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
    if done.returncode != 0:
        raise AssertionError(f"lstopo failed on {fsroot} ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class HwlocNode:
    os_index: int
    local_memory: int  # bytes; hwloc leaves the attribute out for a node without memory
    cpus: frozenset[int]  # PU os_index below the node's parent object
    base_page_size: int  # bytes, hwloc's first page_type
    hugepage_counts: dict[int, int]  # page size in bytes -> count, base pages left out


@dataclass(frozen=True)
class HwlocTopology:
    nodes: dict[int, HwlocNode]
    distances: dict[int, dict[int, int]]  # from node -> to node -> latency; empty when hwloc has none


def _numbers(elements: list[ET.Element]) -> list[int]:
    """hwloc splits long ``indexes``/``u64values`` lists over several elements; join them."""
    return [int(value) for element in elements for value in (element.text or "").split()]


def parse_lstopo_xml(text: str) -> HwlocTopology:
    root = ET.fromstring(text)
    parents = {child: parent for parent in root.iter() for child in parent}
    nodes: dict[int, HwlocNode] = {}
    for element in root.iter("object"):
        if element.get("type") != "NUMANode":
            continue
        parent = parents[element]
        cpus = frozenset(
            int(pu.get("os_index", "-1")) for pu in parent.iter("object") if pu.get("type") == "PU"
        )
        page_types = [
            (int(pt.get("size", "0")), int(pt.get("count", "0"))) for pt in element.findall("page_type")
        ]
        base = page_types[0][0] if page_types else 0
        os_index = int(element.get("os_index", "-1"))
        nodes[os_index] = HwlocNode(
            os_index=os_index,
            local_memory=int(element.get("local_memory", "0")),
            cpus=cpus,
            base_page_size=base,
            hugepage_counts={size: count for size, count in page_types[1:]},
        )

    distances: dict[int, dict[int, int]] = {}
    for matrix in root.iter("distances2"):
        if matrix.get("type") != "NUMANode" or matrix.get("name", "NUMALatency") != "NUMALatency":
            continue
        ids = _numbers(matrix.findall("indexes"))
        values = _numbers(matrix.findall("u64values"))
        if len(values) != len(ids) * len(ids):
            raise AssertionError(f"hwloc distance matrix of {len(ids)} nodes has {len(values)} values")
        for row, source in enumerate(ids):
            distances[source] = {target: values[row * len(ids) + col] for col, target in enumerate(ids)}
    return HwlocTopology(nodes=nodes, distances=distances)


def hwloc_topology(fsroot: Path) -> HwlocTopology:
    return parse_lstopo_xml(run_lstopo(fsroot))


def lstopo_pci_counts(fsroot: Path | None) -> dict[tuple[int, int], int]:
    """(NUMA id, PCI base class) -> PCI functions, by hwloc's I/O locality, for the tree under ``fsroot``
    (``None``: this machine). A function is on the one NUMA node whose cpuset holds the cpuset of its
    nearest CPU-side ancestor, else on -1. Bridges (hwloc ``Bridge`` objects, and host bridges of class
    0x06) are left out."""
    command = [lstopo_path(), "--whole-io", "--of", "xml", "-"]
    if fsroot is not None:
        command[1:1] = ["-i", str(fsroot), "--if", "fsroot", "--disallowed"]
    env = {key: value for key, value in os.environ.items() if not key.startswith("HWLOC_")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
    if done.returncode != 0:
        raise AssertionError(f"lstopo failed ({done.returncode}): {done.stderr.strip()}")
    root = ET.fromstring(done.stdout)
    parents = {child: parent for parent in root.iter() for child in parent}
    numa_nodes = [
        (int(o.get("os_index", "-1")), _hwloc_set(o.get("cpuset")))
        for o in root.iter("object")
        if o.get("type") == "NUMANode"
    ]
    io_types = {"Bridge", "PCIDev", "OSDev"}
    counts: dict[tuple[int, int], int] = {}
    for element in root.iter("object"):
        if element.get("type") != "PCIDev":
            continue
        base_class = int((element.get("pci_type") or "ffff")[:2], 16)
        if base_class == 0x06:  # a host bridge is a PCIDev for hwloc; bridges are not counted
            continue
        ancestor = parents[element]
        while ancestor.get("type") in io_types:
            ancestor = parents[ancestor]
        cpus = _hwloc_set(ancestor.get("cpuset"))
        holders = [os_index for os_index, node_cpus in numa_nodes if cpus and cpus & ~node_cpus == 0]
        numa = holders[0] if len(holders) == 1 else -1
        counts[(numa, base_class)] = counts.get((numa, base_class), 0) + 1
    return counts


def _hwloc_set(text: str | None) -> int:
    """An hwloc bitmap as XML writes it (``0x0000000f,0xffffffff``: 32-bit words, highest first)."""
    if not text:
        return 0
    value = 0
    for word in text.split(","):
        value = (value << 32) | (int(word, 16) if word.strip() else 0)
    return value
