"""Each accelerator patch's gain, for the patch ledger (docs/patches.md).

On the 2x32 and 8x48 large nodes of bench_cost, in-process, one fresh process per measurement: the public
path, the fast path with every patch, with each patch left off, and with the patches up to each one in
applying order (:func:`configs`). A cycle is what the agent does per interval: one OTLP push
(through the gRPC OTLP exporter, serialized but not sent) and one scrape of the page in the text format.

- CPU per cycle: ``time.process_time`` around a cycle, median of the cycles, then median of the repeats
  (the machine is shared: process CPU time, not wall time); "unchanged" with no input changed, "fresh" with
  new cgroup values before each cycle (the background refresh itself is not counted: it is the same on
  both paths).
- The daemon's heap policy applies (otel_numa.daemon.heap.HeapPolicy), as in the serving agent.
- Memory: what the export path holds after five fresh cycles (tracemalloc, after a full collection, less
  pathlib's interning), measured in the same process after the CPU runs, on a second pipeline.

Each patch's gains: in applying order (what it saves over the patches before it) and left out (what the
fast path loses without it); the ledger says how to read them.

    .venv/bin/python -m benchmarks.bench_patches [--cycles 10] [--repeats 3] [--trees 2x32,8x48]
    .venv/bin/python -m benchmarks.bench_patches --ledger-from benchmarks/out/patches.json

Writes ``benchmarks/out/patches.json`` and the patch ledger, ``docs/patches.md`` (``--ledger-from``
writes the ledger again from saved figures).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from benchmarks.bench_cost import NODE_2X32, NODE_8X48
from otel_numa.testing.large_node import LargeNodeSpec, large_node_at, write_large_node

TREES: dict[str, tuple[str, LargeNodeSpec]] = {
    "2x32": ("2 NUMA x 32 CPUs, 110 pods x 2 containers", NODE_2X32),
    "8x48": ("8 NUMA x 48 CPUs, 250 pods x 4 containers", NODE_8X48),
}
OUT = Path(__file__).parent / "out"
LEDGER = Path(__file__).parent.parent / "docs" / "patches.md"


def measure(root: Path, tree: str, config: str, cycles: int) -> dict[str, float]:
    """In this process: CPU per cycle (ms, unchanged and fresh) and memory held (KiB) for ``config``
    ("public", "all", or a patch name left off)."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExporter

    from otel_numa.cli.settings import Settings
    from otel_numa.daemon.agent import Agent
    from otel_numa.daemon.heap import HeapPolicy
    from otel_numa.export.fast import PUBLIC, FastPath
    from otel_numa.export.pipeline import build_pipeline
    from otel_numa.testing.wsgi import call_wsgi

    heap = HeapPolicy()

    class Serializing:
        """Stands in for the gRPC exporter's channel: each call's request serialized by the stub's serializer,
        as gRPC would send it, and not sent."""

        def unary_unary(self, method: str, request_serializer: Any = None, **kwargs: Any) -> Any:
            def call(request: Any, **call_kwargs: Any) -> None:
                request_serializer(request)

            return call

        def close(self) -> None:
            return None

    def encoding() -> MetricExporter:
        # the agent's own OTLP exporter (gRPC, as bench_cost pushes), with its translation and its patch
        exporter = OTLPMetricExporter(endpoint="http://127.0.0.1:1", insecure=True)
        exporter._channel = Serializing()  # type: ignore[assignment]
        exporter._client = exporter._stub(exporter._channel)
        return exporter

    node = large_node_at(root, TREES[tree][1])
    agent = Agent(Settings(**node.settings_values()).to_options())  # type: ignore[arg-type]
    path = PUBLIC if config == "public" else FastPath(patches_of(config))

    def pipeline_and_cycle() -> tuple[Any, Any]:
        pipeline = build_pipeline(
            agent.options,
            agent.store,
            exporters=("prometheus", "otlp"),
            otlp_exporter_factory=lambda _export: encoding(),
            fast_path=path,
        )
        assert pipeline.registry is not None
        pipeline.after_push = heap.after_push
        pipeline.registry.after_collection = heap.after_collection
        app = pipeline.page_app()

        def cycle() -> None:
            pipeline.push()
            call_wsgi(app)

        return pipeline, cycle

    generation = 0

    def fresh() -> None:
        nonlocal generation
        generation += 1
        node.write_cgroup_usage(generation)
        agent.refresh_background()

    pipeline, cycle = pipeline_and_cycle()
    for _ in range(3):
        fresh()
        cycle()
    result: dict[str, float] = {}
    for name, before in (("unchanged", None), ("fresh", fresh)):
        times = []
        for _ in range(cycles):
            if before is not None:
                before()
            start = time.process_time()
            cycle()
            times.append((time.process_time() - start) * 1000)
        result[f"cpu_{name}_ms"] = statistics.median(times)
    pipeline.shutdown(timeout_s=1)
    del pipeline, cycle
    gc.collect()
    tracemalloc.start()
    pipeline, cycle = pipeline_and_cycle()
    for _ in range(5):
        fresh()
        cycle()
    gc.collect()
    # without the interpreter's table of interned strings, which pathlib grows when the sources build paths
    # (it is reallocated whole, ~1.9 MB on the 2x32 node, in whichever cycle it fills): not the export path's
    held = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, pathlib.__file__)])
    result["memory_kib"] = sum(stat.size for stat in held.statistics("filename")) / 1024
    tracemalloc.stop()
    pipeline.shutdown(timeout_s=1)
    return result


def configs() -> list[str]:
    """What is measured: the public path; every patch ("all"); each patch left off ("without:name", with
    the patches that require it); the patches in applying order, each step adding one ("upto:name": every
    patch up to and including it)."""
    from otel_numa.export.fast import PATCHES

    names = [patch.name for patch in PATCHES]
    return ["public", "all", *(f"without:{name}" for name in names), *(f"upto:{name}" for name in names[:-1])]


def patches_of(config: str) -> frozenset[str]:
    from otel_numa.export.fast import PATCHES, serving

    names = [patch.name for patch in PATCHES]
    if config == "all":
        return serving(set())
    kind, _, name = config.partition(":")
    if kind == "without":
        return serving({name})
    if kind == "upto":
        return serving(set(names[names.index(name) + 1 :]))
    raise SystemExit(f"unknown configuration {config!r}")


def measured(root: Path, tree: str, config: str, cycles: int, repeats: int) -> dict[str, float]:
    runs = []
    for _ in range(repeats):
        completed = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_patches", "--measure", str(root), tree, config],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "BENCH_CYCLES": str(cycles)},
        )
        if completed.returncode != 0:
            raise SystemExit(f"{tree} {config}: {completed.stderr}")
        runs.append(json.loads(completed.stdout.splitlines()[-1]))
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def gain(without: float, with_: float) -> float:
    return 100 * (without - with_) / without if without else 0.0


KEYS = (("cpu_unchanged_ms", "CPU, unchanged"), ("cpu_fresh_ms", "CPU, fresh"), ("memory_kib", "memory"))


def _gains(without: dict[str, float], with_: dict[str, float]) -> str:
    return " | ".join(f"{gain(without[key], with_[key]):+.0f}%" for key, _label in KEYS)


def ledger(results: dict[str, dict[str, dict[str, float]]], command: str) -> str:
    """docs/patches.md: every patch, what it replaces, what it relies on, its measured gains."""
    from otel_numa.export.fast import PATCHES, PROVEN_RELEASES

    proven = ", ".join(f"{package} {release}" for package, release in PROVEN_RELEASES.items())
    out = [
        "# The patch ledger",
        "",
        "The accelerated export path is these patches over the public path (`otel_numa/export/fast/`,",
        "one module each; [decisions/export-paths.md](decisions/export-paths.md) says how they are",
        "chosen). Each acts on the agent's own MeterProvider, readers or page only. Proven on: "
        + proven
        + " (pinned in `constraints.txt`; [upgrading.md](upgrading.md) says how the set moves).",
        "",
        "Two gains per patch, each a share of the CPU per cycle (one OTLP push and one scrape, unchanged",
        "inputs and fresh cgroup values) or of the memory the export path holds:",
        "",
        "- *in order*: what adding the patch saves over the patches before it, applied in the order",
        "  below (the first over the public path). These add up: the steps lead from the public path to",
        "  the fast one.",
        "- *left out*: what the fast path loses when that patch alone is left off (with any patch that",
        "  requires it). The patches overlap (two may save the same work), so these do not add up.",
        "",
        "Method: `benchmarks/bench_patches.py`; figures written by `" + command + "`.",
        "The pushes measured go over gRPC; what `reused_requests` saves on OTLP/HTTP pushes is in",
        "[performance.md](performance.md#pushes-by-protocol-and-compression).",
        "A patch is deleted when it gains less than 5% in CPU and in memory on both nodes by both",
        "measures, unless it is kept for what it does rather than for speed (`forget_departed`, whose",
        "figures are shown as measured). The machine",
        "measured is shared (process CPU time, medians of cycles and of repeats).",
        "",
    ]
    header = " | ".join(label for _key, label in KEYS)
    previous = "public"
    for patch in PATCHES:
        out += [f"## `{patch.name}`", "", f"Replaces: {patch.replaces}.", ""]
        names = ", ".join(f"`{name}`" for name in patch.private_names) or "none"
        out += [f"Relies on: {names}.", ""]
        if patch.requires:
            out += [f"Requires: {', '.join(f'`{name}`' for name in patch.requires)}.", ""]
        if patch.kept_for:
            out += [f"Kept for what it does, whatever its speed: {patch.kept_for}.", ""]
        current = "all" if patch is PATCHES[-1] else f"upto:{patch.name}"
        out += [f"| node | measure | {header} |", "|---|---|---|---|---|"]
        for tree, by_config in results.items():
            out.append(f"| {tree} | in order | {_gains(by_config[previous], by_config[current])} |")
            left_out = by_config[f"without:{patch.name}"]
            out.append(f"| {tree} | left out | {_gains(left_out, by_config['all'])} |")
        out.append("")
        previous = current
    out += [
        "## Both paths",
        "",
        "| node | path | CPU/cycle unchanged (ms) | CPU/cycle fresh (ms) | memory held (KiB) |",
        "|---|---|---|---|---|",
    ]
    for tree, by_config in results.items():
        for config, figures in by_config.items():
            label = {"public": "public", "all": "fast, every patch"}.get(config)
            if label is None:
                kind, _, name = config.partition(":")
                label = f"fast, without {name}" if kind == "without" else f"fast, up to {name}"
            out.append(
                f"| {tree} | {label} | {figures['cpu_unchanged_ms']:.1f} | {figures['cpu_fresh_ms']:.1f} "
                f"| {figures['memory_kib']:.0f} |"
            )
    out += ["", f"Nodes: {'; '.join(f'{tree}: {TREES[tree][0]}' for tree in results)}.", ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--measure", nargs=3, metavar=("ROOT", "TREE", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trees", default="2x32,8x48")
    parser.add_argument("--ledger-from", type=Path, help="write docs/patches.md from saved figures")
    parser.add_argument("--ledger-to", type=Path, default=LEDGER, help="where the ledger goes")
    args = parser.parse_args()
    if args.measure:
        root, tree, config = args.measure
        print(json.dumps(measure(Path(root), tree, config, int(os.environ.get("BENCH_CYCLES", "10")))))
        return
    if args.ledger_from:
        args.ledger_to.write_text(
            ledger(json.loads(args.ledger_from.read_text()), "python -m benchmarks.bench_patches")
        )
        return
    # figures of earlier runs for other trees are kept: one tree can be measured again alone
    saved = OUT / "patches.json" if args.ledger_to == LEDGER else args.ledger_to.with_suffix(".json")
    results: dict[str, dict[str, dict[str, float]]] = json.loads(saved.read_text()) if saved.exists() else {}
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for tree in args.trees.split(","):
            root = Path(work) / tree
            write_large_node(root, TREES[tree][1])
            results[tree] = {c: measured(root, tree, c, args.cycles, args.repeats) for c in configs()}
            saved.write_text(json.dumps(results, indent=2))
    text = ledger(
        {tree: results[tree] for tree in TREES if tree in results}, "python -m benchmarks.bench_patches"
    )
    args.ledger_to.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
