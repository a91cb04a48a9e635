"""What the serving agent's imports alone hold, beside the agent itself.

The agent runs as the daemon it is on the 2x32 node of bench_cost (both readers, OTLP over gRPC to a real
rotel, a podresources server in another process), with ``PYTHONPROFILEIMPORTTIME`` set: after its cycles,
its log names every module the serving process imported (the process ``otel-numa`` execs into, from
``runpy`` on). A fresh interpreter with the daemon's allocator settings then imports those modules, group
by group, and reads its resident memory after each: the floor under the agent's RSS before it reads a
file.

    .venv/bin/python -m benchmarks.bench_imports [--node 2x32] [--cycles 10]

The table goes to stdout and ``benchmarks/out/imports-<node>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_cost import SETTLE_S, Receipts, common_args, git_head, node_args, progress
from benchmarks.bench_rounds import NODES, podresources_server
from benchmarks.harness import machine_details, run_agent
from otel_numa.daemon.serve import ALLOCATOR_TUNABLES, MALLOC_ARENAS
from otel_numa.testing.large_node import write_large_node
from otel_numa.testing.peers import REPO, run_rotel

# The groups imported in turn, by a module's top-level package; the standard library and anything not
# named goes first, as the interpreter imports much of it before any of these.
GROUPS = (
    ("google.protobuf", ("google",)),
    ("grpc", ("grpc",)),
    ("OpenTelemetry API, SDK, exporters and protos", ("opentelemetry",)),
    ("prometheus_client", ("prometheus_client",)),
    ("psutil", ("psutil",)),
    ("otel_numa", ("otel_numa",)),
)
STANDARD = "the standard library and the rest"
Sizes = list[list[Any]]  # [title, {"Rss": MB, "Anonymous": MB}] after each group

# Run in the fresh interpreter: import each group's modules, print the resident sizes after each.
_IMPORTER = """
import json, sys
def sizes():
    fields = {}
    for line in open("/proc/self/smaps_rollup"):
        name, _, value = line.partition(":")
        if name in ("Rss", "Anonymous"):
            fields[name] = int(value.split()[0]) / 1024
    return fields
report = [["the interpreter alone", sizes()]]
for title, modules in json.load(sys.stdin):
    for module in modules:
        try:
            __import__(module)
        except Exception:  # modules a program tried and went without (other platforms, options)
            pass
    report.append([title, sizes()])
print(json.dumps(report))
"""


def served_modules(log: str) -> list[str]:
    """The modules the serving process imported, in order, from ``-X importtime`` lines of its log."""
    lines = [line for line in log.splitlines() if line.startswith("import time:")]
    names = [line.rpartition("|")[2].strip() for line in lines]
    start = len(names) - 1 - names[::-1].index("runpy")  # the exec'd daemon starts with runpy
    return names[start:]


def grouped(modules: list[str]) -> list[tuple[str, list[str]]]:
    def group_of(module: str) -> str:
        top = module.partition(".")[0]
        return next((title for title, tops in GROUPS if top in tops), STANDARD)

    titles = [STANDARD, *(title for title, _tops in GROUPS)]
    return [(title, [m for m in modules if group_of(m) == title]) for title in titles]


def measure(node_key: str, cycles: int, work: Path) -> tuple[float, list[tuple[str, list[str]]], Sizes]:
    node = write_large_node(work / "node", NODES[node_key])
    os.environ["PYTHONPROFILEIMPORTTIME"] = "1"  # inherited by the agent, through its exec
    try:
        with run_rotel(work, verbosity="basic") as rotel, podresources_server(node, work) as (socket, _state):
            receipts = Receipts(rotel)
            endpoint = f"http://127.0.0.1:{rotel.grpc_port}"
            args = [*node_args(node), "--podresources-socket", str(socket), *common_args(endpoint, 1.0)]
            seen = receipts.count()
            with run_agent(args, work) as agent:
                for _ in range(cycles):
                    seen = receipts.wait_beyond(seen, 60)
                    time.sleep(SETTLE_S)
                    agent.scrape_page()
                rss = agent.rss_bytes() / 2**20
    finally:
        del os.environ["PYTHONPROFILEIMPORTTIME"]
    log = "\n".join(path.read_text(errors="replace") for path in work.glob("otel-numa-*.log"))
    groups = grouped(served_modules(log))
    env = dict(os.environ)
    env.setdefault(*MALLOC_ARENAS)
    env.setdefault("GLIBC_TUNABLES", ":".join(f"{name}={value}" for name, value in ALLOCATOR_TUNABLES))
    result = subprocess.run(
        [sys.executable, "-c", _IMPORTER],
        input=json.dumps(groups),
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env=env,
    )
    return rss, groups, json.loads(result.stdout.splitlines()[-1])


def table(node_key: str, rss: float, groups: list[tuple[str, list[str]]], sizes: Sizes) -> str:
    counts = {title: len(modules) for title, modules in groups}
    lines = [
        "| imported | modules | RSS (MB) | of it anonymous (MB) | RSS added (MB) |",
        "|---|---:|---:|---:|---:|",
    ]
    before = 0.0
    for title, fields in sizes:
        modules = f"{counts[title]}" if title in counts else ""
        added = f"{fields['Rss'] - before:.1f}" if before else ""
        lines.append(f"| {title} | {modules} | {fields['Rss']:.1f} | {fields['Anonymous']:.1f} | {added} |")
        before = fields["Rss"]
    lines.append(
        f"| the agent serving the {node_key} node, both readers (RSS after its cycles) | "
        f"{sum(counts.values())} | {rss:.1f} | | {rss - before:.1f} |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", default="2x32", choices=sorted(NODES))
    parser.add_argument("--cycles", type=int, default=10, help="pushes and scrapes before RSS is read")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        progress(f"{options.node}: the agent with {options.cycles} cycles, then its imports alone")
        rss, groups, sizes = measure(options.node, options.cycles, Path(work))
    header = f"{time.strftime('%Y-%m-%d')}, {git_head()}; machine: {machine_details()}"
    text = f"{header}\n\n{table(options.node, rss, groups, sizes)}\n"
    print(text)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / f"imports-{options.node}.md").write_text(text)


if __name__ == "__main__":
    main()
