"""What a round costs, part by part, when nothing, the machine's counters, every counter or one pod changed.

In process, on the 2x32 and 8x48 nodes of bench_cost, each export path in a worker process of its own:
the agent's background round (the cgroup walk and the podresources RPCs, to a test server in another
process), one OTLP push to a real rotel (the agent's own exporter: gRPC, or OTLP/HTTP with ``--protocol
http/protobuf``; ``--compression gzip`` sets ``OTEL_EXPORTER_OTLP_COMPRESSION``), and one scrape of the
page (its WSGI app, in the text format), each timed with ``time.process_time`` (every thread of the
worker: the snapshot worker, the push worker and gRPC's own; the worker runs nothing else). The daemon's
heap policy applies. Before each cycle the scenario's change is written:

- ``unchanged``: nothing; every file keeps its bytes. On a real node the containers that did not run since
  the last round (a sleeping process, every pod's pause container) keep their cgroup files' bytes too,
  but the machine's counters never stand still;
- ``machine``: an idle node: ``/proc/stat`` (every CPU's ticks grow) and each NUMA node's ``meminfo``
  (free memory moves) change, the containers' files do not;
- ``fresh``: a busy node: on top of that, every container's ``memory.numa_stat`` and ``cpu.stat`` (anon
  and file memory, CPU time grow);
- ``pod``: one shared-pool pod replaced by a new one (another name, UID and container ids: its cgroups,
  ``pods/`` directory, log links and the podresources answer), nothing else.

Figures: each part's median CPU over the cycles (ms), the cycle's, and the scrape's wall-clock p95. After
each cycle the page is scraped once more as Prometheus asks for it (gzip, OpenMetrics first): the gzip
scrape column, not part of the cycle.

    .venv/bin/python -m benchmarks.bench_rounds [--nodes 2x32,8x48] [--paths auto,off] [--cycles 30]
    .venv/bin/python -m benchmarks.bench_rounds --nodes 2x32 --paths auto --profile unchanged:background
    .venv/bin/python -m benchmarks.bench_rounds --agent-tree DIR ...   # another commit's package
    .venv/bin/python -m benchmarks.bench_rounds --protocol http/protobuf --compression gzip ...

``--profile SCENARIO:PART`` prints where that part's CPU goes (cProfile, the part's own thread and the
snapshot and push workers). The table goes to stdout and ``benchmarks/out/rounds.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

from benchmarks.bench_cost import NODE_2X32, NODE_8X48, ProcStat, git_head, progress
from benchmarks.harness import PROMETHEUS_SCRAPE_HEADERS, machine_details, median, percentile
from otel_numa.testing.large_node import LargeNode, LargeNodeSpec, write_large_node
from otel_numa.testing.peers import REPO, run_rotel, wait_for
from otel_numa.testing.podresources_server import short_socket_dir

NODES: dict[str, LargeNodeSpec] = {"2x32": NODE_2X32, "8x48": NODE_8X48}
SCENARIOS = ("unchanged", "machine", "fresh", "pod")
PARTS = ("background", "push", "scrape")
GZIP_SCRAPE = "gzip"  # a scrape as Prometheus asks, after each cycle, not part of it
WARM_UP_CYCLES = 5
_MEM_FREE = re.compile(r"^(Node \d+ MemFree:\s+)(\d+)", flags=re.MULTILINE)


class Changes:
    """Writes each scenario's change into the node before a cycle."""

    def __init__(self, node: LargeNode, podresources_state: Path) -> None:
        self.node = node
        self.proc_stat = ProcStat(node.procfs_root)
        self.podresources_state = podresources_state
        self.generation = 0
        self.replaced = 0
        shared = [index for index in range(node.spec.pods) if not node.spec.exclusive(index)]
        self._shared = shared

    def write(self, scenario: str) -> None:
        self.generation += 1
        if scenario in ("machine", "fresh"):
            self.proc_stat.write(self.generation)
            for meminfo in sorted((self.node.sysfs_root / "devices/system/node").glob("node*/meminfo")):
                text = meminfo.read_text()
                meminfo.write_text(
                    _MEM_FREE.sub(lambda m: f"{m.group(1)}{int(m.group(2)) - self.generation}", text)
                )
        if scenario == "fresh":
            self.node.write_cgroup_usage(self.generation)
        if scenario == "pod":
            self.replaced += 1
            index = self._shared[self.replaced % len(self._shared)]
            self.node.replace_pod(index, self.replaced)
            write_podresources_state(self.node, self.podresources_state)


def write_podresources_state(node: LargeNode, path: Path) -> None:
    temporary = path.with_name(path.name + ".new")
    temporary.write_text(json.dumps(node.podresources_state()))
    os.replace(temporary, path)


@contextmanager
def podresources_server(node: LargeNode, work: Path) -> Iterator[tuple[Path, Path]]:
    """A podresources server in its own process, reading its state file again when it is replaced;
    yields (socket, state file)."""
    state = work / "podresources.json"
    write_podresources_state(node, state)
    socket_dir = short_socket_dir()
    socket = socket_dir / "kubelet.sock"
    command = [sys.executable, "-m", "otel_numa.testing.podresources_server", "--socket", str(socket)]
    with open(work / "podresources.log", "wb") as log:
        process = subprocess.Popen(
            [*command, "--state", str(state), "--reload"], stdout=log, stderr=log, cwd=REPO
        )
    try:
        wait_for(socket.exists, 30, "the podresources server to listen")
        yield socket, state
    finally:
        process.terminate()
        process.wait(timeout=10)
        socket.unlink(missing_ok=True)
        socket_dir.rmdir()


class Profiles:
    """cProfile of one part, in the calling thread and in the snapshot and push workers."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self.on = False

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        profile = cProfile.Profile()
        self.profiles.append(profile)

        def run(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return function(*args, **kwargs)
            return profile.runcall(function, *args, **kwargs)

        return run

    def report(self, lines: int = 45) -> str:
        text = io.StringIO()
        stats = pstats.Stats(self.profiles[0], stream=text)
        for profile in self.profiles[1:]:
            with suppress(TypeError):  # a worker that never ran
                stats.add(profile)
        stats.sort_stats("cumulative").print_stats(lines)
        return text.getvalue()


def worker(
    node_key: str, path: str, cycles: int, work: Path, profile: str | None, protocol: str
) -> dict[str, Any]:
    """In this process: the agent on the node, the figures of each scenario."""
    from otel_numa.cli.settings import Settings
    from otel_numa.daemon.agent import Agent
    from otel_numa.daemon.heap import HeapPolicy
    from otel_numa.endpoints.metrics_page import compressing
    from otel_numa.export.pipeline import build_pipeline
    from otel_numa.testing.wsgi import call_wsgi

    node = write_large_node(work / "node", NODES[node_key])
    heap = HeapPolicy()
    figures: dict[str, Any] = {}
    with ExitStack() as stack:
        rotel = stack.enter_context(run_rotel(work, verbosity="basic"))
        socket, state = stack.enter_context(podresources_server(node, work))
        port = rotel.grpc_port if protocol == "grpc" else rotel.http_port
        values = {
            **node.settings_values(),
            "podresources_socket": str(socket),
            "fast_path": path,
            "otlp_endpoint": f"http://127.0.0.1:{port}",
            "otlp_protocol": protocol,
        }
        agent = Agent(Settings(**values).to_options(), heap=heap)  # type: ignore[arg-type]
        pipeline = build_pipeline(agent.options, agent.store, exporters=("prometheus", "otlp"))
        pipeline.after_push = heap.after_push
        agent.background.live_pods_listener = pipeline.forget_departed
        app = compressing(pipeline.page_app())  # as the page server has it

        def background() -> None:
            agent.refresh_background()
            heap.after_round()

        def scrape() -> None:
            call_wsgi(app)
            heap.after_response()

        def push() -> None:
            pipeline.push(timeout_s=5)

        def gzip_scrape() -> None:
            accept, encoding = (
                PROMETHEUS_SCRAPE_HEADERS["Accept"],
                PROMETHEUS_SCRAPE_HEADERS["Accept-Encoding"],
            )
            call_wsgi(app, accept=accept, accept_encoding=encoding, gunzip=False)
            heap.after_response()

        parts: dict[str, Callable[[], None]] = {
            "background": background,
            "push": push,
            "scrape": scrape,
            GZIP_SCRAPE: gzip_scrape,
        }
        profiles = Profiles()
        if profile is not None:
            parts[profile.partition(":")[2]] = profiles.wrap(parts[profile.partition(":")[2]])
            # the snapshot worker's builds and the push worker's exports (our own objects' attributes)
            agent.store._build = profiles.wrap(agent.store._build)
            for exporter in pipeline._exporters:
                inner = getattr(exporter, "exporter", None)
                if inner is not None:
                    setattr(inner, "export", profiles.wrap(inner.export))  # noqa: B010
        changes = Changes(node, state)
        for _ in range(WARM_UP_CYCLES):
            for run in parts.values():
                run()
        heap.after_collection()  # the daemon freezes what the first collection left (otel_numa.daemon.heap)
        for scenario in SCENARIOS:
            spent: dict[str, list[float]] = {part: [] for part in parts}
            latencies: list[float] = []
            for cycle in range(cycles + WARM_UP_CYCLES):
                changes.write(scenario)
                measuring = cycle >= WARM_UP_CYCLES
                for part, run in parts.items():
                    profiles.on = measuring and profile == f"{scenario}:{part}"
                    started, wall = time.process_time(), time.perf_counter()
                    run()
                    if measuring:
                        spent[part].append(time.process_time() - started)
                        if part == "scrape":
                            latencies.append(time.perf_counter() - wall)
                profiles.on = False
            figures[scenario] = {
                **{part: median(values) * 1000 for part, values in spent.items()},
                "cycle": median([sum(each) for each in zip(*(spent[part] for part in PARTS), strict=True)])
                * 1000,
                "scrape_p95": percentile(latencies, 0.95) * 1000,
            }
        if profile is not None:
            figures["profile"] = profiles.report()
        pipeline.shutdown(timeout_s=2)
        agent.background.close()
    return figures


def run_worker(
    node: str,
    path: str,
    cycles: int,
    profile: str | None,
    agent_tree: Path | None,
    protocol: str = "grpc",
    compression: str = "none",
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-rounds-") as temporary:
        out = Path(temporary) / "figures.json"
        command = [
            sys.executable,
            "-m",
            "benchmarks.bench_rounds",
            "--worker",
            node,
            path,
            str(cycles),
            str(out),
            protocol,
        ]
        if profile:
            command += ["--profile", profile]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (agent_tree, REPO) if p is not None)
        env.pop("OTEL_EXPORTER_OTLP_COMPRESSION", None)
        env.pop("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", None)
        if compression != "none":
            env["OTEL_EXPORTER_OTLP_COMPRESSION"] = compression
        # run outside the checkout: ``-m`` puts the working directory first on the path, before the tree
        subprocess.run(command, cwd=temporary, env=env, check=True)
        figures: dict[str, Any] = json.loads(out.read_text())
        return figures


def table(results: dict[tuple[str, str], dict[str, Any]]) -> str:
    lines = [
        "| node | path | change | background (ms) | push (ms) | scrape (ms) | cycle (ms) | scrape p95 (ms) "
        "| gzip scrape (ms) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (node, path), figures in results.items():
        for scenario in SCENARIOS:
            f = figures[scenario]
            parts = " | ".join(f"{f[part]:.2f}" for part in (*PARTS, "cycle"))
            lines.append(
                f"| {node} | {path} | {scenario} | {parts} | {f['scrape_p95']:.1f} | {f[GZIP_SCRAPE]:.2f} |"
            )
        fresh = figures["fresh"]["cycle"]
        lines.append(
            f"| {node} | {path} | pod / fresh | | | | {figures['pod']['cycle'] / fresh:.2f}x | | |"
            if fresh
            else ""
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2x32,8x48")
    parser.add_argument("--paths", default="auto,off", help="--fast-path values, comma separated")
    parser.add_argument("--cycles", type=int, default=30, help="measured cycles per scenario")
    parser.add_argument("--profile", help="SCENARIO:PART, e.g. unchanged:background")
    parser.add_argument("--agent-tree", type=Path, help="run the agent from this source tree")
    parser.add_argument("--protocol", default="grpc", choices=("grpc", "http/protobuf"), help="of the pushes")
    parser.add_argument("--compression", default="none", choices=("none", "gzip"), help="of the pushes")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        node, path, cycles, out, protocol = options.worker
        with tempfile.TemporaryDirectory(prefix="bench-rounds-worker-") as work:
            figures = worker(node, path, int(cycles), Path(work), options.profile, protocol)
        Path(out).write_text(json.dumps(figures))
        return
    agent_tree = options.agent_tree.resolve() if options.agent_tree else None
    who = f"agent from {agent_tree}" if agent_tree else git_head()
    pushes = f"pushes over {options.protocol}, compression {options.compression}"
    header = f"{time.strftime('%Y-%m-%d')}, {who}; {pushes}; machine: {machine_details()}"
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for node in options.nodes.split(","):
        for path in options.paths.split(","):
            progress(f"{node}, --fast-path {path}: {options.cycles} cycles per change")
            results[(node, path)] = run_worker(
                node, path, options.cycles, options.profile, agent_tree, options.protocol, options.compression
            )
            if options.profile:
                print(results[(node, path)]["profile"])
    text = "\n".join(
        [header, "", table(results), "", "CPU: time.process_time of the worker, medians of the cycles"]
    )
    print(text)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "rounds.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
