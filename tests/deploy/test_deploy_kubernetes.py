"""Offline checks of the Kubernetes manifests in config/kubernetes, and of the chart's collector gateway.

config/kubernetes is generated from the Helm chart (scripts/render-kubernetes.py): a test runs the generator
and fails when the committed files differ. Every object is validated against the Kubernetes OpenAPI schemas
shipped by kubernetes-validate (strict: unknown fields are errors), then the properties an operator relies
on are checked one by one: read-only host mounts that create nothing on the node, the node name from the
downward API, probes on the health port, tolerations, resources, a restrictive security context, an image
placeholder that cannot be pulled and an overlay that names the real one, the wiring between agent, Service
and (rendered by the chart with gateway.enabled) the collector gateway, and that the agent's settings
loader accepts the DaemonSet's environment.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from otel_numa.cli.main import load_settings
from tests.support import REPO

MANIFESTS = REPO / "config" / "kubernetes"
KUSTOMIZATION = MANIFESTS / "kustomization.yaml"
RENDER_SCRIPT = REPO / "scripts" / "render-kubernetes.py"
KUBECTL = REPO / ".tools" / "bin" / "kubectl"
HELM = REPO / ".tools" / "bin" / "helm"
NAMESPACE = "otel-numa"
PLACEHOLDER_IMAGE = "REGISTRY/otel-numa"
# The image reference grammar (distribution/reference): lowercase path components, a tag or a digest.
IMAGE_REFERENCE = re.compile(
    r"^(?:(?:(?:[a-zA-Z0-9-]+\.)+[a-zA-Z0-9-]+(?::[0-9]+)?|[a-zA-Z0-9-]+:[0-9]+|localhost)/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[\w][\w.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)

# The oldest and the newest Kubernetes release whose schemas kubernetes-validate ships and that know
# every field used here (recursiveReadOnly appeared in 1.30).
KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")

PINNED_IMAGE = re.compile(r"^[a-z0-9./_-]+:v?\d+\.\d+\.\d+$")


def manifest_files() -> list[Path]:
    return sorted(path for path in MANIFESTS.glob("*.yaml") if path != KUSTOMIZATION)


def load_objects() -> list[dict[str, Any]]:
    objects = []
    for path in manifest_files():
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                objects.append(document)
    return objects


OBJECTS = load_objects()


def find(kind: str, name: str, objects: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    matches = [
        o
        for o in (OBJECTS if objects is None else objects)
        if o["kind"] == kind and o["metadata"]["name"] == name
    ]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def object_id(document: dict[str, Any]) -> str:
    return f"{document['kind']}/{document['metadata']['name']}"


@pytest.fixture(scope="module")
def daemonset() -> dict[str, Any]:
    return find("DaemonSet", "otel-numa")


@pytest.fixture(scope="module")
def pod(daemonset: dict[str, Any]) -> dict[str, Any]:
    return dict(daemonset["spec"]["template"]["spec"])


@pytest.fixture(scope="module")
def agent(pod: dict[str, Any]) -> dict[str, Any]:
    containers = pod["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def env_values(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def port_number(container: dict[str, Any], port: int | str) -> int:
    """Resolves a probe or Service port given by name or number to the container's port number."""
    for declared in container.get("ports", []):
        if port in (declared["containerPort"], declared.get("name")):
            return int(declared["containerPort"])
    raise AssertionError(f"port {port!r} is not declared by container {container['name']}")


def quantity(value: str) -> float:
    """CPU and memory quantities as numbers (millicores become fractions, binary suffixes bytes)."""
    suffixes = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 1e3, "M": 1e6, "G": 1e9}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert match, value
    number, suffix = match.groups()
    return float(number) * (suffixes[suffix] if suffix else 1)


def pipeline_problems(config: dict[str, Any]) -> list[str]:
    problems = []
    service = config.get("service", {})
    for extension in service.get("extensions", []):
        if extension not in (config.get("extensions") or {}):
            problems.append(f"extension {extension} is not defined")
    for name, pipeline in (service.get("pipelines") or {}).items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                if component not in (config.get(kind) or {}):
                    problems.append(f"pipeline {name}: {kind[:-1]} {component} is not defined")
    return problems


def iter_pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for document in objects:
        if document["kind"] in ("DaemonSet", "Deployment"):
            yield object_id(document), document["spec"]["template"]["spec"]


# ---------------------------------------------------------------- schema validation


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("document", OBJECTS, ids=object_id)
def test_manifest_is_valid_kubernetes(document: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(document, version, strict=True)


def test_strict_validation_rejects_unknown_fields(daemonset: dict[str, Any]) -> None:
    broken = copy.deepcopy(daemonset)
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    assert kustomization["namespace"] == NAMESPACE
    assert sorted(kustomization["resources"]) == sorted(path.name for path in manifest_files())


def test_everything_lives_in_the_otel_numa_namespace() -> None:
    for document in OBJECTS:
        if document["kind"] == "Namespace":
            assert document["metadata"]["name"] == NAMESPACE
        else:
            assert document["metadata"]["namespace"] == NAMESPACE, object_id(document)


def test_namespace_admits_host_path_pods() -> None:
    labels = find("Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


# ---------------------------------------------------------------- agent DaemonSet


def test_every_host_path_is_mounted_read_only(pod: dict[str, Any]) -> None:
    host_volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert set(host_volumes.values()) == {
        "/sys",
        "/sys/fs/cgroup",
        "/var/lib/kubelet",
        "/var/log/pods",
        "/var/log/containers",
    }
    for volume in pod["volumes"]:
        if "hostPath" in volume:
            assert volume["hostPath"]["type"] == "Directory", f"{volume['name']} may be created on the node"
    for container in pod["containers"] + pod.get("initContainers", []):
        for mount in container.get("volumeMounts", []):
            if mount["name"] in host_volumes:
                assert mount.get("readOnly") is True, f"{mount['name']} is writable"
                assert mount.get("mountPropagation", "None") == "None"


def test_agent_roots_point_at_the_mounted_host_paths(pod: dict[str, Any], agent: dict[str, Any]) -> None:
    host_of = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounted = {host_of[m["name"]]: m["mountPath"] for m in agent["volumeMounts"] if m["name"] in host_of}
    env = env_values(agent)
    assert env["OTEL_NUMA_SYSFS_ROOT"] == mounted["/sys"]
    assert "OTEL_NUMA_CDI_SPEC_DIRS" not in env, "no CDI directory is mounted by default"
    assert env["OTEL_NUMA_CGROUP_ROOT"] == mounted["/sys/fs/cgroup"]
    assert env["OTEL_NUMA_KUBELET_ROOT"] == mounted["/var/lib/kubelet"]
    assert env["OTEL_NUMA_POD_LOGS_ROOT"] == mounted["/var/log/pods"]
    assert env["OTEL_NUMA_CONTAINER_LOGS_ROOT"] == mounted["/var/log/containers"]


def test_node_name_comes_from_the_downward_api(agent: dict[str, Any]) -> None:
    node_name = [e for e in agent["env"] if e["name"] == "NODE_NAME"]
    assert node_name == [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]


def test_agent_accepts_its_environment(agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("OTEL_NUMA_", "OTEL_EXPORTER_OTLP_")) or name == "NODE_NAME":
            monkeypatch.delenv(name)
    for name, value in env_values(agent).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NODE_NAME", "worker-7")  # what the downward API puts there
    settings, _ = load_settings([])
    assert settings.node_name == "worker-7"
    assert settings.exporters == ("prometheus",)
    assert settings.podresources_socket_path == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert settings.cgroup_root == Path("/host/cgroup")


def test_probes_hit_the_health_endpoint(agent: dict[str, Any]) -> None:
    health_port = int(env_values(agent)["OTEL_NUMA_HEALTH_ADDRESS"].rpartition(":")[2])
    liveness = agent["livenessProbe"]["httpGet"]
    readiness = agent["readinessProbe"]["httpGet"]
    assert liveness["path"] == "/healthz"
    assert readiness["path"] == "/readyz"
    assert port_number(agent, liveness["port"]) == health_port
    assert port_number(agent, readiness["port"]) == health_port


def test_runs_on_every_node(pod: dict[str, Any]) -> None:
    assert {"operator": "Exists"} in pod["tolerations"], "a key-less Exists toleration tolerates every taint"
    assert "nodeSelector" not in pod and "affinity" not in pod


def test_resources_are_requested_and_limited(agent: dict[str, Any]) -> None:
    resources = agent["resources"]
    for resource in ("cpu", "memory"):
        request = quantity(resources["requests"][resource])
        limit = quantity(resources["limits"][resource])
        assert 0 < request <= limit, resource
    assert quantity(resources["limits"]["memory"]) <= 256 * 2**20, "a node agent should stay small"


def test_security_context_is_restrictive(pod: dict[str, Any], agent: dict[str, Any]) -> None:
    for flag in ("hostPID", "hostIPC", "hostNetwork"):
        assert not pod.get(flag), flag
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    context = agent["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context.get("privileged", False) is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert set(context["capabilities"].get("add", [])) <= {"DAC_READ_SEARCH"}


def test_prometheus_annotations_name_the_metrics_port(
    daemonset: dict[str, Any], agent: dict[str, Any]
) -> None:
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    metrics_port = int(env_values(agent)["OTEL_NUMA_PROMETHEUS_ADDRESS"].rpartition(":")[2])
    assert int(annotations["prometheus.io/port"]) == metrics_port == port_number(agent, "metrics")


def test_service_account_has_no_token() -> None:
    account = find("ServiceAccount", "otel-numa")
    assert account["automountServiceAccountToken"] is False


def test_daemonset_uses_the_service_account(pod: dict[str, Any]) -> None:
    assert pod["serviceAccountName"] == "otel-numa"


def test_images_are_pinned(gateway_objects: list[dict[str, Any]]) -> None:
    for name, template in iter_pod_templates([*OBJECTS, *gateway_objects]):
        for container in template["containers"]:
            image = container["image"]
            if image.startswith(f"{PLACEHOLDER_IMAGE}:"):
                continue
            assert IMAGE_REFERENCE.match(image), f"{name}: {image}"
            assert PINNED_IMAGE.match(image), f"{name}: {image} is not pinned to X.Y.Z"


def test_the_agent_image_is_a_placeholder_that_cannot_be_pulled(agent: dict[str, Any]) -> None:
    """No default names an image that does not exist: the base names one that is not even a reference,
    so every pod shows InvalidImageName (nothing is pulled) until an overlay names yours."""
    assert agent["image"] == f"{PLACEHOLDER_IMAGE}:0.1.0"
    assert not IMAGE_REFERENCE.match(agent["image"])
    assert IMAGE_REFERENCE.match("registry.example.com:5000/team/otel-numa:0.1.0")
    assert IMAGE_REFERENCE.match("localhost/otel-numa:dev")
    assert PLACEHOLDER_IMAGE in KUSTOMIZATION.read_text(), "kustomization.yaml says how to name the image"


def test_an_overlay_names_the_image(tmp_path: Path) -> None:
    """The overlay of kustomization.yaml's comment, rendered by kubectl's kustomize."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(MANIFESTS, overlay)],
                "images": [
                    {
                        "name": PLACEHOLDER_IMAGE,
                        "newName": "registry.example.com/otel-numa",
                        "newTag": "0.1.0",
                    }
                ],
            }
        )
    )
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60,
        env=os.environ | {"KUBECONFIG": str(tmp_path / "none")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    objects = [document for document in yaml.safe_load_all(result.stdout) if document]
    [daemonset] = [o for o in objects if o["kind"] == "DaemonSet"]
    images = [c["image"] for c in daemonset["spec"]["template"]["spec"]["containers"]]
    assert images == ["registry.example.com/otel-numa:0.1.0"]
    for document in objects:
        kubernetes_validate.validate(document, KUBERNETES_VERSIONS[-1], strict=True)


# ---------------------------------------------------------------- generated from the chart


def test_the_manifests_are_what_the_chart_renders() -> None:
    result = subprocess.run(
        [sys.executable, str(RENDER_SCRIPT), "--check"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_the_check_names_a_file_that_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("render_kubernetes", RENDER_SCRIPT)
    assert spec is not None and spec.loader is not None
    render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(render)
    copy_of_base = tmp_path / "kubernetes"
    copy_of_base.mkdir()
    for path in MANIFESTS.glob("*.yaml"):
        (copy_of_base / path.name).write_text(path.read_text())
    edited = copy_of_base / "daemonset.yaml"
    edited.write_text(edited.read_text().replace("memory: 128Mi", "memory: 256Mi"))
    (copy_of_base / "extra.yaml").write_text("kind: ConfigMap\n")
    monkeypatch.setattr(render, "KUSTOMIZE", copy_of_base)
    monkeypatch.setattr(render, "REPO", tmp_path)
    monkeypatch.setattr(render, "chart_copies", dict)
    monkeypatch.setattr(render, "generated_directories", lambda: [(copy_of_base, "*.yaml")])
    monkeypatch.setattr(sys, "argv", ["render-kubernetes.py", "--check"])
    assert render.main() == 1
    assert capsys.readouterr().err.splitlines() == [
        "render-kubernetes: kubernetes/daemonset.yaml differs from the chart",
        "render-kubernetes: kubernetes/extra.yaml differs from the chart",
        "render-kubernetes: run python3 scripts/render-kubernetes.py",
    ]


# ---------------------------------------------------------------- Service for Prometheus


def test_headless_service_selects_the_agent_pods(daemonset: dict[str, Any], agent: dict[str, Any]) -> None:
    service = find("Service", "otel-numa")
    assert service["spec"]["clusterIP"] == "None"
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = service["spec"]["ports"]
    assert [p["port"] for p in ports] == [9464]
    assert port_number(agent, ports[0]["targetPort"]) == 9464


def test_daemonset_selector_matches_its_template(daemonset: dict[str, Any]) -> None:
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


# ---------------------------------------------------------------- collector gateway (the chart's, opt-in)


@pytest.fixture(scope="module")
def gateway_objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The chart rendered with its collector gateway on and the agent pushing OTLP to it."""
    home = tmp_path_factory.mktemp("helm-home")
    result = subprocess.run(
        [
            str(HELM), "template", "otel-numa", str(REPO / "config" / "helm" / "otel-numa"),
            "--namespace", NAMESPACE, "--set", f"image.repository={PLACEHOLDER_IMAGE}",
            "--set", "gateway.enabled=true", "--set", "exporters={prometheus,otlp}",
        ],
        capture_output=True, text=True, timeout=60,
        env=os.environ | {"HOME": str(home), "HELM_CACHE_HOME": str(home), "HELM_CONFIG_HOME": str(home)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [document for document in yaml.safe_load_all(result.stdout) if document]


@pytest.fixture(scope="module")
def gateway_config(gateway_objects: list[dict[str, Any]]) -> dict[str, Any]:
    config = yaml.safe_load(find("ConfigMap", "otel-numa-gateway", gateway_objects)["data"]["config.yaml"])
    assert isinstance(config, dict)
    return config


def gateway_collector(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(find("Deployment", "otel-numa-gateway", objects)["spec"]["template"]["spec"]["containers"][0])


def test_gateway_pipelines_use_only_defined_components(gateway_config: dict[str, Any]) -> None:
    assert pipeline_problems(gateway_config) == []
    assert gateway_config["service"]["pipelines"]["metrics"]["receivers"] == ["otlp"]


def test_agents_reach_the_gateway_receiver(
    gateway_objects: list[dict[str, Any]], gateway_config: dict[str, Any]
) -> None:
    daemonset = find("DaemonSet", "otel-numa", gateway_objects)
    env = env_values(daemonset["spec"]["template"]["spec"]["containers"][0])
    assert "otlp" in env["OTEL_NUMA_EXPORTERS"].split(",")
    endpoint = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    service_name, namespace, svc = (endpoint.hostname or "").split(".")
    assert svc == "svc"
    service = find("Service", service_name, gateway_objects)
    assert service["metadata"]["namespace"] == namespace
    service_port = next(p for p in service["spec"]["ports"] if p["port"] == endpoint.port)

    deployment = find("Deployment", service_name, gateway_objects)
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    collector = deployment["spec"]["template"]["spec"]["containers"][0]
    container_port = port_number(collector, service_port["targetPort"])

    protocol = {"grpc": "grpc", "http/protobuf": "http"}[env["OTEL_EXPORTER_OTLP_PROTOCOL"]]
    receiver = gateway_config["receivers"]["otlp"]["protocols"][protocol]
    host, _, port = receiver["endpoint"].rpartition(":")
    assert host == "0.0.0.0"
    assert int(port) == container_port


def test_gateway_reads_its_config_map(gateway_objects: list[dict[str, Any]]) -> None:
    template = find("Deployment", "otel-numa-gateway", gateway_objects)["spec"]["template"]["spec"]
    collector = template["containers"][0]
    config_volume = next(
        v for v in template["volumes"] if v.get("configMap", {}).get("name") == "otel-numa-gateway"
    )
    mount = next(m for m in collector["volumeMounts"] if m["name"] == config_volume["name"])
    assert f"--config={mount['mountPath']}/config.yaml" in collector["args"]


def test_gateway_probes_use_the_health_check_extension(
    gateway_objects: list[dict[str, Any]], gateway_config: dict[str, Any]
) -> None:
    collector = gateway_collector(gateway_objects)
    health_port = int(gateway_config["extensions"]["health_check"]["endpoint"].rpartition(":")[2])
    for probe in ("livenessProbe", "readinessProbe"):
        assert port_number(collector, collector[probe]["httpGet"]["port"]) == health_port


def test_gateway_uses_the_same_collector_as_the_demo(gateway_objects: list[dict[str, Any]]) -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    assert gateway_collector(gateway_objects)["image"] == compose["services"]["otel-collector"]["image"]
