"""Golden pages: the agent's whole Prometheus exposition for a few fixed machines, kept in the repository.

Every change to a metric's name, labels or value on these machines shows in review as a change of
``tests/fixtures/golden/<machine>.prom``. The pages are made by the real command line (``otel-numa --once``)
and only the values that depend on the moment are masked (ages, durations, the agent's own process, the
build's versions). Regenerate them after an intended change with::

    .venv/bin/python -m otel_numa.testing.golden --update
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from otel_numa.testing.hwloc import extract_snapshot
from otel_numa.testing.large_node import LargeNodeSpec, write_large_node

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "fixtures" / "golden"
NODE_NAME = "golden"
MASK = "<varies>"

# Series whose values depend on when and how fast the agent ran, not on the machine.
_VARYING_SERIES = re.compile(r"^(numa_agent_\w+_(age|duration)_seconds|process_\w+)(\{| )")
# Labels that name the build or the host the page was made on.
_VARYING_LABELS = re.compile(r'\b(host_name|service_version|telemetry_sdk_version)="[^"]*"')


@dataclass(frozen=True)
class GoldenMachine:
    name: str
    what: str
    build: Callable[[Path], list[str]]  # writes the machine's files under a folder; returns the agent's flags


def _no_kubelet(top: Path, work: Path) -> list[str]:
    nothing = work / "no-kubelet"
    return [
        *("--sysfs-root", str(top / "sys"), "--procfs-root", str(top / "proc")),
        *("--kubelet-root", str(nothing), "--cgroup-root", str(nothing)),
        *("--pod-logs-root", str(nothing), "--container-logs-root", str(nothing)),
        *("--podresources-socket", "none"),
    ]


def _captured_machine(work: Path) -> list[str]:
    with tarfile.open(REPO / "tests" / "fixtures" / "machines" / "h200-vm.tar.bz2") as archive:
        archive.extractall(work, filter="data")
    return _no_kubelet(work / "h200-vm", work)


def _hwloc_machine(name: str) -> Callable[[Path], list[str]]:
    def build(work: Path) -> list[str]:
        return _no_kubelet(extract_snapshot(name, work / "hwloc"), work)

    return build


def _small_kubernetes_node(work: Path) -> list[str]:
    spec = LargeNodeSpec(
        numa_nodes=2,
        cpus_per_node=4,
        mem_per_node_kib=4 << 20,
        hugepage_sizes_kib=(2048,),
        pods=3,
        containers_per_pod=2,
        device_resources=("example.com/gpu",),
        devices_per_resource=2,
        exclusive_pod_every=2,
    )
    return write_large_node(work / "node", spec).cli_args()


MACHINES = (
    GoldenMachine(
        "h200-vm", "a 16-CPU KVM guest with one NUMA node, captured from a real machine", _captured_machine
    ),
    GoldenMachine(
        "hwloc-48amd64-sparse",
        "hwloc's snapshot of a real 48-core machine with sparse NUMA ids",
        _hwloc_machine("48amd64-4pa2n6c-sparse"),
    ),
    GoldenMachine(
        "k8s-2x4",
        "a small Kubernetes node: 2 NUMA nodes x 4 CPUs, 3 pods, checkpoints, cgroups, devices",
        _small_kubernetes_node,
    ),
)


def masked(page: str) -> str:
    """``page`` with the values and labels that vary between runs replaced by a fixed mark, and each
    family's samples in sorted order (the order of series within a family is not part of the page's
    meaning, and follows the order in which sources list containers)."""
    lines: list[str] = []
    samples: list[str] = []
    for line in page.splitlines():
        if line.startswith("#"):
            lines += sorted(samples)
            samples = []
            lines.append(line)
            continue
        line = _VARYING_LABELS.sub(lambda m: f'{m.group(1)}="{MASK}"', line)
        if _VARYING_SERIES.match(line):
            line = line.rsplit(" ", 1)[0] + " " + MASK
        samples.append(line)
    lines += sorted(samples)
    return "\n".join(lines) + "\n"


def page_of(machine: GoldenMachine, *extra_flags: str) -> str:
    """The masked page the command line prints for ``machine``."""
    with tempfile.TemporaryDirectory(prefix=f"golden-{machine.name}-") as folder:
        flags = machine.build(Path(folder))
        done = subprocess.run(
            [sys.executable, "-m", "otel_numa", "--once", "--node-name", NODE_NAME, *flags, *extra_flags],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"otel-numa --once failed for {machine.name}: {done.stderr.strip()}")
    return masked(done.stdout)


def golden_path(machine: GoldenMachine) -> Path:
    return GOLDEN / f"{machine.name}.prom"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--update", action="store_true", help="write the pages into tests/fixtures/golden/")
    args = parser.parse_args(argv)
    differ = 0
    for machine in MACHINES:
        page = page_of(machine)
        path = golden_path(machine)
        if args.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(page)
            print(f"wrote {path.relative_to(REPO)} ({page.count(chr(10))} lines)")
        elif not path.exists() or path.read_text() != page:
            print(f"{path.relative_to(REPO)} differs from the agent's page", file=sys.stderr)
            differ += 1
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
