"""Static checks of the cluster dashboard config/grafana/dashboards/otel-numa-cluster.json: provisionable,
its data source and variables defined and used, panels placed without overlap, and every query parsed as
PromQL reading only the fleet recording rules and the agent's catalogue series with labels they carry.
tests/e2e/test_fleet.py shows every panel answering on a simulated fleet, on the pull and the push path."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import promql_parser
import pytest
import yaml

from otel_numa.instruments import catalogue
from tests.support import REPO

DASHBOARD = REPO / "config" / "grafana" / "dashboards" / "otel-numa-cluster.json"
RULES = REPO / "config" / "prometheus" / "otel-numa.rules.yaml"
CHART_COPY = REPO / "config" / "helm" / "otel-numa" / "files" / "dashboards" / "otel-numa-cluster.json"
DOCUMENT = json.loads(DASHBOARD.read_text())
VARIABLE = re.compile(r"\$\{?(\w+)\}?")
REFERENCE = {"type": "prometheus", "uid": "${datasource}"}
SAMPLE = {"job": ".+", "cpus": "32", "memory_gib": "64", "hugepage_size": "1Gi", "hugepages_gib": "0",
          "resource": "nvidia.com/gpu", "devices": "0"}  # fmt: skip


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


TARGETS = [(panel, target) for panel in panels(DOCUMENT["panels"]) for target in panel.get("targets", [])]


def record_labels() -> dict[str, frozenset[str]]:
    """Fleet record -> the labels it keeps (its by clause)."""
    found = {}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "record" in rule and rule["record"].startswith("k8s_node"):
                expr = promql_parser.parse(rule["expr"])
                labels: set[str] = set()

                def visit(node: Any, labels: set[str] = labels) -> None:
                    if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
                        labels.update(node.modifier.labels)

                promql_parser.walk(expr, visit)
                found[rule["record"]] = frozenset(labels)
    return found


RECORDS = record_labels()
AGENT = {
    spec.prometheus_name: frozenset(
        {"job", "instance", "k8s_node_name"} | {a.replace(".", "_") for a in spec.attributes}
    )
    for spec in catalogue.METRICS
}
# read by the cluster view before the agent reports them (the records engineer's series)
COMING = {
    "numa_cpu_pinned": frozenset({"job", "instance", "k8s_node_name", "numa_node_id"}),
    "numa_container_allocation_mismatch": frozenset(
        {"job", "instance", "k8s_node_name", "k8s_pod_uid", "k8s_container_name", "k8s_pod_name",
         "k8s_namespace_name", "numa_resource_kind"}
    ),
}  # fmt: skip


def test_dashboard_is_provisionable_and_shipped_by_the_chart() -> None:
    assert DOCUMENT["uid"] == "otel-numa-cluster"
    assert DOCUMENT.get("id") is None
    assert DOCUMENT["schemaVersion"] >= 39
    assert CHART_COPY.read_text() == DASHBOARD.read_text()


def test_data_source_is_the_variable_everywhere() -> None:
    for panel in panels(DOCUMENT["panels"]):
        if panel["type"] != "row":
            assert panel["datasource"] == REFERENCE, panel["title"]
    for panel, target in TARGETS:
        assert target["datasource"] == REFERENCE, panel["title"]


def test_every_variable_used_is_defined_and_every_defined_one_used() -> None:
    defined = {v["name"] for v in DOCUMENT["templating"]["list"]}
    used = {m.group(1) for _, t in TARGETS for m in VARIABLE.finditer(t["expr"])}
    used |= {m.group(1) for p in panels(DOCUMENT["panels"]) for m in VARIABLE.finditer(json.dumps(p))}
    assert used <= defined | {"datasource"}, used - defined
    assert defined - {"datasource"} <= used, defined - used


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    ids = [p["id"] for p in panels(DOCUMENT["panels"])]
    assert len(ids) == len(set(ids))
    for panel in panels(DOCUMENT["panels"]):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells.get((x, y))}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize(
    "item", TARGETS, ids=[f"{panel['title']}/{target['refId']}" for panel, target in TARGETS]
)
def test_query_reads_known_series_and_labels(item: tuple[dict[str, Any], dict[str, Any]]) -> None:
    panel, target = item
    expr = promql_parser.parse(VARIABLE.sub(lambda m: SAMPLE[m.group(1)], target["expr"]))
    known = RECORDS | AGENT | COMING
    available: set[str] = set()
    selectors: list[promql_parser.VectorSelector] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            selectors.append(node)

    promql_parser.walk(expr, visit)
    assert selectors, panel["title"]
    for selector in selectors:
        assert selector.name in known, f"{selector.name} is neither a fleet record nor an agent series"
        labels = known[selector.name]
        available |= labels
        for matcher in selector.matchers.matchers:
            assert matcher.name in labels, f"{selector.name} has no label {matcher.name}"
        if selector.name in AGENT or selector.name in COMING:
            assert any(m.name == "job" for m in selector.matchers.matchers), selector.name
    legend = target.get("legendFormat", "")
    assert set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)) <= available
