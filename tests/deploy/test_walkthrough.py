"""docs/kubernetes.md's "I have a cluster", followed line by line with the real tools and no cluster.

Every line of the walk-through's command block is run, or stands for what a cluster would do with it:
`scripts/build-image.sh` runs for real with a container engine that records its calls (it must print
steps 2 and 3 exactly as the page writes them); `kubectl create namespace` and `kubectl label` run as
client-side dry runs of the real kubectl; `helm install` runs as the real helm 4's `--dry-run=client` and
`helm upgrade --reuse-values` as `helm template` with the install's values and the new ones; every object
they make is validated with kubernetes-validate (and the Prometheus Operator's CRD schemas), the namespace's
Pod Security label must admit the agent's pods, and the port-forwards and `curl | grep` must name what the
objects and the agent really have. A line the test does not know fails it: the page cannot drift from what
was tested. The README's short form must be the same commands.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.deploy.test_helm_chart import CHART, KUBERNETES_VERSIONS, tool, validate_custom_resource
from tests.support import REPO, run_cli

GUIDE = REPO / "docs" / "kubernetes.md"
DASHBOARD = REPO / "config" / "grafana" / "dashboards" / "otel-numa.json"
CHART_PATH = "config/helm/otel-numa"
# Pod Security "baseline" forbids these in a pod (kubernetes.io/docs/concepts/security/pod-security-standards)
BASELINE_FORBIDS = ("hostPath volumes", "host namespaces", "privileged containers")


def walkthrough() -> list[str]:
    """The command lines of the first ```sh block after "## I have a cluster" (comments left out)."""
    text = GUIDE.read_text()
    section = text[text.index("## I have a cluster") :]
    block = re.search(r"^```sh\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert block, "no ```sh block in the walk-through"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def section_text() -> str:
    text = GUIDE.read_text()
    start = text.index("## I have a cluster")
    return text[start : text.index("\n## ", start + 1)]


@dataclass
class Cluster:
    """What the walk-through's commands would have made, kept between its lines."""

    env: dict[str, str]
    work: Path
    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    install: list[str] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)
    forwarded: dict[int, tuple[str, str, int]] = field(default_factory=dict)
    built: list[str] = field(default_factory=list)
    notes: str = ""

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, capture_output=True, text=True, timeout=120, env=self.env, cwd=REPO)


def documents(text: str) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(text) if document]


def validate(document: dict[str, Any]) -> None:
    if document["apiVersion"].startswith("monitoring.coreos.com/"):
        validate_custom_resource(document)
        return
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(document, version, strict=True)


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    found = []
    if any("hostPath" in volume for volume in pod.get("volumes", [])):
        found.append(BASELINE_FORBIDS[0])
    if any(pod.get(key) for key in ("hostNetwork", "hostPID", "hostIPC")):
        found.append(BASELINE_FORBIDS[1])
    if any(c.get("securityContext", {}).get("privileged") for c in pod["containers"]):
        found.append(BASELINE_FORBIDS[2])
    return found


def admit(cluster: Cluster, objects: list[dict[str, Any]]) -> None:
    """Pod Security admission as a cluster enforcing "baseline" by default does it."""
    for document in objects:
        validate(document)
        if document["kind"] != "DaemonSet":
            continue
        namespace = cluster.namespaces.get(document["metadata"]["namespace"])
        assert namespace is not None, f"{document['metadata']['namespace']} was never created"
        level = namespace["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce", "baseline")
        violations = baseline_violations(document["spec"]["template"]["spec"])
        assert level == "privileged" or not violations, f"Pod Security {level} refuses {violations}"


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, (
        f"no {kind}/{name} among {[o['kind'] + '/' + o['metadata']['name'] for o in objects]}"
    )
    return matches[0]


def split_sets(words: list[str]) -> tuple[list[str], list[str]]:
    """(the other options, the values of --set)."""
    others: list[str] = []
    sets: list[str] = []
    words = list(words)
    while words:
        word = words.pop(0)
        if word == "--set":
            sets.append(words.pop(0))
        else:
            others.append(word)
    return others, sets


# ---------------------------------------------------------------- what each line does


def build_image(cluster: Cluster, words: list[str], following: list[str]) -> None:
    """The build, with an engine that records its calls: it must print the walk-through's next lines."""
    result = cluster.run(*words)
    assert result.returncode == 0, result.stderr
    printed = result.stdout.splitlines()
    assert printed == following[: len(printed)] and len(printed) == 3, (printed, following)
    calls = (cluster.work / "engine.log").read_text().splitlines()
    tag = words[words.index("--tag") + 1]
    assert any(call.startswith("build ") and f"--tag {tag}" in call for call in calls), calls
    assert f"push {tag}" in calls
    cluster.built.append(tag)


def kubectl(cluster: Cluster, words: list[str]) -> None:
    namespace_flag = words[1:3] if words[1] == "-n" else []
    verb, *rest = words[1 + len(namespace_flag) :]
    if verb == "create" and rest[0] == "namespace":
        made = cluster.run(tool("kubectl"), "create", "namespace", rest[1], "--dry-run=client", "-o", "yaml")
        assert made.returncode == 0, made.stderr
        cluster.namespaces[rest[1]] = yaml.safe_load(made.stdout)
    elif verb == "label" and rest[0] == "namespace":
        path = cluster.work / f"namespace-{rest[1]}.yaml"
        path.write_text(yaml.safe_dump(cluster.namespaces[rest[1]]))
        labelled = cluster.run(tool("kubectl"), "label", "--local", "-f", str(path), *rest[2:], "-o", "yaml")
        assert labelled.returncode == 0, labelled.stderr
        cluster.namespaces[rest[1]] = yaml.safe_load(labelled.stdout)
        validate(cluster.namespaces[rest[1]])
    elif verb == "rollout" and rest[0] == "status":
        kind, _, name = rest[1].partition("/")
        assert kind == "daemonset"
        assert find(cluster.objects, "DaemonSet", name)["metadata"]["namespace"] == namespace_flag[1]
    elif verb == "port-forward":
        target, ports = rest[0], rest[1]
        local, _, remote = ports.partition(":")
        cluster.forwarded[int(local)] = (namespace_flag[1], target, int(remote))
        if target.startswith("daemonset/"):
            daemonset = find(cluster.objects, "DaemonSet", target.removeprefix("daemonset/"))
            assert daemonset["metadata"]["namespace"] == namespace_flag[1]
            container_ports = [
                port["containerPort"]
                for container in daemonset["spec"]["template"]["spec"]["containers"]
                for port in container.get("ports", [])
            ]
            assert int(remote) in container_ports, container_ports
    else:
        raise AssertionError(f"the test does not know what `{' '.join(words)}` does")


def helm(cluster: Cluster, words: list[str]) -> None:
    verb, release, chart, *options = words[1:]
    assert chart == CHART_PATH
    chart_args = [release, str(CHART), *options]
    if verb == "install":
        result = cluster.run(tool("helm"), "install", *chart_args, "--dry-run=client")
        assert result.returncode == 0, result.stderr
        manifest, _, cluster.notes = result.stdout.partition("MANIFEST:")[2].partition("NOTES:")
        cluster.install = options
    elif verb == "upgrade":
        assert "--reuse-values" in options, "an upgrade here keeps the install's values"
        others, sets = split_sets([option for option in options if option != "--reuse-values"])
        sets = split_sets(cluster.install)[1] + sets
        arguments = [*others, *(word for value in sets for word in ("--set", value))]
        result = cluster.run(tool("helm"), "template", release, str(CHART), *arguments)
        assert result.returncode == 0, result.stderr
        manifest = result.stdout
    else:
        raise AssertionError(f"the test does not know what `helm {verb}` does")
    cluster.objects = documents(manifest)
    admit(cluster, cluster.objects)


def curl_grep(cluster: Cluster, line: str) -> None:
    """`curl URL | grep PATTERN`: the URL is a forwarded port of the agent; the agent's page has the lines."""
    curl, grep = (shlex.split(part) for part in line.split("|"))
    url = curl[-1]
    match = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/metrics", url)
    assert match and int(match.group(1)) in cluster.forwarded, url
    _, target, remote = cluster.forwarded[int(match.group(1))]
    daemonset = find(cluster.objects, "DaemonSet", target.removeprefix("daemonset/"))
    agent = daemonset["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in agent["env"] if "value" in e}
    assert env["OTEL_NUMA_PROMETHEUS_ADDRESS"] == f"0.0.0.0:{remote}"
    page = run_cli("--once", "--podresources-socket=none", "--kubelet-root=/nonexistent")
    assert page.returncode == 0, page.stderr
    pattern = grep[-1]
    shown = [text for text in page.stdout.splitlines() if re.search(pattern, text)]
    assert shown, f"grep {pattern} finds nothing on the agent's page"


def grafana(cluster: Cluster, words: list[str]) -> None:
    """The Grafana of kube-prometheus-stack: where the dashboard ConfigMap went, with the sidecar's label."""
    namespace, target = words[2], words[4]
    assert target == "svc/kube-prometheus-stack-grafana"
    maps = [
        o
        for o in cluster.objects
        if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"]["labels"]
    ]
    assert maps, "the upgrade made no dashboard ConfigMap"
    for config_map in maps:
        assert config_map["metadata"]["namespace"] == namespace
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    uid = json.loads(DASHBOARD.read_text())["uid"]
    assert f"http://127.0.0.1:{words[5].partition(':')[0]}/d/{uid}" in section_text()
    for kind in ("ServiceMonitor", "PrometheusRule"):
        monitor = find(cluster.objects, kind, "otel-numa")
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind


# ---------------------------------------------------------------- the walk-through


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    """Tools on the PATH: the real helm and kubectl, a docker without an engine, a podman that records."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/engine.log\n')
    (bin_dir / "docker").write_text("#!/bin/sh\nexit 1\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_NUMA_", "CONTAINERS_"))}
    env |= {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(home / "no-cluster"),
    }
    return Cluster(env=env, work=tmp_path)


def test_the_walkthrough_as_written(cluster: Cluster) -> None:
    lines = walkthrough()
    for index, line in enumerate(lines):
        words = shlex.split(line.removesuffix("&").strip())
        if words[:2] == ["bash", "scripts/build-image.sh"]:
            build_image(cluster, words, lines[index + 1 :])
        elif "|" in line and words[0] == "curl":
            curl_grep(cluster, line)
        elif words[0] == "kubectl" and words[-2:-1] == ["svc/kube-prometheus-stack-grafana"]:
            grafana(cluster, words)
        elif words[0] == "kubectl":
            kubectl(cluster, words)
        elif words[0] == "helm":
            helm(cluster, words)
        else:
            raise AssertionError(f"the test does not know what `{line}` does")
    agent = find(cluster.objects, "DaemonSet", "otel-numa")["spec"]["template"]["spec"]["containers"][0]
    assert cluster.built == [agent["image"]], "the chart runs the image that was built and pushed"
    assert (
        "port-forward" in cluster.notes and "pod-security.kubernetes.io/enforce=privileged" in cluster.notes
    )


def test_without_the_label_step_the_pods_are_refused(cluster: Cluster) -> None:
    """The Pod Security check is not vacuous: the walk-through without step 2's label fails."""
    lines = [line for line in walkthrough() if not line.startswith("kubectl label")]
    kubectl(cluster, shlex.split(next(line for line in lines if line.startswith("kubectl create namespace"))))
    install = next(line for line in lines if line.startswith("helm install"))
    with pytest.raises(AssertionError, match="Pod Security baseline refuses"):
        helm(cluster, shlex.split(install))


def test_the_readme_shows_the_same_first_steps() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Kubernetes") :]
    block = re.search(r"^```sh\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert block
    shown = [line for line in block.group(1).splitlines() if line.strip()]
    assert shown == walkthrough()[: len(shown)]
