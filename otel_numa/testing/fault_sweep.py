"""Damage one file of a tree in one of five ways, run the agent once through its command line, and compare.

Used by the fault sweep (tests/agent/test_fault_sweep.py). Each damage is undone before the next, so one
extracted tree serves every variant. :func:`write_devices_tree` makes a captured machine carry DRA claims,
so that the PCI functions' files, the DRA checkpoint and a CDI spec can be swept too.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from otel_numa.cli.main import main
from otel_numa.model import DraClaim, DraDevice
from otel_numa.testing.device_tree import add_char_device, cdi_spec, write_cdi_spec
from otel_numa.testing.dra_checkpoint import dra_checkpoint_bytes

Variant = Literal["missing", "empty", "garbage", "truncated", "directory"]
VARIANTS: tuple[Variant, ...] = ("missing", "empty", "garbage", "truncated", "directory")

# Whole lines that no reader can take for a value (the kernel would never print them).
GARBAGE = b"?\xff garbage -1 x\n"

# Sample name and label pairs -> value.
SeriesKey = tuple[str, frozenset[tuple[str, str]]]
Exposition = dict[SeriesKey, float]

# The name of the test report property that says what the sweep of one tree ran: (variants, files, variants
# counted as errors). tests/conftest.py adds the trees up in the terminal summary (a report's properties
# reach it from parallel workers too).
SWEEP_SUMMARY = "fault sweep"


def sweep_summary(counts: Sequence[tuple[int, int, int]]) -> str:
    """The run's line for the sweeps of ``counts`` (one per tree swept, at least one)."""
    variants, files, counted = (sum(column) for column in zip(*counts, strict=True))
    ran = f"fault sweep: {variants} variants over {len(counts)} trees ({files} files)"
    return f"{ran}, {counted} of them counted as errors"


def truncate(data: bytes) -> bytes:
    """The first half of ``data``, cut inside a line as a short read would (never right after a newline)."""
    cut = len(data) // 2
    while cut > 0 and data[cut - 1 : cut] == b"\n":
        cut -= 1
    return data[:cut]


def damage(path: Path, variant: Variant) -> Callable[[], None]:
    """Damage the regular file ``path``; returns what puts it back as it was."""
    original = path.read_bytes()
    mode = path.stat().st_mode

    def restore() -> None:
        if path.is_dir():
            shutil.rmtree(path)
        path.write_bytes(original)
        os.chmod(path, mode)

    if variant in ("missing", "directory"):
        path.unlink()
        if variant == "directory":
            path.mkdir()
    else:
        contents = {"empty": b"", "garbage": GARBAGE, "truncated": truncate(original)}
        path.write_bytes(contents[variant])
    return restore


class _CapturedStdout:
    """What ``--once`` writes to (it writes bytes to ``sys.stdout.buffer``)."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()

    def write(self, text: str) -> int:
        return self.buffer.write(text.encode())

    def flush(self) -> None:
        pass


def run_once(args: Sequence[str]) -> tuple[int, str]:
    """``otel-numa --once ARGS`` in this process: its exit status and its stdout."""
    captured, real = _CapturedStdout(), sys.stdout
    sys.stdout = captured
    try:
        status = main(["--once", *args])
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.stdout = real
    return status, captured.buffer.getvalue().decode()


def parse(text: str) -> Exposition:
    """The exposition by sample name and labels (``k8s_node_name``, the same on every series, dropped)."""
    found: Exposition = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = frozenset((k, v) for k, v in sample.labels.items() if k != "k8s_node_name" and v != "")
            found[(sample.name, labels)] = sample.value
    return found


def changed(before: str, after: str) -> tuple[Exposition, Exposition]:
    """The samples that differ between two expositions of the same agent, each side parsed: a series that
    is only in ``before`` was lost, only in ``after`` is new, in both changed its value. Unchanged lines
    are the same series with the same value, so only the others are parsed."""
    old_lines, new_lines = _sample_lines(before), _sample_lines(after)
    return parse("".join(sorted(old_lines - new_lines))), parse("".join(sorted(new_lines - old_lines)))


def _sample_lines(text: str) -> set[str]:
    return {line + "\n" for line in text.splitlines() if line and not line.startswith("#")}


def files_under(root: Path, relatives: Iterable[str]) -> list[str]:
    """Regular files (not links) under each of ``relatives`` (a directory or a file), relative to ``root``."""
    found: list[str] = []
    for relative in relatives:
        start = root / relative
        if start.is_file() and not start.is_symlink():
            found.append(relative)
            continue
        for directory, _dirs, names in os.walk(start):
            for name in names:
                path = Path(directory, name)
                if path.is_file() and not path.is_symlink():
                    found.append(str(path.relative_to(root)))
    return sorted(found)


def pick(candidates: Sequence[str], count: int, seed: str) -> list[str]:
    """``count`` of ``candidates`` chosen the same way every run: the first, then spread by a checksum."""
    if len(candidates) <= count:
        return list(candidates)
    chosen = [candidates[0]]
    rest = sorted(candidates[1:], key=lambda name: zlib.crc32(f"{seed}:{name}".encode()))
    return chosen + rest[: count - 1]


@dataclass(frozen=True)
class DevicesTree:
    top: Path  # holds sys/, proc/, kubelet/ and cdi/
    kubelet: Path
    cdi: Path
    placed_files: tuple[str, ...]  # the PCI files of the functions the DRA devices sit on
    state_files: tuple[str, ...]  # the DRA checkpoint and the CDI spec


def write_devices_tree(base: Path, machine_tarball: Path) -> DevicesTree:
    """A captured machine with a GPU at ``0000:00:06.0`` and a NIC at ``0000:00:03.0`` (the H200 guest),
    given DRA claims in the kubelet's ``dra_manager_state``: the GPU placed by the PCI address in its name,
    the NIC through its CDI spec's character device (an RDMA ``uverbs`` node under the NIC in sysfs)."""
    with tarfile.open(machine_tarball) as archive:
        archive.extractall(base, filter="data")
        top = base / archive.getnames()[0].split("/")[0]
    add_char_device(top / "sys", "0000:00:03.0", 231, 64, "uverbs0")
    cdi = top / "cdi"
    nodes = [{"path": "/dev/infiniband/uverbs0", "type": "c", "major": 231, "minor": 64}]
    write_cdi_spec(cdi, "example.com-nic.json", cdi_spec("example.com/nic", {"nic-0": nodes}))
    kubelet = top / "kubelet"
    kubelet.mkdir()
    gpu = DraDevice("gpu.nvidia.com", "vm", "gpu-0000-00-06-0")
    nic = DraDevice("net.example.com", "vm", "nic-0", ("example.com/nic=nic-0",))
    claims = [
        DraClaim("gpu", "ml", (gpu,), "c1", frozenset({"p1"})),
        DraClaim("nic", "ml", (nic,), "c2", frozenset({"p2"})),
    ]
    (kubelet / "dra_manager_state").write_bytes(dra_checkpoint_bytes(claims))
    placed = tuple(
        f"sys/bus/pci/devices/{address}/{name}"
        for address in ("0000:00:06.0", "0000:00:03.0")
        for name in ("class", "numa_node", "local_cpulist")
    )
    return DevicesTree(top, kubelet, cdi, placed, ("kubelet/dra_manager_state", "cdi/example.com-nic.json"))
