"""Static checks of the Grafana dashboard config/grafana/dashboards/otel-numa.json.

Every query is parsed as PromQL, its metric names and labels are checked against the agent's documented
series (the table below, the documented metric contract written out by hand), every selector must honour the
node and job variables, and the computed panels (CPU busy, NUMA miss ratio, least local containers) are
evaluated by Prometheus's own rule tester on hand-made series with hand-computed answers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from otel_numa.instruments import catalogue
from tests.support import REPO

DASHBOARD = REPO / "config" / "grafana" / "dashboards" / "otel-numa.json"

# Labels on every series: k8s_node_name (the agent copies it onto each series), job and instance (added by
# the Prometheus scrape).
COMMON_LABELS = frozenset({"k8s_node_name", "job", "instance"})
NUMA = frozenset({"numa_node_id"})
POD = frozenset({"k8s_pod_uid", "k8s_container_name", "k8s_pod_name", "k8s_namespace_name"})

# Prometheus names from the documented metric contract (README), each with the labels it
# carries besides COMMON_LABELS.
METRIC_LABELS: dict[str, frozenset[str]] = {
    "numa_node_count": frozenset(),
    "numa_node_distance": NUMA | {"numa_node_target_id"},
    "numa_cpu_capacity": NUMA,
    "numa_cpu_allocatable": NUMA,
    "numa_cpu_allocated": NUMA,
    "numa_cpu_time_seconds_total": NUMA | {"cpu_mode"},
    "numa_memory_capacity_bytes": NUMA,
    "numa_memory_usage_bytes": NUMA | {"system_memory_state"},
    "numa_memory_allocatable_bytes": NUMA,
    "numa_memory_allocated_bytes": NUMA,
    "numa_hugepages_capacity_bytes": NUMA | {"k8s_hugepage_size"},
    "numa_hugepages_free_bytes": NUMA | {"k8s_hugepage_size"},
    "numa_hugepages_allocatable_bytes": NUMA | {"k8s_hugepage_size"},
    "numa_hugepages_allocated_bytes": NUMA | {"k8s_hugepage_size"},
    "numa_device_capacity": NUMA | {"numa_resource_name"},
    "numa_device_allocated": NUMA | {"numa_resource_name"},
    "numa_memory_page_allocations_total": NUMA | {"numa_numastat_type"},
    "numa_container_cpu_allocated": POD | NUMA,
    "numa_container_memory_allocated_bytes": POD | NUMA,
    "numa_container_hugepages_allocated_bytes": POD | NUMA | {"k8s_hugepage_size"},
    "numa_container_device_allocated": POD | NUMA | {"numa_resource_name"},
    "numa_container_memory_usage_bytes": POD | NUMA | {"numa_memory_type"},
    "numa_container_cpu_time_seconds_total": POD | NUMA,
    "numa_container_memory_locality": POD,
    # the agent's own further series (see README)
    "numa_container_cpuset_nodes": POD
    | {"numa_cpu_node_ids", "numa_memory_node_ids", "numa_locality_node_ids"},
    "numa_container_info": POD,
    "numa_container_aligned": POD,
    "numa_pci_device_count": NUMA | {"pci_device_class", "pci_function_kind"},
    # the kernel's view beside the records
    "numa_cpu_pinned": NUMA,
    "numa_container_allocation_mismatch": POD | {"numa_resource_kind"},
    # pod-level resources: the pod's attributes, no container name
    "numa_pod_cpu_allocated": (POD - {"k8s_container_name"}) | NUMA,
    "numa_pod_memory_allocated_bytes": (POD - {"k8s_container_name"}) | NUMA,
    "numa_agent_source_errors_total": frozenset({"numa_source", "error_type"}),
    "numa_agent_source_age_seconds": frozenset({"numa_source"}),
    "numa_agent_source_duration_seconds": frozenset({"numa_source"}),
    "numa_agent_source_success": frozenset({"numa_source"}),
    "numa_agent_stage_duration_seconds": frozenset({"numa_stage"}),
    "numa_agent_stage_success": frozenset({"numa_stage"}),
    "numa_agent_fast_path": frozenset(),
    "numa_agent_export_failures_total": frozenset({"numa_exporter", "error_type"}),
    "numa_agent_export_duration_seconds": frozenset({"numa_exporter"}),
    "numa_agent_export_age_seconds": frozenset({"numa_exporter"}),
    # the agent's own process, OpenTelemetry's process semantic conventions
    "process_cpu_time_seconds_total": frozenset({"cpu_mode"}),
    "process_memory_usage_bytes": frozenset(),
    "process_open_file_descriptor_count": frozenset(),
    "process_thread_count": frozenset(),
}

# What the dashboard must show at least.
REQUIRED_METRICS = {
    "numa_cpu_capacity",
    "numa_cpu_allocatable",
    "numa_cpu_allocated",
    "numa_cpu_time_seconds_total",
    "numa_memory_capacity_bytes",
    "numa_memory_allocatable_bytes",
    "numa_memory_allocated_bytes",
    "numa_memory_usage_bytes",
    "numa_hugepages_capacity_bytes",
    "numa_hugepages_free_bytes",
    "numa_hugepages_allocatable_bytes",
    "numa_hugepages_allocated_bytes",
    "numa_device_capacity",
    "numa_device_allocated",
    "numa_memory_page_allocations_total",
    "numa_container_cpu_allocated",
    "numa_container_memory_allocated_bytes",
    "numa_container_hugepages_allocated_bytes",
    "numa_container_device_allocated",
    "numa_container_memory_locality",
    "numa_agent_source_errors_total",
    "numa_agent_source_age_seconds",
    "numa_cpu_pinned",
    "numa_container_allocation_mismatch",
}

NODE_SENTINEL = "__node_variable__"
JOB_SENTINEL = "__job_variable__"
VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def substitute(expr: str, values: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in values, f"unknown variable ${name} in {expr}"
        return values[name]

    return VARIABLE.sub(replace, expr)


PARSE_VALUES = {
    "node": NODE_SENTINEL,
    "job": JOB_SENTINEL,
    "hugepage_size": ".+",
    "resource": ".+",
    "__rate_interval": "5m",
}


def load_dashboard() -> dict[str, Any]:
    document = json.loads(DASHBOARD.read_text())
    assert isinstance(document, dict)
    return document


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", []))


def iter_targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in iter_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel, target


DASHBOARD_DOC = load_dashboard()
TARGETS = list(iter_targets(DASHBOARD_DOC))


def target_id(item: tuple[dict[str, Any], dict[str, Any]]) -> str:
    panel, target = item
    return f"{panel['title']}/{target['refId']}"


def selectors(expr: promql_parser.Expr) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(expr, visit)
    return found


def grouping_labels(expr: promql_parser.Expr) -> set[str]:
    """Labels named in by/without and on/ignoring clauses."""
    labels: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            labels.update(node.modifier.labels)
        matching = (
            node.modifier.matching if isinstance(node, promql_parser.BinaryExpr) and node.modifier else None
        )
        if matching is not None:
            labels.update(matching.labels)

    promql_parser.walk(expr, visit)
    return labels


def parsed(target: dict[str, Any]) -> promql_parser.Expr:
    return promql_parser.parse(substitute(target["expr"], PARSE_VALUES))


def panel_expr(title: str, values: dict[str, str], ref_id: str | None = None) -> str:
    exprs = [t["expr"] for p, t in TARGETS if p["title"] == title and ref_id in (None, t["refId"])]
    assert len(exprs) == 1, f"expected one query in panel {title!r}"
    return substitute(exprs[0], values)


# ---------------------------------------------------------------- structure


def test_dashboard_is_current_and_provisionable() -> None:
    assert DASHBOARD_DOC["schemaVersion"] >= 39
    assert DASHBOARD_DOC["uid"] == "otel-numa"
    assert DASHBOARD_DOC.get("id") is None, "a provisioned dashboard must not carry a database id"


def test_datasource_is_chosen_by_variable() -> None:
    variables = {v["name"]: v for v in DASHBOARD_DOC["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    reference = {"type": "prometheus", "uid": "${datasource}"}
    for panel in iter_panels(DASHBOARD_DOC["panels"]):
        if panel["type"] != "row":
            assert panel["datasource"] == reference, panel["title"]
    for panel, target in TARGETS:
        assert target["datasource"] == reference, target_id((panel, target))
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == reference, variable["name"]


def test_node_variable_lists_the_agents_nodes() -> None:
    variables = {v["name"]: v for v in DASHBOARD_DOC["templating"]["list"]}
    node = variables["node"]
    query = node["query"]["query"] if isinstance(node["query"], dict) else node["query"]
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
    assert match, query
    selector = promql_parser.parse(substitute(match.group(1), PARSE_VALUES))
    assert isinstance(selector, promql_parser.VectorSelector) and selector.name == "numa_node_count"
    assert match.group(2) == "k8s_node_name"
    assert node["multi"] and node["includeAll"]


def test_every_variable_used_is_defined() -> None:
    defined = {v["name"] for v in DASHBOARD_DOC["templating"]["list"]} | {"__rate_interval"}
    text = DASHBOARD_DOC["panels"].__repr__() + json.dumps(DASHBOARD_DOC["templating"])
    used = {m.group(1) or m.group(2) for m in VARIABLE.finditer(text)}
    assert used <= defined, used - defined
    for panel in iter_panels(DASHBOARD_DOC["panels"]):
        if "repeat" in panel:
            assert panel["repeat"] in defined


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    panels = list(iter_panels(DASHBOARD_DOC["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells.get((x, y))}"
                cells[(x, y)] = panel["title"]


# ---------------------------------------------------------------- queries


@pytest.mark.parametrize("item", TARGETS, ids=target_id)
def test_query_parses(item: tuple[dict[str, Any], dict[str, Any]]) -> None:
    parsed(item[1])


def test_parser_rejects_a_broken_query() -> None:
    unclosed = 'sum by (numa_node_id (numa_cpu_capacity{k8s_node_name=~"$node"})'
    with pytest.raises(ValueError):
        promql_parser.parse(substitute(unclosed, PARSE_VALUES))


@pytest.mark.parametrize("item", TARGETS, ids=target_id)
def test_query_uses_documented_metrics_and_labels(item: tuple[dict[str, Any], dict[str, Any]]) -> None:
    expr = parsed(item[1])
    available: set[str] = set(COMMON_LABELS)
    for selector in selectors(expr):
        assert selector.name in METRIC_LABELS, f"{selector.name} is not one of the agent's series"
        labels = COMMON_LABELS | METRIC_LABELS[selector.name]
        available |= labels
        for matcher in selector.matchers.matchers:
            assert matcher.name in labels, f"{selector.name} has no label {matcher.name}"
    assert grouping_labels(expr) <= available, grouping_labels(expr) - available
    legend = item[1].get("legendFormat", "")
    assert set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)) <= available, legend


@pytest.mark.parametrize("item", TARGETS, ids=target_id)
def test_every_selector_is_filtered_by_node_and_job(item: tuple[dict[str, Any], dict[str, Any]]) -> None:
    for selector in selectors(parsed(item[1])):
        matchers = [(m.name, m.op == promql_parser.MatchOp.Re, m.value) for m in selector.matchers.matchers]
        assert ("k8s_node_name", True, NODE_SENTINEL) in matchers, selector.name
        assert ("job", True, JOB_SENTINEL) in matchers, selector.name


def test_dashboard_covers_the_required_series() -> None:
    used = {s.name for _, t in TARGETS for s in selectors(parsed(t))}
    assert used >= REQUIRED_METRICS, REQUIRED_METRICS - used


# Catalogue metrics with no panel, each for a reason an operator would accept.
LEFT_OUT = {
    "numa_container_info": "an info series (opt-in runtime enrichment) for the operator's own joins",
    "numainfo_node_count": "numainfo_exporter's series (--compat numainfo): for its old dashboards",
    "numainfo_core_count": "numainfo_exporter's series (--compat numainfo): for its old dashboards",
    "numainfo_version": "numainfo_exporter's series (--compat numainfo): for its old dashboards",
}


def test_every_catalogue_metric_has_a_panel_or_a_reason() -> None:
    used = {s.name for _, t in TARGETS for s in selectors(parsed(t))}
    names = {spec.prometheus_name for spec in catalogue.METRICS}
    missing = names - used - set(LEFT_OUT)
    assert not missing, f"no panel shows {sorted(missing)}: add one, or a reason to LEFT_OUT"
    assert not set(LEFT_OUT) & used, "a metric left out has a panel after all: drop it from LEFT_OUT"
    assert set(LEFT_OUT) <= names, "LEFT_OUT names a metric the agent does not export"


def test_dashboard_has_an_agent_cost_row() -> None:
    panels = list(iter_panels(DASHBOARD_DOC["panels"]))
    (row,) = [p for p in panels if p["type"] == "row" and p["title"] == "Agent cost"]
    below = [p for p in panels if p["gridPos"]["y"] == row["gridPos"]["y"] + 1]
    shown = {s.name for p in below for t in p["targets"] for s in selectors(parsed(t))}
    assert shown == {
        "process_cpu_time_seconds_total",
        "process_memory_usage_bytes",
        "process_open_file_descriptor_count",
        "process_thread_count",
    }


def test_device_variable_has_values_without_podresources() -> None:
    """numa_device_capacity comes only from podresources; the device checkpoint gives
    numa_device_allocated, so the variable takes its values from both."""
    variables = {v["name"]: v for v in DASHBOARD_DOC["templating"]["list"]}
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variables["resource"]["query"])
    assert match and match.group(2) == "numa_resource_name"
    selector = promql_parser.parse(substitute(match.group(1), PARSE_VALUES))
    assert isinstance(selector, promql_parser.VectorSelector)
    (name,) = [m for m in selector.matchers.matchers if m.name == "__name__"]
    for metric in ("numa_device_allocated", "numa_device_capacity"):
        assert re.fullmatch(name.value, metric), metric


def test_catalogue_follows_design_naming() -> None:
    # A guard on the hand-written catalogue itself: Prometheus names of counters end in _total and
    # byte-valued series in _bytes, as the OTel Prometheus exporter renders units.
    for name in METRIC_LABELS:
        assert re.fullmatch(r"(numa|process)_[a-z_]+", name)
    assert {n for n in METRIC_LABELS if n.endswith("_total")} == {
        "numa_cpu_time_seconds_total",
        "numa_memory_page_allocations_total",
        "numa_container_cpu_time_seconds_total",
        "numa_agent_source_errors_total",
        "numa_agent_export_failures_total",
        "process_cpu_time_seconds_total",
    }


def test_the_metric_catalogue_agrees_with_the_design_table() -> None:
    """The catalogue (which registers the instruments) names the same series with the same labels as the
    table above, written by hand from the contract; the catalogue may add only the agent's own health series
    and numainfo_exporter's."""
    specs = {spec.prometheus_name: spec for spec in catalogue.METRICS}
    for name, labels in METRIC_LABELS.items():
        assert name in specs, f"{name} is not in the catalogue"
        exported = {a.replace(".", "_") for a in specs[name].attributes if not a.endswith("*")}
        assert exported == labels, name
    extra = set(specs) - set(METRIC_LABELS)
    assert all(name.startswith(("numa_agent_", "numainfo_")) for name in extra), extra


# ---------------------------------------------------------------- evaluation by Prometheus


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    return path


EVAL_VALUES = {
    "node": "worker-1|worker-2",
    "job": "otel-numa",
    "hugepage_size": ".+",
    "resource": ".+",
    "__rate_interval": "5m",
}


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    all_labels = {"job": "otel-numa", "instance": "10.0.0.1:9464"} | labels
    rendered = ",".join(f'{key}="{value}"' for key, value in all_labels.items())
    return {"series": f"{name}{{{rendered}}}", "values": values}


def expected(value: float, **labels: str) -> dict[str, Any]:
    all_labels = {"job": "otel-numa", "instance": "10.0.0.1:9464"} | labels
    rendered = ",".join(f'{key}="{label}"' for key, label in all_labels.items())
    return {"labels": f"{{{rendered}}}", "value": value}


def run_rule_test(tmp_path: Path, input_series: list[dict[str, str]], checks: list[dict[str, Any]]) -> None:
    test_file = tmp_path / "dashboard_test.yaml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "rule_files": [],
                "evaluation_interval": "1m",
                "tests": [{"interval": "1m", "input_series": input_series, "promql_expr_test": checks}],
            }
        )
    )
    result = subprocess.run(
        [promtool(), "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_cpu_busy_is_the_non_idle_share_per_numa_node(tmp_path: Path) -> None:
    # Per minute: NUMA 0 idles 45 s of 60 (25 % busy); NUMA 1 idles 15 s of 60 (75 % busy).
    cpu = "numa_cpu_time_seconds_total"
    node = {"k8s_node_name": "worker-1"}
    run_rule_test(
        tmp_path,
        [
            series(cpu, "0+45x20", **node, numa_node_id="0", cpu_mode="idle"),
            series(cpu, "0+10x20", **node, numa_node_id="0", cpu_mode="user"),
            series(cpu, "0+5x20", **node, numa_node_id="0", cpu_mode="system"),
            series(cpu, "0+15x20", **node, numa_node_id="1", cpu_mode="idle"),
            series(cpu, "0+40x20", **node, numa_node_id="1", cpu_mode="user"),
            series(cpu, "0+5x20", **node, numa_node_id="1", cpu_mode="iowait"),
            # Another machine, outside the selected nodes: must not appear.
            series(cpu, "0+60x20", k8s_node_name="other", numa_node_id="0", cpu_mode="idle"),
        ],
        [
            {
                "expr": panel_expr("CPU busy per NUMA node", EVAL_VALUES),
                "eval_time": "10m",
                "exp_samples": [
                    expected(0.25, **node, numa_node_id="0"),
                    expected(0.75, **node, numa_node_id="1"),
                ],
            }
        ],
    )


def test_numa_miss_ratio_is_miss_over_hit_plus_miss(tmp_path: Path) -> None:
    # Per minute on NUMA 0: 90 hits and 30 misses, so 30 / 120 = 0.25. Other numastat types are ignored.
    pages = "numa_memory_page_allocations_total"
    node = {"k8s_node_name": "worker-2", "numa_node_id": "0"}
    run_rule_test(
        tmp_path,
        [
            series(pages, "0+90x20", **node, numa_numastat_type="hit"),
            series(pages, "0+30x20", **node, numa_numastat_type="miss"),
            series(pages, "0+500x20", **node, numa_numastat_type="local"),
            series(pages, "0+7x20", **node, numa_numastat_type="foreign"),
            series(pages, "0+30x20", k8s_node_name="other", numa_node_id="0", numa_numastat_type="miss"),
            series(pages, "0+30x20", k8s_node_name="other", numa_node_id="0", numa_numastat_type="hit"),
        ],
        [
            {
                "expr": panel_expr("NUMA miss ratio", EVAL_VALUES),
                "eval_time": "10m",
                "exp_samples": [expected(0.25, **node)],
            }
        ],
    )


def test_least_local_containers_are_the_ten_lowest(tmp_path: Path) -> None:
    # Twelve containers with locality 0.05, 0.10, ..., 0.60; the table shows the ten lowest.
    locality = "numa_container_memory_locality"
    containers = [
        {
            "k8s_node_name": "worker-1",
            "k8s_namespace_name": "batch",
            "k8s_pod_name": f"job-{index}",
            "k8s_pod_uid": f"uid-{index}",
            "k8s_container_name": "main",
        }
        for index in range(1, 13)
    ]
    inputs = [
        series(locality, f"{index * 0.05:.2f}x20", **labels) for index, labels in enumerate(containers, 1)
    ]
    inputs.append(
        series(
            locality,
            "0x20",
            k8s_node_name="other",
            k8s_namespace_name="batch",
            k8s_pod_name="elsewhere",
            k8s_pod_uid="uid-x",
            k8s_container_name="main",
        )
    )
    lowest = [
        {
            "labels": label_set(labels),
            "value": round(index * 0.05, 2),
        }
        for index, labels in enumerate(containers[:10], 1)
    ]
    run_rule_test(
        tmp_path,
        inputs,
        [
            {
                "expr": panel_expr("Least local containers", EVAL_VALUES),
                "eval_time": "10m",
                "exp_samples": lowest,
            }
        ],
    )


def test_rule_tester_catches_a_wrong_expectation(tmp_path: Path) -> None:
    cpu = "numa_cpu_time_seconds_total"
    node = {"k8s_node_name": "worker-1", "numa_node_id": "0"}
    with pytest.raises(AssertionError):
        run_rule_test(
            tmp_path,
            [
                series(cpu, "0+30x20", **node, cpu_mode="idle"),
                series(cpu, "0+30x20", **node, cpu_mode="user"),
            ],
            [
                {
                    "expr": panel_expr("CPU busy per NUMA node", EVAL_VALUES),
                    "eval_time": "10m",
                    "exp_samples": [expected(0.25, **node)],
                }
            ],
        )


def label_set(labels: dict[str, str]) -> str:
    """Labels as promtool's expected samples write them (no job or instance: the panels aggregate them)."""
    return "{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}"


def container(pod: str, name: str, node: str = "worker-1") -> dict[str, str]:
    return {
        "k8s_node_name": node,
        "k8s_namespace_name": "db",
        "k8s_pod_name": pod,
        "k8s_pod_uid": f"uid-{pod}",
        "k8s_container_name": name,
    }


def test_alignment_panels_list_and_count_the_containers_that_span_nodes(tmp_path: Path) -> None:
    # Three containers on the selected nodes, one aligned and two spanning NUMA nodes; another machine's
    # container that spans nodes is left out.
    aligned = "numa_container_aligned"
    spanning = [container("postgres-0", "postgres"), container("trainer-0", "train", node="worker-2")]
    run_rule_test(
        tmp_path,
        [
            series(aligned, "1x20", **container("matcher-0", "engine")),
            *(series(aligned, "0x20", **labels) for labels in spanning),
            series(aligned, "0x20", **container("elsewhere-0", "main", node="other")),
        ],
        [
            {
                "expr": panel_expr("Containers not aligned", EVAL_VALUES),
                "eval_time": "10m",
                "exp_samples": [{"labels": label_set(labels), "value": 0} for labels in spanning],
            },
            {
                "expr": panel_expr("Container alignment", EVAL_VALUES, "A"),
                "eval_time": "10m",
                "exp_samples": [{"labels": "{}", "value": 1}],
            },
            {
                "expr": panel_expr("Container alignment", EVAL_VALUES, "B"),
                "eval_time": "10m",
                "exp_samples": [{"labels": "{}", "value": 2}],
            },
        ],
    )


def test_alignment_count_is_zero_when_every_container_is_aligned(tmp_path: Path) -> None:
    # "Not aligned" shows 0, not "no data", and the list is empty.
    aligned = "numa_container_aligned"
    run_rule_test(
        tmp_path,
        [series(aligned, "1x20", **container("matcher-0", "engine"))],
        [
            {
                "expr": panel_expr("Containers not aligned", EVAL_VALUES),
                "eval_time": "10m",
                "exp_samples": [],
            },
            {
                "expr": panel_expr("Container alignment", EVAL_VALUES, "B"),
                "eval_time": "10m",
                "exp_samples": [{"labels": "{}", "value": 0}],
            },
        ],
    )


def test_pci_panel_counts_functions_per_class_and_the_virtual_ones(tmp_path: Path) -> None:
    # NUMA 1 of worker-1: a NIC's physical function and its 2 VFs (3 network functions, 2 virtual) and
    # a GPU; another machine's NIC is left out.
    pci = "numa_pci_device_count"
    node = {"k8s_node_name": "worker-1", "numa_node_id": "1"}
    run_rule_test(
        tmp_path,
        [
            series(pci, "1x20", **node, pci_device_class="network", pci_function_kind="physical"),
            series(pci, "2x20", **node, pci_device_class="network", pci_function_kind="virtual"),
            series(pci, "1x20", **node, pci_device_class="display", pci_function_kind="physical"),
            series(
                pci,
                "4x20",
                k8s_node_name="other",
                numa_node_id="0",
                pci_device_class="network",
                pci_function_kind="physical",
            ),
        ],
        [
            {
                "expr": panel_expr("PCI devices per NUMA node", EVAL_VALUES, "A"),
                "eval_time": "10m",
                "exp_samples": [
                    {
                        "labels": '{k8s_node_name="worker-1",numa_node_id="1",pci_device_class="network"}',
                        "value": 3,
                    },
                    {
                        "labels": '{k8s_node_name="worker-1",numa_node_id="1",pci_device_class="display"}',
                        "value": 1,
                    },
                ],
            },
            {
                "expr": panel_expr("PCI devices per NUMA node", EVAL_VALUES, "B"),
                "eval_time": "10m",
                "exp_samples": [
                    {
                        "labels": '{k8s_node_name="worker-1",numa_node_id="1",pci_device_class="network"}',
                        "value": 2,
                    },
                ],
            },
        ],
    )


def test_pod_level_table_sums_per_pod_and_numa_node(tmp_path: Path) -> None:
    # One pod-level pool of 2 CPUs and 1 GiB on NUMA 0; another machine's pod is left out.
    pod = {"k8s_node_name": "worker-1", "k8s_namespace_name": "db", "k8s_pod_name": "postgres-0",
           "k8s_pod_uid": "uid-postgres-0", "numa_node_id": "0"}  # fmt: skip
    elsewhere = {**pod, "k8s_node_name": "other"}
    run_rule_test(
        tmp_path,
        [
            series("numa_pod_cpu_allocated", "2x20", **pod),
            series("numa_pod_cpu_allocated", "4x20", **elsewhere),
            series("numa_pod_memory_allocated_bytes", "1073741824x20", **pod),
        ],
        [
            {
                "expr": panel_expr("Exclusive resources per pod and NUMA node", EVAL_VALUES, "A"),
                "eval_time": "10m",
                "exp_samples": [{"labels": label_set(pod), "value": 2}],
            },
            {
                "expr": panel_expr("Exclusive resources per pod and NUMA node", EVAL_VALUES, "B"),
                "eval_time": "10m",
                "exp_samples": [
                    {
                        "labels": label_set(pod),
                        "value": 1073741824,
                    }
                ],
            },
        ],
    )


def test_records_vs_kernel_row_shows_allocated_beside_pinned_and_the_disagreements(tmp_path: Path) -> None:
    # worker-1 NUMA 0: 4 CPUs recorded, none pinned (db's cpuset was widened); NUMA 1: 2 and 2. db disagrees
    # on cpu and memory, cache agrees on both; another machine's disagreement is left out.
    mismatch = "numa_container_allocation_mismatch"
    db, cache = container("db-0", "db"), container("cache-0", "cache")
    run_rule_test(
        tmp_path,
        [
            series("numa_cpu_allocated", "4x20", k8s_node_name="worker-1", numa_node_id="0"),
            series("numa_cpu_allocated", "2x20", k8s_node_name="worker-1", numa_node_id="1"),
            series("numa_cpu_pinned", "0x20", k8s_node_name="worker-1", numa_node_id="0"),
            series("numa_cpu_pinned", "2x20", k8s_node_name="worker-1", numa_node_id="1"),
            *(series(mismatch, "1x20", **db, numa_resource_kind=kind) for kind in ("cpu", "memory")),
            *(series(mismatch, "0x20", **cache, numa_resource_kind=kind) for kind in ("cpu", "memory")),
            series(
                mismatch, "1x20", **container("elsewhere-0", "main", node="other"), numa_resource_kind="cpu"
            ),
        ],
        [
            {
                "expr": panel_expr(
                    "CPUs per NUMA node: allocated (records) and pinned (kernel)", EVAL_VALUES, "B"
                ),
                "eval_time": "10m",
                "exp_samples": [
                    {
                        "labels": label_set(
                            {
                                "__name__": "numa_cpu_pinned",
                                "job": "otel-numa",
                                "instance": "10.0.0.1:9464",
                                "k8s_node_name": "worker-1",
                                "numa_node_id": str(numa),
                            }
                        ),
                        "value": pinned,
                    }
                    for numa, pinned in ((0, 0), (1, 2))
                ],
            },
            {
                "expr": panel_expr("Containers: records against cgroups", EVAL_VALUES),
                "eval_time": "10m",
                "exp_samples": [
                    {"labels": label_set({**labels, "numa_resource_kind": kind}), "value": value}
                    for labels, value in ((db, 1), (cache, 0))
                    for kind in ("cpu", "memory")
                ],
            },
            {
                "expr": panel_expr("Records against the kernel", EVAL_VALUES, "A"),
                "eval_time": "10m",
                "exp_samples": [{"labels": "{}", "value": 2}],
            },
            {
                "expr": panel_expr("Records against the kernel", EVAL_VALUES, "B"),
                "eval_time": "10m",
                "exp_samples": [{"labels": "{}", "value": 2}],
            },
        ],
    )
