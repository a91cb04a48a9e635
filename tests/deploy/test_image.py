"""The container image, built and run for real with podman: no Docker engine, no registry.

The project's Dockerfile is built on a Debian base image made locally with debootstrap, in a podman
storage of the tests' own (both set up by scripts/setup.d/podman.sh, which keeps the base between runs).
The image then runs with the settings users deploy, read from the files they deploy, not copied here:
the compose file's (read-only root, no capability, no privilege escalation, host /sys and /proc read-only,
the image's non-root user) and the DaemonSet's (UID 0, no capability, read-only root, resource limits,
the kubelet directory with root-owned 0600 checkpoints and a podresources socket, read-only). The whole
compose stack is run by tests/deploy/test_deploy_stack.py through the README's commands. Build time, image and
layer sizes and the UID are printed to the test output.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_numa.model import DeviceEntry, MemoryBlock, MemoryTable, NumaMemoryState
from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.sources.files import parse_cpulist
from otel_numa.testing.checkpoints import (
    write_cpu_manager_state,
    write_device_checkpoint,
    write_memory_manager_state,
)
from otel_numa.testing.compose import interpolate
from otel_numa.testing.kubelet_scenario import labels, series
from otel_numa.testing.peers import http_get, wait_for
from otel_numa.testing.podresources_server import PodResourcesServer, short_socket_dir
from tests.support import REPO

COMPOSE = REPO / "docker-compose.yaml"
DAEMONSET = REPO / "config" / "kubernetes" / "daemonset.yaml"
DEMO_NODES = REPO / "config" / "demo" / "sysfs" / "devices" / "system" / "node"

# Made and kept by scripts/setup.d/podman.sh.
PODMAN_HOME = Path("/var/lib/otel-numa-podman")
BASE_IMAGE = "localhost/otel-numa-base:bookworm-1"
BASE_IMAGE_ARM64 = "localhost/otel-numa-base:bookworm-1-arm64"
ARM64_REPOSITORY = "localhost/otel-numa-arm64"
# The host's trust store, mounted for the build's RUN steps only (never a layer): pip in the builder stage
# must verify the package index, which may sit behind an HTTPS proxy with a local CA.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_NODES = Path("/sys/devices/system/node")

POD_UID = "7d3c9a1e-52f4-4b8e-9c0d-1e2f3a4b5c6d"
POD_NAME, POD_NAMESPACE, CONTAINER = "dpdk-0", "net", "forwarder"
DEVICE_RESOURCE = "example.com/nic"
GiB = 1 << 30


@dataclass(frozen=True)
class Podman:
    env: Mapping[str, str]

    def run(self, *args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        completed = subprocess.run(
            ["podman", *args], env=dict(self.env), capture_output=True, text=True, timeout=timeout_s
        )
        if check and completed.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} exited {completed.returncode}:\n{completed.stderr}"
            )
        return completed

    def inspect(self, *args: str) -> Any:
        return json.loads(self.run(*args).stdout)

    def remove(self, container: str) -> None:
        self.run("rm", "--force", "--time=0", container, check=False)


@dataclass(frozen=True)
class BuiltImage:
    name: str
    build_s: float
    size: int
    inspected: Mapping[str, Any]


def report(config: pytest.Config, *lines: str) -> None:
    """Lines in the test output whatever the capture mode (CI runs pytest -q)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print(*(f"image: {line}" for line in lines), sep="\n")
        return
    with capture.global_and_fixture_disabled():
        for line in lines:
            reporter.write_line(f"image: {line}")


def megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


@pytest.fixture(scope="module")
def podman() -> Podman:
    if shutil.which("podman") is None:
        raise AssertionError("podman is not installed: run bash scripts/setup.sh --test")
    env = {**os.environ}
    env["CONTAINERS_CONF"] = str(PODMAN_HOME / "containers.conf")
    env["CONTAINERS_STORAGE_CONF"] = str(PODMAN_HOME / "storage.conf")
    tool = Podman(env)
    if tool.run("image", "exists", BASE_IMAGE, check=False).returncode != 0:
        raise AssertionError(f"no base image {BASE_IMAGE} in {PODMAN_HOME}: run bash scripts/setup.sh --test")
    return tool


def compose_document() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


def build(podman: Podman, name: str, base: str, *extra: str, timeout_s: float = 300) -> float:
    """Builds the Dockerfile from scratch (no layer cache: pip fetches the dependencies as a user's build
    does) in docker format, which keeps the HEALTHCHECK; returns the seconds it took."""
    volumes = ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"] if HOST_CA_BUNDLE.exists() else []
    started = time.monotonic()
    podman.run(
        "build", "--no-cache", "--format=docker", f"--build-arg=BASE_IMAGE={base}", *volumes, *extra,
        f"--tag={name}", str(REPO),
        timeout_s=timeout_s,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    # the builder stage and the previous build are left untagged: drop them so the storage does not grow
    podman.run("image", "prune", "--force")
    return elapsed


@pytest.fixture(scope="module")
def image(podman: Podman, pytestconfig: pytest.Config) -> BuiltImage:
    # the compose file's name for the agent's image, so podman-compose runs this very build
    name = str(compose_document()["services"]["agent"]["image"])
    build_s = build(podman, name, BASE_IMAGE)
    [inspected] = podman.inspect("image", "inspect", name)
    base_size = int(podman.inspect("image", "inspect", BASE_IMAGE)[0]["Size"])
    built = BuiltImage(name, build_s, int(inspected["Size"]), inspected)
    report(
        pytestconfig,
        f"built {name} on {BASE_IMAGE} in {build_s:.1f} s: {megabytes(built.size)} "
        f"(base {megabytes(base_size)}, the agent and its dependencies {megabytes(built.size - base_size)})",
    )
    for layer in podman.inspect("history", "--format=json", name):
        created_by = re.sub(r"\s+", " ", str(layer.get("CreatedBy") or layer.get("created_by") or ""))
        report(pytestconfig, f"  layer {megabytes(int(layer.get('size', 0))):>9}  {created_by[:90]}")
    return built


# ---------------------------------------------------------------------------------- what the image holds


def test_the_image_holds_what_runs_and_nothing_of_the_build(podman: Podman, image: BuiltImage) -> None:
    assert image.inspected["Config"]["User"] == "65532:65532"
    assert image.inspected["Config"]["Entrypoint"] == ["otel-numa"]
    healthcheck = image.inspected.get("Healthcheck") or {}
    assert "/healthz" in " ".join(healthcheck.get("Test", [])), "the docker format keeps the HEALTHCHECK"
    root = Path(podman.run("image", "mount", image.name).stdout.strip())
    base_root = Path(podman.run("image", "mount", BASE_IMAGE).stdout.strip())
    try:
        for builder_directory in ("wheels", "src"):
            assert not (root / builder_directory).exists(), f"/{builder_directory} of the build stage"
        # wheels, caches and project files the build added (the base's own, such as Debian's
        # /usr/share/python-wheels for venv, are not the build's)
        added = build_traces(root) - build_traces(base_root)
        assert sorted(added) == [], "the build left these in the final image"
        packages = [p for p in root.glob("usr/local/lib/python3*/dist-packages/otel_numa") if p.is_dir()]
        assert len(packages) == 1, "the agent is installed into the system Python once"
        # bytecode compiled at build time: on a read-only root Python cannot write it later
        assert list((packages[0] / "__pycache__").glob("model.*.pyc")), "no bytecode for otel_numa"
        assert not (packages[0] / "testing").exists(), "test support is not shipped"
    finally:
        podman.run("image", "unmount", image.name)
        podman.run("image", "unmount", BASE_IMAGE)


def build_traces(root: Path) -> set[str]:
    return {
        str(path.relative_to(root))
        for pattern in ("*.whl", ".cache", "pyproject.toml", "setup.py")
        for path in root.rglob(pattern)
    }


# ---------------------------------------------------------------------------------- compose settings


def cpus_per_node(nodes: Path) -> dict[int, int]:
    counts = {}
    for node in sorted(nodes.glob("node[0-9]*")):
        counts[int(node.name[4:])] = len(parse_cpulist((node / "cpulist").read_text()))
    return counts


# Keys of the agent's compose service translated below; anything else would be an untested setting.
COMPOSE_KEYS = {"build", "image", "command", "volumes", "read_only", "cap_drop", "security_opt", "ports"}
COMPOSE_KEYS |= {"depends_on", "restart"}


def compose_run_flags() -> tuple[list[str], list[str]]:
    """podman flags for the compose file's agent service (without its ports) and the agent's arguments. The
    podresources socket's volume is left out, and with it the podresources client: no server runs here."""
    service = compose_document()["services"]["agent"]
    assert set(service) <= COMPOSE_KEYS, f"translate {set(service) - COMPOSE_KEYS} into podman flags here"
    flags = ["--read-only"] if service.get("read_only") else []
    flags += [f"--cap-drop={capability}" for capability in service.get("cap_drop", [])]
    flags += [f"--security-opt={option}" for option in service.get("security_opt", [])]
    for volume in service.get("volumes", []):
        if volume["type"] == "volume":
            assert volume["source"] == "podresources", volume
            continue
        assert volume["type"] == "bind", volume
        source = str(volume["source"])
        host = REPO / source if source.startswith(".") else Path(source)
        mode = "ro" if volume.get("read_only") else "rw"
        flags.append(f"--volume={host}:{volume['target']}:{mode}")
    command = [interpolate(str(word)) for word in service["command"]]
    return flags, [
        "--podresources-socket=none" if word.startswith("--podresources-socket=") else word
        for word in command
    ]


def test_once_with_the_compose_settings(podman: Podman, image: BuiltImage) -> None:
    flags, command = compose_run_flags()
    assert {"--read-only", "--cap-drop=ALL"} <= set(flags), flags
    assert any(
        flag.startswith(f"--volume={REPO}/config/demo/sysfs:") and flag.endswith(":ro") for flag in flags
    )
    completed = podman.run("run", "--rm", "--network=none", *flags, image.name, *command, "--once")
    text = completed.stdout
    # the demo node's own machine, whatever the host has
    expected = cpus_per_node(DEMO_NODES)
    assert series(text, "numa_node_count") == {labels(): len(expected)}
    assert series(text, "numa_cpu_capacity") == {labels(numa_node_id=n): c for n, c in expected.items()}
    assert len(series(text, "numa_memory_capacity_bytes")) == len(expected)


def proc_status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


@pytest.fixture
def container_name(podman: Podman, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"otel-numa-test-{request.node.name[5:40].replace('_', '-')}-{os.getpid()}"
    podman.remove(name)
    yield name
    podman.remove(name)


def test_daemon_with_the_compose_settings(
    podman: Podman, image: BuiltImage, container_name: str, pytestconfig: pytest.Config
) -> None:
    flags, command = compose_run_flags()
    # podman 4 runs health checks from systemd timers, absent here: the check is run by hand below
    podman.run("run", "--detach", f"--name={container_name}", "--health-interval=disable", *flags,
               image.name, *command)  # fmt: skip
    [state] = podman.inspect("container", "inspect", container_name)
    address = next(iter(state["NetworkSettings"]["Networks"].values()))["IPAddress"]
    wait_for(lambda: http_get(f"http://{address}:9465/readyz", 1)[0] == 200, 30, "/readyz")
    assert http_get(f"http://{address}:9465/healthz", 1)[0] == 200
    status, body = http_get(f"http://{address}:9464/metrics")
    assert status == 200 and "numa_node_count{" in body.decode()
    assert podman.run("healthcheck", "run", container_name, check=False).returncode == 0

    process = proc_status(int(state["State"]["Pid"]))
    uids = process["Uid"].split()
    report(
        pytestconfig, f"compose settings: the agent ran as UID {uids[1]} (real, effective, saved, fs: {uids})"
    )
    assert set(uids) == {"65532"} and set(process["Gid"].split()) == {"65532"}
    assert int(process["CapEff"], 16) == 0 and int(process["CapBnd"], 16) == 0, process
    assert process["NoNewPrivs"] == "1"

    signalled = datetime.now(UTC)
    podman.run("kill", "--signal=TERM", container_name)
    exit_code = podman.run("wait", container_name, timeout_s=30).stdout.strip()
    [stopped] = podman.inspect("container", "inspect", container_name)
    stop_s = (finished_at(stopped["State"]["FinishedAt"]) - signalled).total_seconds()
    # with the compose file's settings the agent also pushes OTLP to a collector that is absent here: its
    # final flush is bounded by otlp_timeout (3 s)
    report(
        pytestconfig, f"SIGTERM: the container exited {stop_s:.1f} s after the signal, exit code {exit_code}"
    )
    assert exit_code == "0", podman.run("logs", container_name).stderr
    assert stop_s < 5


def finished_at(text: str) -> datetime:
    """podman's RFC 3339 time with nanoseconds, to microseconds."""
    match = re.fullmatch(r"(.+T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    assert match, text
    fraction = (match.group(2) or "0")[:6].ljust(6, "0")
    return datetime.fromisoformat(f"{match.group(1)}.{fraction}{match.group(3).replace('Z', '+00:00')}")


# ---------------------------------------------------------------------------------- DaemonSet settings


@dataclass(frozen=True)
class Node:
    """A stand-in node's kubelet state: the host paths the DaemonSet mounts that a test must own."""

    kubelet: Path
    pod_logs: Path
    container_logs: Path

    def host_path(self, path: str) -> Path:
        owned = {
            "/var/lib/kubelet": self.kubelet,
            "/var/log/pods": self.pod_logs,
            "/var/log/containers": self.container_logs,
        }
        if path in owned:
            return owned[path]
        if path in ("/etc/cdi", "/var/run/cdi"):  # a node without CDI specs: empty directories
            empty = self.kubelet.parent / "cdi" / path.strip("/").replace("/", "-")
            empty.mkdir(parents=True, exist_ok=True)
            return empty
        assert path in ("/sys", "/sys/fs/cgroup"), f"the DaemonSet mounts {path}: give the test a stand-in"
        return Path(path)


def daemonset_run_flags(node: Node, node_name: str) -> list[str]:
    """podman flags for the DaemonSet's agent container: user, security context, limits, env, mounts."""
    document = yaml.safe_load(DAEMONSET.read_text())
    pod = document["spec"]["template"]["spec"]
    [container] = pod["containers"]
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key), f"{key}: translate it into podman flags here"
    pod_context, context = pod.get("securityContext", {}), container.get("securityContext", {})
    assert not context.get("privileged")
    assert pod_context.get("seccompProfile", {}).get("type", "RuntimeDefault") == "RuntimeDefault"
    user = context.get("runAsUser", pod_context.get("runAsUser"))
    group = context.get("runAsGroup", pod_context.get("runAsGroup", user))
    flags = [f"--user={user}:{group}"] if user is not None else []
    flags += ["--read-only"] if context.get("readOnlyRootFilesystem") else []
    flags += ["--security-opt=no-new-privileges"] if context.get("allowPrivilegeEscalation") is False else []
    flags += [f"--cap-drop={c}" for c in context.get("capabilities", {}).get("drop", [])]
    flags += [f"--cap-add={c}" for c in context.get("capabilities", {}).get("add", [])]
    limits = container.get("resources", {}).get("limits", {})
    if "memory" in limits:
        flags.append(f"--memory={limits['memory'].removesuffix('i').lower()}")
    if "cpu" in limits:
        cpu = str(limits["cpu"])
        flags.append(f"--cpus={int(cpu[:-1]) / 1000 if cpu.endswith('m') else float(cpu)}")
    for variable in container.get("env", []):
        if "value" in variable:
            flags.append(f"--env={variable['name']}={variable['value']}")
        else:
            assert variable["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", variable
            flags.append(f"--env={variable['name']}={node_name}")
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for mount in container["volumeMounts"]:
        host = node.host_path(volumes[mount["name"]]["hostPath"]["path"])
        flags.append(f"--volume={host}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}")
    return [*flags, *container.get("command", []), *container.get("args", [])]


def tree_state(root: Path) -> dict[str, tuple[int, int, int, int, str]]:
    """Every entry under root: mode, owner, group, modification time and (for files) content digest."""
    state = {}
    for path in [root, *sorted(root.rglob("*"))]:
        info = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        state[str(path.relative_to(root))] = (
            info.st_mode,
            info.st_uid,
            info.st_gid,
            info.st_mtime_ns,
            digest,
        )
    return state


def write_kubelet_state(node: Node, exclusive_cpu: int, shared_cpus: set[int]) -> None:
    """One pod with one container holding an exclusive CPU, 1 GiB of memory and a NIC on NUMA node 0."""
    (node.kubelet / "pods" / POD_UID / "containers").mkdir(parents=True)
    (node.kubelet / "device-plugins").mkdir()
    (node.kubelet / "pod-resources").mkdir()
    (node.pod_logs / f"{POD_NAMESPACE}_{POD_NAME}_{POD_UID}").mkdir(parents=True)
    node.container_logs.mkdir()
    write_cpu_manager_state(
        node.kubelet / "cpu_manager_state", "static", shared_cpus, {POD_UID: {CONTAINER: {exclusive_cpu}}}
    )
    memory = MemoryTable(total=8 * GiB, system_reserved=GiB, allocatable=7 * GiB, reserved=GiB, free=6 * GiB)
    write_memory_manager_state(
        node.kubelet / "memory_manager_state",
        "Static",
        {0: NumaMemoryState(1, (0,), {"memory": memory})},
        {POD_UID: {CONTAINER: [MemoryBlock((0,), "memory", GiB)]}},
    )
    write_device_checkpoint(
        node.kubelet / "device-plugins" / "kubelet_internal_checkpoint",
        [DeviceEntry(POD_UID, CONTAINER, DEVICE_RESOURCE, {0: ("nic0",)})],
        {DEVICE_RESOURCE: ["nic0", "nic1"]},
    )


def podresources_answers(socket: Path, exclusive_cpu: int, allocatable_cpus: list[int]) -> PodResourcesServer:
    node0 = pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)])
    server = PodResourcesServer(socket)
    server.state.pods = [
        pb.PodResources(
            name=POD_NAME,
            namespace=POD_NAMESPACE,
            containers=[
                pb.ContainerResources(
                    name=CONTAINER,
                    cpu_ids=[exclusive_cpu],
                    devices=[
                        pb.ContainerDevices(
                            resource_name=DEVICE_RESOURCE, device_ids=["nic0"], topology=node0
                        )
                    ],
                    memory=[pb.ContainerMemory(memory_type="memory", size=GiB, topology=node0)],
                )
            ],
        )
    ]
    server.state.allocatable = pb.AllocatableResourcesResponse(
        cpu_ids=allocatable_cpus,
        devices=[
            pb.ContainerDevices(resource_name=DEVICE_RESOURCE, device_ids=["nic0", "nic1"], topology=node0)
        ],
    )
    return server


@pytest.fixture
def node() -> Iterator[Node]:
    root = short_socket_dir()  # the podresources socket lives below: unix socket paths are short
    yield Node(root / "kubelet", root / "pod-logs", root / "container-logs")
    shutil.rmtree(root, ignore_errors=True)


def test_once_with_the_daemonset_settings_reads_the_kubelet_state_read_only(
    podman: Podman, image: BuiltImage, node: Node, pytestconfig: pytest.Config
) -> None:
    cpus = sorted(parse_cpulist((HOST_NODES / "node0" / "cpulist").read_text()))
    assert len(cpus) >= 2, "the host's NUMA node 0 needs two CPUs: one shared, one exclusive"
    exclusive_cpu, shared_cpus = cpus[-1], set(cpus[:-1])
    write_kubelet_state(node, exclusive_cpu, shared_cpus)
    socket = node.kubelet / "pod-resources" / "kubelet.sock"
    with podresources_answers(socket, exclusive_cpu, cpus[1:]):
        for checkpoint in (
            "cpu_manager_state",
            "memory_manager_state",
            "device-plugins/kubelet_internal_checkpoint",
        ):
            info = (node.kubelet / checkpoint).stat()
            assert (info.st_uid, info.st_mode & 0o777) == (0, 0o600), checkpoint
        before = tree_state(node.kubelet)
        flags = daemonset_run_flags(node, "daemonset-node")
        assert {"--user=0:0", "--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges"} <= set(
            flags
        )
        started = time.monotonic()
        completed = podman.run("run", "--rm", "--network=none", *flags, image.name, "--once")
        user = next(flag for flag in flags if flag.startswith("--user="))
        report(pytestconfig, f"DaemonSet settings: --once took {time.monotonic() - started:.1f} s, {user}")
        after = tree_state(node.kubelet)
    text = completed.stdout
    pod = {"k8s_pod_uid": POD_UID, "k8s_pod_name": POD_NAME, "k8s_namespace_name": POD_NAMESPACE}
    assert series(text, "numa_cpu_allocated") == {labels(numa_node_id=0): 1}, completed.stderr
    assert series(text, "numa_container_cpu_allocated") == {
        labels(**pod, k8s_container_name=CONTAINER, numa_node_id=0): 1
    }
    assert series(text, "numa_cpu_allocatable") == {labels(numa_node_id=0): len(cpus) - 1}
    assert series(text, "numa_memory_allocatable_bytes") == {labels(numa_node_id=0): 7 * GiB}
    assert series(text, "numa_memory_allocated_bytes") == {labels(numa_node_id=0): GiB}
    device = {"numa_node_id": "0", "numa_resource_name": DEVICE_RESOURCE}
    assert series(text, "numa_device_capacity") == {labels(**device): 2}
    assert series(text, "numa_device_allocated") == {labels(**device): 1}
    ages = series(text, "numa_agent_source_age_seconds")
    for source in ("cpu_manager", "memory_manager", "device_manager", "podresources"):
        assert labels(numa_source=source) in ages, f"{source} was not read: {completed.stderr}"
    errors = {key: value for key, value in series(text, "numa_agent_source_errors_total").items() if value}
    assert errors == {}, completed.stderr
    assert after == before, "the kubelet directory changed"


# ---------------------------------------------------------------------------------- another architecture


def dependency_digest() -> str:
    """What decides the arm64 image's architecture-specific content: the recipe and the dependency set
    (the agent itself is pure Python). The emulated build takes minutes, so it is kept under this tag."""
    digest = hashlib.sha256()
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml"):
        digest.update((REPO / name).read_bytes())
    return digest.hexdigest()[:16]


@pytest.mark.timeout(900)
def test_an_arm64_image_builds_and_runs_under_emulation(podman: Podman, pytestconfig: pytest.Config) -> None:
    if platform.machine() != "x86_64":
        pytest.skip(f"the emulated arm64 build is made on x86_64 machines, this one is {platform.machine()}")
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        pytest.skip("no qemu-aarch64 handler in binfmt_misc (the kernel refused it): arm64 not built")
    if podman.run("image", "exists", BASE_IMAGE_ARM64, check=False).returncode != 0:
        pytest.skip(
            f"no base image {BASE_IMAGE_ARM64}: OTEL_NUMA_TEST_ARM64=1 bash scripts/setup.sh --test makes it "
            "(about 8 minutes, once)"
        )
    name = f"{ARM64_REPOSITORY}:{dependency_digest()}"
    if podman.run("image", "exists", name, check=False).returncode == 0:
        report(pytestconfig, f"{name} (linux/arm64) kept from an earlier run: same recipe and dependencies")
    else:
        outdated = podman.run("images", "--quiet", "--filter", f"reference={ARM64_REPOSITORY}").stdout.split()
        if outdated:
            podman.run("rmi", "--force", *set(outdated))
        build_s = build(podman, name, BASE_IMAGE_ARM64, "--platform=linux/arm64", timeout_s=800)
        size = int(podman.inspect("image", "inspect", name)[0]["Size"])
        report(pytestconfig, f"built {name} (linux/arm64, emulated) in {build_s:.1f} s: {megabytes(size)}")
    [inspected] = podman.inspect("image", "inspect", name)
    assert inspected["Architecture"] == "arm64"
    flags, command = compose_run_flags()
    completed = podman.run(
        "run", "--rm", "--network=none", *flags, name, *command, "--once", timeout_s=120
    )  # fmt: skip
    assert series(completed.stdout, "numa_node_count") == {labels(): len(cpus_per_node(DEMO_NODES))}
    machine = podman.run("run", "--rm", "--network=none", "--entrypoint=uname", name, "-m").stdout.strip()
    assert machine == "aarch64", "the container ran natively, not as arm64"
