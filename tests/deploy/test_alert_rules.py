"""The alert rules in config/prometheus/otel-numa.rules.yaml, checked with Prometheus's own promtool.

`promtool check rules` validates the file; `promtool test rules` runs the unit tests in
config/prometheus/otel-numa.rules.test.yaml, where every alert fires from synthetic series in one case and
stays silent in another, with its exact labels and rendered annotations. Every rule follows the mixins'
conventions (`rule_problems`): an alert has a severity, a summary, a description and a runbook_url that is
a section of docs/troubleshooting.md; a recording rule is named level:metric:operations; a threshold the
chart may set is a number followed by `# parameter NAME`. The expressions are parsed with promql_parser:
every series they read must be one the agent exports (otel_numa.instruments.catalogue), a recording rule of
the file, or one of the few Prometheus/kube-state-metrics series used on purpose, and every label they match
or group by must exist on those series.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from otel_numa.instruments import catalogue
from otel_numa.testing.peers import require_binary
from tests.support import REPO

RULES = REPO / "config" / "prometheus" / "otel-numa.rules.yaml"
RULE_TESTS = REPO / "config" / "prometheus" / "otel-numa.rules.test.yaml"
TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"

# Labels every scraped series of the agent has: k8s_node_name (on the page itself) and the scrape's
# job/instance.
SCRAPE_LABELS = frozenset({"job", "instance", "k8s_node_name"})

# Series from elsewhere that the rules use on purpose, with the labels they carry.
EXTERNAL_SERIES: dict[str, frozenset[str]] = {
    "up": SCRAPE_LABELS,
    "kube_pod_status_ready": frozenset({"job", "instance", "namespace", "pod", "uid", "condition"}),
    "kube_pod_info": frozenset(
        {"job", "instance", "namespace", "pod", "uid", "node", "created_by_kind", "created_by_name"}
    ),
}

SEVERITIES = {"critical", "warning", "info"}
CONTAINER_LABELS = ("k8s_namespace_name", "k8s_pod_name", "k8s_container_name")


def agent_series_labels() -> dict[str, frozenset[str]]:
    """Prometheus name -> labels, from the agent's metric catalogue."""
    return {
        spec.prometheus_name: SCRAPE_LABELS | {attribute.replace(".", "_") for attribute in spec.attributes}
        for spec in catalogue.METRICS
    }


AGENT_SERIES = agent_series_labels()


def load_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


RULES_IN_FILE = load_rules()
ALERTS = [rule for rule in RULES_IN_FILE if "alert" in rule]
ALERT_NAMES = [rule["alert"] for rule in ALERTS]
RECORDS = {rule["record"] for rule in RULES_IN_FILE if "record" in rule}

# The mixins' conventions (kubernetes-mixin, node-mixin), which the chart's per-rule overrides rely on.
ALERT_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
RECORD_KEYS = {"record", "expr", "labels"}
ANNOTATIONS = {"summary", "description", "runbook_url"}
RUNBOOK = "docs/troubleshooting.md#"
# level:metric:operations (https://prometheus.io/docs/practices/rules/)
RECORD_NAME = re.compile(r"[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*")
# a threshold the chart sets: `300  # parameter sourceStaleSeconds`
PARAMETER = re.compile(r"(\S+)[ \t]*#[ \t]*parameter[ \t]+(\S+)[ \t]*$", re.MULTILINE)
NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")


def markdown_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE):
        anchors.add(re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def rule_name(rule: dict[str, Any]) -> str:
    return str(rule.get("alert") or rule.get("record"))


def parameters(expr: str) -> list[tuple[str, str]]:
    """(default, name) of every threshold the chart may set in an expression."""
    return [(match.group(1), match.group(2)) for match in PARAMETER.finditer(expr)]


def rule_problems(rule: dict[str, Any], anchors: set[str]) -> list[str]:
    """What a rule lacks of the conventions (empty: none)."""
    name = rule_name(rule)
    problems = []
    for default, parameter in parameters(str(rule.get("expr", ""))):
        if not NUMBER.fullmatch(default):
            problems.append(f"{name}: `# parameter {parameter}` follows {default!r}, not a number")
        if not re.fullmatch(r"[a-z][A-Za-z0-9]*", parameter):
            problems.append(f"{name}: parameter {parameter} is not a camelCase name")
    if "record" in rule:
        if set(rule) - RECORD_KEYS:
            problems.append(f"{name}: a recording rule has only {sorted(RECORD_KEYS)}")
        if not RECORD_NAME.fullmatch(name):
            problems.append(f"{name}: a recording rule is named level:metric:operations")
        return problems
    if set(rule) - ALERT_KEYS:
        problems.append(f"{name}: unknown keys {sorted(set(rule) - ALERT_KEYS)}")
    if not name.startswith("OtelNuma"):
        problems.append(f"{name}: alert names start with OtelNuma")
    if rule.get("labels", {}).get("severity") not in SEVERITIES:
        problems.append(f"{name}: labels.severity is one of {sorted(SEVERITIES)}")
    annotations = rule.get("annotations", {})
    for key in sorted(ANNOTATIONS - set(annotations)):
        problems.append(f"{name}: no annotations.{key}")
    runbook = str(annotations.get("runbook_url", ""))
    if "runbook_url" in annotations and runbook != RUNBOOK + name.lower():
        problems.append(f"{name}: runbook_url is {RUNBOOK}{name.lower()}, not {runbook}")
    if "runbook_url" in annotations and name.lower() not in anchors:
        problems.append(f"{name}: docs/troubleshooting.md has no section `### {name}`")
    return problems


class NamedSelector:
    """A vector selector of the expression, with its metric name."""

    def __init__(self, selector: promql_parser.VectorSelector) -> None:
        assert selector.name, "every selector must name its series"
        self.name: str = selector.name
        self.matchers = selector.matchers


def selectors(expr: str) -> list[NamedSelector]:
    found: list[NamedSelector] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(NamedSelector(node))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def grouping_labels(expr: str) -> set[str]:
    labels: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            labels.update(node.modifier.labels)
        if isinstance(node, promql_parser.BinaryExpr) and node.modifier and node.modifier.matching:
            labels.update(node.modifier.matching.labels)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return labels


def series_labels(name: str) -> frozenset[str]:
    return AGENT_SERIES.get(name) or EXTERNAL_SERIES[name]


def is_recorded(name: str) -> bool:
    return name in RECORDS


def uses_agent_series(rule: dict[str, Any]) -> bool:
    return any(selector.name in AGENT_SERIES for selector in selectors(rule["expr"]))


def annotation_labels(rule: dict[str, Any]) -> set[str]:
    text = rule["annotations"]["summary"] + rule["annotations"]["description"]
    return set(re.findall(r"\$labels\.(\w+)", text))


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


# ---------------------------------------------------------------- promtool


def test_promtool_check_rules_accepts_the_file() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(RULES_IN_FILE)} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_catch_a_wrong_expectation(tmp_path: Path) -> None:
    # The harness can fail: expecting silence where the agent-down alert fires is reported.
    tests = yaml.safe_load(RULE_TESTS.read_text())
    firing = next(
        case
        for test in tests["tests"]
        for case in test["alert_rule_test"]
        if case["alertname"] == "OtelNumaAgentDown" and case["exp_alerts"]
    )
    firing["exp_alerts"] = []
    tests["rule_files"] = [str(RULES)]
    broken = tmp_path / "broken.test.yaml"
    broken.write_text(yaml.safe_dump(tests))
    result = promtool("test", "rules", str(broken))
    assert result.returncode != 0
    assert "OtelNumaAgentDown" in result.stdout + result.stderr


def unit_cases() -> list[dict[str, Any]]:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    return [case for test in tests["tests"] for case in test["alert_rule_test"]]


@pytest.mark.parametrize("alert", ALERT_NAMES)
def test_every_alert_has_a_firing_and_a_silent_case(alert: str) -> None:
    cases = [case for case in unit_cases() if case["alertname"] == alert]
    assert any(case["exp_alerts"] for case in cases), f"{alert}: no case fires it"
    assert any(not case["exp_alerts"] for case in cases), f"{alert}: no case where it stays silent"
    for case in cases:
        for expected in case["exp_alerts"]:
            assert set(expected["exp_annotations"]) == ANNOTATIONS, alert


# ---------------------------------------------------------------- conventions of every rule


@pytest.mark.parametrize("rule", RULES_IN_FILE, ids=rule_name)
def test_rule_follows_the_conventions(rule: dict[str, Any]) -> None:
    assert rule_problems(rule, markdown_anchors(TROUBLESHOOTING.read_text())) == []


def test_convention_check_names_what_a_rule_lacks() -> None:
    anchors = markdown_anchors(TROUBLESHOOTING.read_text())
    alert = ALERTS[0]
    bare = dict(alert, labels={}, annotations={"summary": "x"})
    assert rule_problems(bare, anchors) == [
        f"{alert['alert']}: labels.severity is one of ['critical', 'info', 'warning']",
        f"{alert['alert']}: no annotations.description",
        f"{alert['alert']}: no annotations.runbook_url",
    ]
    elsewhere = dict(alert, alert="OtelNumaNowhere")
    elsewhere["annotations"] = dict(alert["annotations"], runbook_url=RUNBOOK + "otelnumanowhere")
    assert rule_problems(elsewhere, anchors) == [
        "OtelNumaNowhere: docs/troubleshooting.md has no section `### OtelNumaNowhere`"
    ]
    record = {"record": "free_cpus", "expr": "numa_cpu_allocatable > 0.5  # parameter Free-Share"}
    assert rule_problems(record, anchors) == [
        "free_cpus: parameter Free-Share is not a camelCase name",
        "free_cpus: a recording rule is named level:metric:operations",
    ]


def test_parameters_are_found_in_the_file() -> None:
    found = {name: default for rule in RULES_IN_FILE for default, name in parameters(str(rule["expr"]))}
    assert found["sourceStaleSeconds"] == "300"
    assert found["agentMemoryLimitBytes"] == str(128 * 2**20)


# ---------------------------------------------------------------- content of each alert


def test_alert_names_are_unique() -> None:
    assert len(ALERT_NAMES) == len(set(ALERT_NAMES))
    assert all(name.startswith("OtelNuma") for name in ALERT_NAMES)


@pytest.mark.parametrize("rule", ALERTS, ids=ALERT_NAMES)
def test_alert_has_for_severity_summary_and_description(rule: dict[str, Any]) -> None:
    assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
    assert rule["labels"]["severity"] in SEVERITIES
    assert rule["annotations"]["summary"].strip()
    assert len(rule["annotations"]["description"]) > len(rule["annotations"]["summary"])


@pytest.mark.parametrize("rule", ALERTS, ids=ALERT_NAMES)
def test_alert_names_node_numa_node_and_container_where_relevant(rule: dict[str, Any]) -> None:
    named = annotation_labels(rule)
    result_labels = [series_labels(s.name) for s in selectors(rule["expr"]) if not is_recorded(s.name)]
    if rule["expr"].startswith("absent("):
        return  # no series, no node to name
    assert "k8s_node_name" in named, f"{rule['alert']} does not name the node"
    if all("numa_node_id" in labels for labels in result_labels):
        assert "numa_node_id" in named, f"{rule['alert']} does not name the NUMA node"
    if all("k8s_container_name" in labels for labels in result_labels):
        assert set(CONTAINER_LABELS) <= named, f"{rule['alert']} does not name the container"
    summary_and_description = [rule["annotations"]["summary"], rule["annotations"]["description"]]
    for text in summary_and_description:
        assert "k8s_node_name" in text, f"{rule['alert']}: both texts name the node"


@pytest.mark.parametrize("rule", ALERTS, ids=ALERT_NAMES)
def test_alert_reads_only_known_series_and_labels(rule: dict[str, Any]) -> None:
    names = catalogue.prometheus_names()
    available: set[str] = set()
    for selector in selectors(rule["expr"]):
        if is_recorded(selector.name):
            return  # a recording rule's labels are its expression's: promtool's unit tests check those
        assert selector.name in names or selector.name in EXTERNAL_SERIES, (
            f"{rule['alert']}: {selector.name} is not exported by the agent"
        )
        labels = series_labels(selector.name)
        available |= labels
        for matcher in selector.matchers.matchers:
            assert matcher.name in labels, f"{rule['alert']}: {selector.name} has no label {matcher.name}"
    assert grouping_labels(rule["expr"]) <= available, rule["alert"]
    # label_replace adds k8s_node_name from kube-state's node label
    assert annotation_labels(rule) <= available | {"k8s_node_name"}, rule["alert"]


def test_every_agent_metric_named_by_the_issue_is_alerted_on() -> None:
    used = {s.name for rule in ALERTS for s in selectors(rule["expr"])}
    assert {
        "up",
        "numa_agent_source_errors_total",
        "numa_agent_source_age_seconds",
        "numa_cpu_allocated",
        "numa_cpu_allocatable",
        "numa_memory_allocated_bytes",
        "numa_memory_allocatable_bytes",
        "numa_hugepages_allocated_bytes",
        "numa_hugepages_allocatable_bytes",
        "numa_device_allocated",
        "numa_device_capacity",
        "numa_container_memory_locality",
        "process_memory_usage_bytes",
    } <= used


def test_alert_checks_fail_on_an_unknown_series() -> None:
    # The name check is not vacuous: a misspelt series is caught.
    broken = dict(ALERTS[0], expr="numa_cpu_alocated > numa_cpu_allocatable")
    with pytest.raises(AssertionError, match="numa_cpu_alocated"):
        test_alert_reads_only_known_series_and_labels(broken)


def memory_limit_bytes(quantity: str) -> int:
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}
    return int(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity)


def test_memory_alert_divides_by_the_kustomize_limit() -> None:
    """The file's limit is the kustomize DaemonSet's (the chart writes its own: test_helm_chart)."""
    (rule,) = [rule for rule in ALERTS if rule["alert"] == "OtelNumaAgentMemoryNearLimit"]
    assert re.search(r"process_memory_usage_bytes / \d+  # parameter agentMemoryLimitBytes", rule["expr"])
    limit = dict((name, value) for value, name in parameters(rule["expr"]))["agentMemoryLimitBytes"]
    daemonset = yaml.safe_load((REPO / "config" / "kubernetes" / "daemonset.yaml").read_text())
    limits = {
        memory_limit_bytes(container["resources"]["limits"]["memory"])
        for container in daemonset["spec"]["template"]["spec"]["containers"]
    }
    assert limits == {int(limit)}


def test_readme_alert_examples_are_the_shipped_rules() -> None:
    """An alert the README shows as YAML (if any) is the shipped rule (name, expression, for, labels,
    summary), and its table names every shipped alert with its for."""
    readme = (REPO / "README.md").read_text()
    shipped = {rule["alert"]: rule for rule in ALERTS}
    examples = [
        rule
        for block in re.findall(r"```yaml\n(.*?)```", readme, re.DOTALL)
        if "- alert:" in block
        for rule in yaml.safe_load(block)
    ]
    for example in examples:
        rule = shipped.get(example["alert"])
        assert rule is not None, f"README shows {example['alert']}, which is not shipped"
        for key in ("expr", "for", "labels"):
            assert str(example.get(key)).strip() == str(rule.get(key)).strip(), (example["alert"], key)
        for key, text in example.get("annotations", {}).items():
            assert text == rule["annotations"][key], (example["alert"], key)
    rows = re.findall(r"^\| (`OtelNuma.*?) \| .* \| (\w+) \|$", readme, re.MULTILINE)
    in_table = {
        name if name.startswith("OtelNuma") else "OtelNuma" + name.removeprefix("..."): duration
        for names, duration in rows
        for name in re.findall(r"`([^`]+)`", names)
    }
    assert in_table == {name: rule["for"] for name, rule in shipped.items()}
