"""A fleet on one machine: what many agents cost the metrics backend, on the pull and the push path.

    .venv/bin/python -m benchmarks.bench_fleet                    # 30 agents in steps of 10; ~10 minutes
    .venv/bin/python -m benchmarks.bench_fleet --steps 4 --settle 40 --churn-rounds 1   # a smoke run

Distinct simulated nodes (otel_numa/testing/fleet.py: six shapes, pod counts drawn per node, podresources
served for each) each run their own agent process, exporting to both paths at once:

- pull: a real Prometheus (Debian's) scrapes every agent (file_sd, 15 s) and evaluates
  config/prometheus/otel-numa.rules.yaml;
- push: every agent pushes OTLP/gRPC every 15 s through a byte-counting relay to the gateway (rotel with the
  Collector's batch defaults, then the stand-in for the Collector's Prometheus exporter with the chart's
  settings: otel_numa/testing/gateway.py), which a second Prometheus scrapes (honor_labels) with the same
  rules.

Agents start in steps; after each step has settled the benchmark records, per step: series and samples/s
(Prometheus' scrape_samples_scraped), the agents' pages (bytes, gzip), bytes pushed per push, both
Prometheus servers' head series, heap and RSS, rotel's RSS, and the fleet rules' evaluation time. Then churn:
each round a quarter of the nodes place their pods anew (series churn), and the head series created are
counted. Last, offline, each shape's series with the cardinality controls (--disable, --metrics-exclude,
--container-memory-types). Tables are printed and written to benchmarks/out/fleet.{json,md}; docs/fleet.md
holds the current one.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

from otel_numa.testing.byte_proxy import ByteCountingProxy
from otel_numa.testing.fleet import (
    SHAPES,
    FleetAgent,
    FleetNode,
    NodePlan,
    plan_fleet,
    run_fleet_agents,
    write_fleet,
)
from otel_numa.testing.gateway import Gateway, run_gateway
from otel_numa.testing.peers import (
    REPO,
    Prometheus,
    free_port,
    http_get,
    require_binary,
    stop_process,
    wait_for,
)

RULES = REPO / "config" / "prometheus" / "otel-numa.rules.yaml"
INTERVAL_S = 15

# What a fleet operator can switch off, measured per shape (series on the page, gzip bytes).
CONTROLS: dict[str, list[str]] = {
    "default": [],
    "--container-memory-types anon": ["--container-memory-types=anon"],
    "--metrics-exclude 'numa_container_cpu_time*'": ["--metrics-exclude=numa_container_cpu_time*"],
    "--disable container_usage": ["--disable=container_usage"],
    "--disable distances": ["--disable=distances"],
    "--disable containers,container_usage": ["--disable=containers,container_usage"],
}


@dataclass
class Backend:
    name: str
    prometheus: Prometheus
    config: Path

    def self_metrics(self) -> dict[str, float]:
        status, body = http_get(f"http://127.0.0.1:{self.prometheus.port}/metrics")
        assert status == 200
        wanted = {
            "prometheus_tsdb_head_series",
            "prometheus_tsdb_head_series_created_total",
            "go_memstats_heap_inuse_bytes",
            "process_resident_memory_bytes",
        }
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name in wanted and not sample.labels:
                    found[sample.name] = sample.value
                group = sample.labels.get("rule_group", "")
                if sample.name == "prometheus_rule_group_last_duration_seconds" and group.endswith(
                    ";otel-numa-fleet"
                ):
                    found["fleet_rules_s"] = sample.value
        return found

    def scalar(self, expr: str) -> float:
        result = self.prometheus.query(expr)
        return float(result[0]["value"][1]) if result else 0.0


@contextmanager
def run_backend(tmp: Path, name: str, scrape: str) -> Iterator[Backend]:
    """A Prometheus with the repository's rules, scraping per ``scrape`` (a scrape_configs YAML block)."""
    port = free_port()
    config = tmp / f"{name}.yml"
    config.write_text(
        f"global:\n  scrape_interval: {INTERVAL_S}s\n  scrape_timeout: 10s\n"
        f"  evaluation_interval: {INTERVAL_S}s\n"
        f"rule_files:\n  - {json.dumps(str(RULES))}\nscrape_configs:\n{scrape}"
    )
    with open(tmp / f"{name}.log", "wb") as log:
        process = subprocess.Popen(
            [
                require_binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / (name + '-data')}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/-/ready")[0] == 200, 60, f"{name} to be ready")
        yield Backend(name, Prometheus(port, process), config)
    finally:
        stop_process(process)


def write_targets(path: Path, agents: Sequence[FleetAgent]) -> None:
    entries = [{"targets": [agent.target], "labels": {"shape": agent.node.plan.shape}} for agent in agents]
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(entries))
    temporary.replace(path)


def rss(process: subprocess.Popen[bytes]) -> int:
    return int(psutil.Process(process.pid).memory_info().rss)


def page_bytes(agent: FleetAgent) -> tuple[int, int]:
    """(plain, gzip) size of the agent's page as Prometheus would fetch it."""
    import urllib.request

    request = urllib.request.Request(f"http://{agent.target}/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
        compressed = response.headers.get("Content-Encoding") == "gzip"
    plain = gzip.decompress(body) if compressed else body
    return len(plain), len(body) if compressed else len(gzip.compress(plain, 6))


@dataclass
class Step:
    agents: int
    series: dict[str, float] = field(default_factory=dict)  # shape -> mean series per node
    pull: dict[str, float] = field(default_factory=dict)
    push: dict[str, float] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)


def measure(
    agents: Sequence[FleetAgent], pull: Backend, push: Backend, gateway: Gateway, proxy: ByteCountingProxy,
    window_s: float,
) -> Step:  # fmt: skip
    step = Step(len(agents))
    sent_before, started = proxy.sent, time.monotonic()
    time.sleep(window_s)
    elapsed = time.monotonic() - started
    pushes = len(agents) * elapsed / INTERVAL_S
    step.values["bytes_per_push"] = (proxy.sent - sent_before) / pushes
    per_target = {
        item["metric"]["instance"]: float(item["value"][1])
        for item in pull.prometheus.query('scrape_samples_scraped{job="otel-numa"}')
    }
    shapes: dict[str, list[float]] = {}
    plain_total = gzip_total = 0
    for agent in agents:
        shapes.setdefault(agent.node.plan.shape, []).append(per_target.get(agent.target, 0.0))
        plain, packed = page_bytes(agent)
        plain_total += plain
        gzip_total += packed
    step.series = {shape: sum(v) / len(v) for shape, v in shapes.items()}
    total_series = sum(per_target.values())
    step.values |= {
        "series": total_series,
        "samples_per_s": total_series / INTERVAL_S,
        "page_bytes_per_node": plain_total / len(agents),
        "page_gzip_bytes_per_node": gzip_total / len(agents),
        "rotel_rss": rss(gateway.rotel),
        "standin_rss": rss(gateway.exporter),
        "gateway_series": push.scalar('scrape_samples_scraped{job="gateway"}'),
        "fleet_rule_series": pull.scalar('count({__name__=~"k8s_node.*:.*"})'),
    }
    step.pull = pull.self_metrics()
    step.push = push.self_metrics()
    step.values["rule_eval_s"] = step.pull.pop("fleet_rules_s", 0.0)
    step.push.pop("fleet_rules_s", None)
    return step


def controls_by_shape(root: Path) -> dict[str, dict[str, tuple[int, int]]]:
    """Series and gzip bytes of each shape's largest node under each cardinality control (``--once``)."""
    plans = [NodePlan(f"{s.name}-max", s.name, dataclasses.replace(s.spec, pods=s.pods[1])) for s in SHAPES]
    found: dict[str, dict[str, tuple[int, int]]] = {}
    with write_fleet(root, plans) as fleet:
        for node in fleet.nodes:
            found[node.plan.shape] = {}
            for name, flags in CONTROLS.items():
                page = subprocess.run(
                    [sys.executable, "-m", "otel_numa", *node.agent_args(), *flags, "--once"],
                    capture_output=True, check=True, timeout=120,
                ).stdout  # fmt: skip
                series = sum(1 for line in page.splitlines() if line and not line.startswith(b"#"))
                found[node.plan.shape][name] = (series, len(gzip.compress(page, 6)))
    return found


def push_bytes_by_shape(root: Path) -> dict[str, dict[str, float]]:
    """Bytes on the wire per OTLP/gRPC push of each shape's largest node, uncompressed and with
    OTEL_EXPORTER_OTLP_COMPRESSION=gzip (pushes every second, counted over 6 s after 4 s of warm-up)."""
    plans = [NodePlan(f"{s.name}-max", s.name, dataclasses.replace(s.spec, pods=s.pods[1])) for s in SHAPES]
    found: dict[str, dict[str, float]] = {}
    with write_fleet(root / "nodes", plans) as fleet, run_gateway(root) as gateway:
        for node in fleet.nodes:
            found[node.plan.shape] = {}
            for compression in ("none", "gzip"):
                environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
                if compression == "gzip":
                    environment["OTEL_EXPORTER_OTLP_COMPRESSION"] = compression
                with ByteCountingProxy(gateway.grpc_port) as proxy:
                    agent = subprocess.Popen(
                        [sys.executable, "-m", "otel_numa", *node.agent_args(), "--exporter=otlp",
                         f"--otlp-endpoint=http://127.0.0.1:{proxy.port}", "--interval=1",
                         "--prometheus-address=none", "--health-address=none"],
                        env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )  # fmt: skip
                    try:
                        time.sleep(4)
                        before = proxy.sent
                        time.sleep(6)
                        found[node.plan.shape][compression] = (proxy.sent - before) / 6
                    finally:
                        stop_process(agent)
    return found


def churn(
    nodes: Sequence[FleetNode], rounds: int, pause_s: float, pull: Backend, push: Backend
) -> dict[str, Any]:
    before = {b.name: b.self_metrics() for b in (pull, push)}
    quarter = max(1, len(nodes) // 4)
    for round_index in range(rounds):
        for node in nodes[round_index % 4 :: 4]:  # every fourth node, so that every shape has some
            node.churn()
        time.sleep(pause_s)
    after = {b.name: b.self_metrics() for b in (pull, push)}
    return {
        "rounds": rounds,
        "nodes_per_round": quarter,
        **{
            f"{name}_series_created": after[name]["prometheus_tsdb_head_series_created_total"]
            - before[name]["prometheus_tsdb_head_series_created_total"]
            for name in before
        },
        **{f"{name}_after": after[name] for name in after},
    }


def markdown(
    steps: Sequence[Step],
    churned: dict[str, Any],
    controls: dict[str, dict[str, tuple[int, int]]],
    pushes: dict[str, dict[str, float]],
) -> str:
    columns = [
        "agents", "series", "samples/s", "page KB (gzip) per node", "bytes per push",
        "pull: head series, heap MB, RSS MB", "push: head series, heap MB, RSS MB", "rotel RSS MB",
        "fleet rules: series, eval ms",
    ]  # fmt: skip
    lines = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    mb = 1 << 20
    for step in steps:
        v, pull, push = step.values, step.pull, step.push
        lines.append(
            f"| {step.agents} | {v['series']:,.0f} | {v['samples_per_s']:,.0f} | "
            f"{v['page_bytes_per_node'] / 1024:,.0f} ({v['page_gzip_bytes_per_node'] / 1024:,.1f}) | "
            f"{v['bytes_per_push']:,.0f} | "
            f"{pull['prometheus_tsdb_head_series']:,.0f}, {pull['go_memstats_heap_inuse_bytes'] / mb:,.0f}, "
            f"{pull['process_resident_memory_bytes'] / mb:,.0f} | "
            f"{push['prometheus_tsdb_head_series']:,.0f}, {push['go_memstats_heap_inuse_bytes'] / mb:,.0f}, "
            f"{push['process_resident_memory_bytes'] / mb:,.0f} | {v['rotel_rss'] / mb:,.0f} | "
            f"{v['fleet_rule_series']:,.0f}, {v['rule_eval_s'] * 1000:,.1f} |"
        )
    lines += ["", "Series per node by shape (last step): " + ", ".join(
        f"{shape} {value:,.0f}" for shape, value in steps[-1].series.items())]  # fmt: skip
    lines += [
        "",
        f"Churn: {churned['rounds']} rounds of {churned['nodes_per_round']} nodes placing their pods anew: "
        f"{churned['pull_series_created']:,.0f} head series created on the pull path, "
        f"{churned['push_series_created']:,.0f} on the push path.",
        "",
    ]
    if pushes:
        lines += ["| shape (most pods) | bytes per push | with gzip |", "|---|---|---|"]
        lines += [f"| {shape} | {v['none']:,.0f} | {v['gzip']:,.0f} |" for shape, v in pushes.items()]
        lines.append("")
    names = list(CONTROLS)
    lines.append("| shape (most pods) | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for shape, by_control in controls.items():
        cells = [f"{by_control[n][0]:,} ({by_control[n][1] / 1024:,.1f} KB)" for n in names]
        lines.append(f"| {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="10,20,30", help="agents after each step (comma list)")
    parser.add_argument("--settle", type=float, default=60, help="seconds after a step before measuring")
    parser.add_argument("--window", type=float, default=45, help="seconds the push bytes are counted over")
    parser.add_argument("--churn-rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--only-pushes", action="store_true", help="only the push sizes by shape")
    args = parser.parse_args(argv)
    steps = [int(value) for value in args.steps.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="otel-numa-pushes-") as directory:
        pushes = push_bytes_by_shape(Path(directory))
    if args.only_pushes:
        (args.out / "fleet-pushes.json").write_text(json.dumps(pushes, indent=1))
        print(json.dumps(pushes, indent=1))
        return
    results: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="otel-numa-fleet-") as directory, ExitStack() as stack:
        tmp = Path(directory)
        fleet = stack.enter_context(write_fleet(tmp / "nodes", plan_fleet(steps[-1], seed=args.seed)))
        gateway = stack.enter_context(run_gateway(tmp))
        proxy = stack.enter_context(ByteCountingProxy(gateway.grpc_port))
        targets = tmp / "targets.json"
        write_targets(targets, [])
        pull = stack.enter_context(run_backend(tmp, "pull", (
            f"  - job_name: otel-numa\n    file_sd_configs:\n      - files: [{json.dumps(str(targets))}]\n"
            "        refresh_interval: 5s\n")))  # fmt: skip
        push = stack.enter_context(run_backend(tmp, "push", (
            f"  - job_name: gateway\n    honor_labels: true\n    static_configs:\n"
            f"      - targets: [{json.dumps(gateway.page_target)}]\n")))  # fmt: skip
        agent_flags = ["--exporter=prometheus,otlp", f"--otlp-endpoint=http://127.0.0.1:{proxy.port}",
                       f"--interval={INTERVAL_S}"]  # fmt: skip
        running: list[FleetAgent] = []
        started = 0
        for count in steps:
            batch = fleet.nodes[started:count]
            running += stack.enter_context(run_fleet_agents(batch, tmp, agent_flags, ready_s=300))
            started = count
            write_targets(targets, running)
            print(f"{count} agents running; settling {args.settle:.0f} s", file=sys.stderr, flush=True)
            time.sleep(args.settle)
            results.append(measure(running, pull, push, gateway, proxy, args.window))
            print(json.dumps(dataclasses.asdict(results[-1])), file=sys.stderr, flush=True)
        churned = churn(fleet.nodes, args.churn_rounds, 2 * INTERVAL_S, pull, push)
    with tempfile.TemporaryDirectory(prefix="otel-numa-controls-") as directory:
        controls = controls_by_shape(Path(directory))
    table = markdown(results, churned, controls, pushes)
    document = {
        "steps": [dataclasses.asdict(s) for s in results],
        "churn": churned,
        "controls": controls,
        "pushes": pushes,
    }
    (args.out / "fleet.json").write_text(json.dumps(document, indent=1))
    (args.out / "fleet.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
