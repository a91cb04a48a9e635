"""A small fleet (four distinct nodes, one agent each) seen two ways at once, as docs/decisions/fleet-names.md
decides: scraped by one real Prometheus (the pull path), and pushed over OTLP through the gateway (rotel and
the stand-in for the Collector's Prometheus exporter, with the chart's settings) into a second one (the push
path). Both evaluate config/prometheus/otel-numa.rules.yaml. The fleet recording rules give the numbers the
nodes' plans say, the same on both paths; every series the rules and dashboards read has the same name and
k8s_node_name on both paths; every panel of the cluster dashboard answers on both paths."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import promql_parser
import pytest
import yaml

from otel_numa.instruments import catalogue
from otel_numa.testing.fleet import Fleet, FleetNode, plan_fleet, run_fleet_agents, write_fleet
from otel_numa.testing.gateway import run_gateway
from otel_numa.testing.large_node import GIB
from otel_numa.testing.peers import Prometheus, ScrapeJob, run_prometheus, wait_for
from tests.support import REPO

pytestmark = pytest.mark.e2e

RULES = REPO / "config" / "prometheus" / "otel-numa.rules.yaml"
DASHBOARDS = REPO / "config" / "grafana" / "dashboards"
CLUSTER = DASHBOARDS / "otel-numa-cluster.json"
SHAPES = ("general", "gpu", "memory-bound", "cpu-bound")
# Also each scrape's timeout. A scrape that times out marks every series of its target stale at once, and
# the gateway's stand-in renders the four nodes' page in Python: on two loaded cores that took over 1 s.
SCRAPE_INTERVAL = "3s"


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Prometheus, Prometheus]]:
    tmp = tmp_path_factory.mktemp("fleet")
    with (
        write_fleet(tmp / "nodes", plan_fleet(len(SHAPES), seed=7, shapes=SHAPES)) as fleet,
        run_gateway(tmp) as gateway,
        run_fleet_agents(
            fleet,
            tmp,
            [
                "--exporter=prometheus,otlp",
                f"--otlp-endpoint=http://127.0.0.1:{gateway.grpc_port}",
                "--interval=1",
            ],
        ) as agents,
        run_prometheus(
            tmp, [agent.target for agent in agents], SCRAPE_INTERVAL, rule_files=[RULES], name="pull"
        ) as pull,
        run_prometheus(
            tmp,
            [],
            SCRAPE_INTERVAL,
            extra_jobs=[ScrapeJob("gateway", [gateway.page_target], honor_labels=True)],
            rule_files=[RULES],
            name="push",
        ) as push,
    ):
        names = {node.name for node in fleet.nodes}
        for prom in (pull, push):
            wait_for(
                lambda prom=prom: (  # type: ignore[misc]
                    _nodes(prom, "k8s_node:numa_memory_free_bytes_single_node:max") == names
                    and _nodes(prom, "numa_container_memory_locality") == names
                ),
                60,
                "the fleet's recording rules on both paths",
                interval_s=0.5,
            )
        yield fleet, pull, push


def _nodes(prom: Prometheus, expr: str) -> set[str]:
    return {item["metric"].get("k8s_node_name", "") for item in prom.query(expr)}


def _per_numa(prom: Prometheus, record: str) -> dict[tuple[str, str], float]:
    return {
        (item["metric"]["k8s_node_name"], item["metric"]["numa_node_id"]): float(item["value"][1])
        for item in prom.query(record)
    }


def _planned_free(node: FleetNode) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Free CPUs and memory bytes per NUMA node from the node's plan (not from the agent)."""
    spec, expected = node.node.spec, node.node.expected(0)
    cpus: dict[tuple[str, str], float] = {}
    memory: dict[tuple[str, str], float] = {}
    for numa in range(spec.numa_nodes):
        key = (node.name, str(numa))
        cpus[key] = spec.cpus_per_node - spec.reserved_cpus_per_node - expected.cpus_by_numa.get(numa, 0)
        allocatable = spec.mem_per_node_kib * 1024 - (GIB if numa == 0 else 0)
        memory[key] = allocatable - expected.memory_by_numa.get(numa, 0)
    return cpus, memory


def test_fleet_rules_give_the_plans_numbers_on_both_paths(
    paths: tuple[Fleet, Prometheus, Prometheus],
) -> None:
    fleet, pull, push = paths
    cpus: dict[tuple[str, str], float] = {}
    memory: dict[tuple[str, str], float] = {}
    for node in fleet.nodes:
        node_cpus, node_memory = _planned_free(node)
        cpus |= node_cpus
        memory |= node_memory
    for prom in (pull, push):
        assert _per_numa(prom, "k8s_node_numa:numa_cpu_free:sum") == cpus
        assert _per_numa(prom, "k8s_node_numa:numa_memory_free_bytes:sum") == memory
        single = {item["metric"]["k8s_node_name"]: float(item["value"][1]) for item in
                  prom.query("k8s_node:numa_cpu_free_single_node:max")}  # fmt: skip
        assert single == {
            node.name: max(v for (name, _), v in cpus.items() if name == node.name) for node in fleet.nodes
        }
    records = [rule["record"] for group in yaml.safe_load(RULES.read_text())["groups"]
               for rule in group["rules"] if "record" in rule]  # fmt: skip
    for record in records:
        assert pull.series(record), record
        assert pull.series(record) == push.series(record), record


def agent_series_read() -> set[str]:
    """Every agent series (catalogue name) that the rule file and the dashboards select."""
    exprs = [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    for path in DASHBOARDS.glob("*.json"):
        document = json.loads(path.read_text())
        exprs += [
            target["expr"] for panel in _panels(document["panels"]) for target in panel.get("targets", [])
        ]
    names: set[str] = set()
    for expr in exprs:
        filled = re.sub(r"\$\{?(\w+)\}?", lambda m: "5m" if m.group(1) == "__rate_interval" else "1", expr)

        def visit(node: Any) -> None:
            if isinstance(node, promql_parser.VectorSelector) and node.name:
                names.add(node.name)

        promql_parser.walk(promql_parser.parse(filled), visit)
    return names & {spec.prometheus_name for spec in catalogue.METRICS}


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def test_every_series_read_has_one_name_and_node_label_on_both_paths(
    paths: tuple[Fleet, Prometheus, Prometheus],
) -> None:
    fleet, pull, push = paths
    names = {node.name for node in fleet.nodes}
    read = agent_series_read()
    assert "numa_container_memory_locality" in read and "numa_container_aligned" in read
    compared = 0
    for name in sorted(read):
        on_pull = {key: value for key, value in pull.series(f"count by (k8s_node_name) ({name})").items()}
        if not on_pull:
            continue  # not exported on these nodes (opt-in, or a metric still to come)
        compared += 1
        assert on_pull == push.series(f"count by (k8s_node_name) ({name})"), name
        assert {dict(key)["k8s_node_name"] for key in on_pull} <= names, name
    assert compared >= 20
    # the push path does not add the specification's unit suffix to the unit-1 gauges
    assert not push.query('{__name__=~".+_ratio"}')


def test_every_cluster_dashboard_panel_answers_on_both_paths(
    paths: tuple[Fleet, Prometheus, Prometheus],
) -> None:
    fleet, pull, push = paths
    by_shape = {node.plan.shape: node.name for node in fleet.nodes}
    dashboard = json.loads(CLUSTER.read_text())
    pending = {"numa_cpu_pinned", "numa_container_allocation_mismatch"} - {
        spec.prometheus_name for spec in catalogue.METRICS
    }
    # 8 CPUs and 16 GiB: the general and GPU nodes fit; the memory-bound nodes' CPUs and the cpu-bound
    # nodes' memory are stranded
    plain = {"job": ".+", "cpus": "8", "memory_gib": "16", "hugepage_size": "2Mi", "hugepages_gib": "0",
             "resource": "nvidia.com/gpu", "devices": "0"}  # fmt: skip
    # the same with one GPU and one 1 GiB hugepage: only the GPU node
    gpu = plain | {"hugepage_size": "1Gi", "hugepages_gib": "1", "devices": "1"}
    fits = next(
        p for p in _panels(dashboard["panels"]) if p["title"] == "Nodes that fit, and on how many NUMA nodes"
    )
    for prom in (pull, push):
        for values in (plain, gpu):
            for panel in _panels(dashboard["panels"]):
                for target in panel.get("targets", []):
                    expr = _fill(target["expr"], values)
                    if any(name in expr for name in pending):
                        continue  # answers once the agent reports it (the records work)
                    assert prom.query(expr), f"{panel['title']}/{target['refId']} has no data: {expr}"
        fitting = {
            dict(key)["k8s_node_name"] for key in prom.series(_fill(fits["targets"][0]["expr"], plain))
        }
        assert fitting == {by_shape["general"], by_shape["gpu"]}
        fitting = {dict(key)["k8s_node_name"] for key in prom.series(_fill(fits["targets"][0]["expr"], gpu))}
        assert fitting == {by_shape["gpu"]}
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["query"])
                assert match, variable["query"]
                assert prom.query(f"count by ({match.group(2)}) ({match.group(1)})"), variable["name"]


def _fill(expr: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda match: values[match.group(1)], expr)
