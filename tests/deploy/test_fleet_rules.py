"""The fleet recording rules (group otel-numa-fleet of config/prometheus/otel-numa.rules.yaml) under
promtool's unit tests, config/prometheus/otel-numa.fleet.rules.test.yaml: free capacity per NUMA node and
the largest single-NUMA block per node, for CPUs, memory, hugepages per size and devices per resource."""

from __future__ import annotations

import subprocess

import yaml

from otel_numa.testing.peers import require_binary
from tests.support import REPO

RULES = REPO / "config" / "prometheus" / "otel-numa.rules.yaml"
FLEET_TESTS = REPO / "config" / "prometheus" / "otel-numa.fleet.rules.test.yaml"

# The names a fleet dashboard and an operator's own queries rely on (level:metric:operations).
FLEET_RECORDS = {
    "k8s_node_numa:numa_cpu_free:sum",
    "k8s_node:numa_cpu_free_single_node:max",
    "k8s_node_numa:numa_memory_free_bytes:sum",
    "k8s_node:numa_memory_free_bytes_single_node:max",
    "k8s_node_numa:numa_hugepages_free_bytes:sum",
    "k8s_node:numa_hugepages_free_bytes_single_node:max",
    "k8s_node_numa:numa_device_free:sum",
    "k8s_node:numa_device_free_single_node:max",
}


def fleet_group() -> dict[str, object]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    (group,) = [g for g in groups if g["name"] == "otel-numa-fleet"]
    assert isinstance(group, dict)
    return group


def test_fleet_group_records_exactly_the_named_rules() -> None:
    rules = fleet_group()["rules"]
    assert isinstance(rules, list)
    assert {rule["record"] for rule in rules} == FLEET_RECORDS
    assert not [rule for rule in rules if "alert" in rule]


def test_every_fleet_rule_has_a_promtool_case() -> None:
    cases = yaml.safe_load(FLEET_TESTS.read_text())["tests"]
    tested = {case["expr"] for test in cases for case in test.get("promql_expr_test", [])}
    assert tested >= FLEET_RECORDS


def test_fleet_rules_pass_promtool_unit_tests() -> None:
    completed = subprocess.run(
        [require_binary("promtool"), "test", "rules", str(FLEET_TESTS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
