"""The CRI enrichment client against a real gRPC RuntimeService on a unix socket (otel_numa/testing)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_numa.proto import cri_runtime_v1_pb2 as pb
from otel_numa.sources.cri import (
    CRI_SOCKET_CANDIDATES,
    ContainerInfo,
    CriClient,
    detect_cri_socket,
    env_from_verbose_info,
    is_secret_like,
)
from otel_numa.sources.errors import SourceMissing, SourceUnavailable
from otel_numa.testing.cri_server import CriServer, CriState, RuntimeContainer
from otel_numa.testing.podresources_server import short_socket_dir
from tests.support import REPO

CHECKOUT_SANDBOX = "3c1f0a9be2d84c6f8a7b5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0f"
CHECKOUT_APP = "9a8b7c6d5e4f30211f2e3d4c5b6a79880f1e2d3c4b5a69788796a5b4c3d2e1f0"
CHECKOUT_PROXY = "7e6d5c4b3a2910f8e7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6b5a49382716"
CHECKOUT_INIT = "1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a"
DNS_SANDBOX = "5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6"
DNS_CONTAINER = "2f3e4d5c6b7a8998a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4"

CHECKOUT_UID = "5b2f4c1e-8d3a-4f6b-9e7c-2a1d0b9c8e7f"
DNS_UID = "e3a1c2b4-6f5d-4e7a-8b9c-0d1e2f3a4b5c"


def sandbox(sandbox_id: str, name: str, namespace: str, uid: str, labels: dict[str, str]) -> pb.PodSandbox:
    """A sandbox as the kubelet creates it: pod labels plus its own io.kubernetes.pod.* labels."""
    return pb.PodSandbox(
        id=sandbox_id,
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace),
        state=pb.SANDBOX_READY,
        created_at=1_732_000_000_000_000_000,
        labels={
            **labels,
            "io.kubernetes.pod.name": name,
            "io.kubernetes.pod.namespace": namespace,
            "io.kubernetes.pod.uid": uid,
        },
        annotations={
            "kubernetes.io/config.source": "api",
            "kubernetes.io/config.seen": "2024-11-19T07:06:40Z",
        },
    )


def container(
    container_id: str, sandbox_id: str, name: str, state: int = pb.CONTAINER_RUNNING
) -> pb.Container:
    return pb.Container(
        id=container_id,
        pod_sandbox_id=sandbox_id,
        metadata=pb.ContainerMetadata(name=name),
        image=pb.ImageSpec(image="docker.io/library/app:1.4"),
        state=state,  # type: ignore[arg-type]
        created_at=1_732_000_001_000_000_000,
        labels={"io.kubernetes.container.name": name},
    )


def node_state() -> CriState:
    checkout = sandbox(
        CHECKOUT_SANDBOX, "checkout-7b5d9c6f4-qp8zv", "shop", CHECKOUT_UID, {"app": "checkout", "tier": "web"}
    )
    checkout.annotations["team.example.com/owner"] = "payments"
    return CriState(
        sandboxes=[
            checkout,
            sandbox(DNS_SANDBOX, "coredns-76f75df574-9xq2w", "kube-system", DNS_UID, {"k8s-app": "kube-dns"}),
        ],
        containers=[
            RuntimeContainer(
                container(CHECKOUT_APP, CHECKOUT_SANDBOX, "app"),
                env={"TEAM": "payments", "DB_PASSWORD": "hunter2", "API_TOKEN": "abc", "LOG_LEVEL": "info"},
            ),
            RuntimeContainer(container(CHECKOUT_PROXY, CHECKOUT_SANDBOX, "proxy"), env={"TEAM": "platform"}),
            RuntimeContainer(container(CHECKOUT_INIT, CHECKOUT_SANDBOX, "migrate", pb.CONTAINER_EXITED)),
            RuntimeContainer(container(DNS_CONTAINER, DNS_SANDBOX, "coredns")),
        ],
    )


@pytest.fixture
def server() -> Iterator[CriServer]:
    with CriServer(state=node_state()) as running:
        yield running


def test_absent_socket_raises_source_missing(tmp_path: Path) -> None:
    with pytest.raises(SourceMissing):
        CriClient(tmp_path / "containerd.sock").containers(frozenset({"TEAM"}))


def test_running_containers_carry_their_pod(server: CriServer) -> None:
    with CriClient(server.socket_path) as client:
        found = client.containers(frozenset())

    checkout_labels = {"app": "checkout", "tier": "web"}
    checkout_annotations = {
        "kubernetes.io/config.source": "api",
        "kubernetes.io/config.seen": "2024-11-19T07:06:40Z",
        "team.example.com/owner": "payments",
    }
    assert found == (
        ContainerInfo(
            container_id=DNS_CONTAINER,
            pod_uid=DNS_UID,
            pod_name="coredns-76f75df574-9xq2w",
            namespace="kube-system",
            container_name="coredns",
            pod_labels={"k8s-app": "kube-dns"},
            pod_annotations={
                "kubernetes.io/config.source": "api",
                "kubernetes.io/config.seen": "2024-11-19T07:06:40Z",
            },
            env={},
        ),
        ContainerInfo(
            container_id=CHECKOUT_APP,
            pod_uid=CHECKOUT_UID,
            pod_name="checkout-7b5d9c6f4-qp8zv",
            namespace="shop",
            container_name="app",
            pod_labels=checkout_labels,
            pod_annotations=checkout_annotations,
            env={},
        ),
        ContainerInfo(
            container_id=CHECKOUT_PROXY,
            pod_uid=CHECKOUT_UID,
            pod_name="checkout-7b5d9c6f4-qp8zv",
            namespace="shop",
            container_name="proxy",
            pod_labels=checkout_labels,
            pod_annotations=checkout_annotations,
            env={},
        ),
    )
    # No environment wanted, so no container was asked for its verbose status.
    assert server.calls["ContainerStatus"] == 0


@pytest.mark.parametrize("info_style", ["containerd", "crio"])
def test_env_allowlist_keeps_team_and_drops_the_password(server: CriServer, info_style: str) -> None:
    server.state.info_style = info_style  # type: ignore[assignment]
    with CriClient(server.socket_path) as client:
        by_id = {info.container_id: info.env for info in client.containers(frozenset({"TEAM"}))}
    assert by_id == {
        CHECKOUT_APP: {"TEAM": "payments"},
        CHECKOUT_PROXY: {"TEAM": "platform"},
        DNS_CONTAINER: {},
    }
    assert server.calls["ContainerStatus"] == 3


def test_secret_like_names_are_dropped_even_when_allowlisted(server: CriServer) -> None:
    allowlist = frozenset({"TEAM", "LOG_LEVEL", "DB_PASSWORD", "API_TOKEN"})
    with CriClient(server.socket_path) as client:
        app = next(info for info in client.containers(allowlist) if info.container_id == CHECKOUT_APP)
    assert app.env == {"LOG_LEVEL": "info", "TEAM": "payments"}


def test_only_secret_like_allowlist_makes_no_status_calls(server: CriServer) -> None:
    with CriClient(server.socket_path) as client:
        found = client.containers(frozenset({"DB_PASSWORD"}))
    assert all(info.env == {} for info in found)
    assert server.calls["ContainerStatus"] == 0


def test_sandbox_created_between_the_two_lists_is_looked_up(server: CriServer) -> None:
    late_sandbox = "8f7e6d5c4b3a29181f2e3d4c5b6a798801f2e3d4c5b6a79880f1e2d3c4b5a697"
    late_container = "4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c"

    def pod_starts_meanwhile(method: str) -> None:
        if method == "ListContainers" and len(server.state.sandboxes) == 2:
            server.state.sandboxes.append(
                sandbox(
                    late_sandbox, "batch-28843200-x7k2m", "jobs", "0c9b8a7f-6e5d-4c3b-2a19-08f7e6d5c4b3", {}
                )
            )
            server.state.containers.append(RuntimeContainer(container(late_container, late_sandbox, "job")))

    server.on_call = pod_starts_meanwhile
    with CriClient(server.socket_path) as client:
        late = next(info for info in client.containers(frozenset()) if info.container_id == late_container)
    assert (late.pod_name, late.namespace, late.pod_uid) == (
        "batch-28843200-x7k2m",
        "jobs",
        "0c9b8a7f-6e5d-4c3b-2a19-08f7e6d5c4b3",
    )
    assert server.calls["PodSandboxStatus"] == 1


def test_container_removed_before_its_status_is_left_out(server: CriServer) -> None:
    def proxy_goes_away(method: str) -> None:
        if method == "ContainerStatus":
            server.state.containers = [
                entry for entry in server.state.containers if entry.container.id != CHECKOUT_PROXY
            ]

    server.on_call = proxy_goes_away
    with CriClient(server.socket_path) as client:
        found = client.containers(frozenset({"TEAM"}))
    assert {info.container_id for info in found} == {CHECKOUT_APP, DNS_CONTAINER}


def test_slow_runtime_gives_up_after_the_timeout(server: CriServer) -> None:
    server.state.delay_s = 10.0
    with CriClient(server.socket_path, timeout_s=0.5) as client:
        started = time.monotonic()
        with pytest.raises(SourceUnavailable) as raised:
            client.containers(frozenset({"TEAM"}))
    assert time.monotonic() - started < 1.0
    assert raised.value.error_type == "deadline_exceeded"


def test_runtime_in_another_process(tmp_path: Path) -> None:
    socket_dir = short_socket_dir()
    socket_path = socket_dir / "crio.sock"
    state_file = tmp_path / "state.json"
    state_file.write_text(
        json.dumps(
            {
                "info_style": "crio",
                "sandboxes": [
                    {
                        "id": DNS_SANDBOX,
                        "metadata": {
                            "name": "coredns-76f75df574-9xq2w",
                            "uid": DNS_UID,
                            "namespace": "kube-system",
                        },
                        "labels": {"k8s-app": "kube-dns", "io.kubernetes.pod.uid": DNS_UID},
                    }
                ],
                "containers": [
                    {
                        "container": {
                            "id": DNS_CONTAINER,
                            "podSandboxId": DNS_SANDBOX,
                            "metadata": {"name": "coredns"},
                            "state": "CONTAINER_RUNNING",
                        },
                        "env": {"TEAM": "sre", "SECRET_SEED": "x"},
                    }
                ],
            }
        )
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "otel_numa.testing.cri_server",
            "--socket",
            str(socket_path),
            "--state",
            str(state_file),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        with CriClient(socket_path) as client:
            (found,) = client.containers(frozenset({"TEAM", "SECRET_SEED"}))
        assert (found.pod_name, found.container_name, found.pod_labels, found.env) == (
            "coredns-76f75df574-9xq2w",
            "coredns",
            {"k8s-app": "kube-dns"},
            {"TEAM": "sre"},
        )
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.mark.parametrize(
    "name",
    [
        "DB_PASSWORD",
        "db_password",
        "API_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "SSH_PASSPHRASE",
        "PASSWD",
        "GIT_CREDENTIALS",
    ],
)
def test_secret_like_names(name: str) -> None:
    assert is_secret_like(name)


@pytest.mark.parametrize("name", ["TEAM", "LOG_LEVEL", "HOSTNAME", "PATH", "COST_CENTER", "NODE_NAME"])
def test_ordinary_names_are_not_secret_like(name: str) -> None:
    assert not is_secret_like(name)


def test_env_from_containerd_config_when_no_runtime_spec() -> None:
    info = {
        "info": json.dumps(
            {"sandboxID": "s", "config": {"envs": [{"key": "TEAM", "value": "a"}, {"key": "EMPTY"}]}}
        )
    }
    assert env_from_verbose_info(info) == {"TEAM": "a", "EMPTY": ""}


def test_env_from_runtime_spec_is_preferred_and_first_value_wins() -> None:
    info = {
        "info": json.dumps(
            {
                "config": {"envs": [{"key": "TEAM", "value": "from-config"}]},
                "runtimeSpec": {
                    "process": {"env": ["TEAM=from-spec", "URL=http://h/?a=b", "TEAM=later", "JUNK"]}
                },
            }
        )
    }
    assert env_from_verbose_info(info) == {"TEAM": "from-spec", "URL": "http://h/?a=b"}


@pytest.mark.parametrize(
    "info", [{}, {"info": ""}, {"info": "{not json"}, {"info": "[1, 2]"}, {"info": '{"pid": 7}'}]
)
def test_env_from_unusable_info_is_empty(info: dict[str, str]) -> None:
    assert env_from_verbose_info(info) == {}


def test_detect_cri_socket_takes_the_first_real_socket(tmp_path: Path) -> None:
    plain_file = tmp_path / "plain.sock"
    plain_file.write_text("")
    sockets = []
    for name in ("crio.sock", "containerd.sock"):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(tmp_path / name))
        sockets.append(listener)
    try:
        candidates = [
            tmp_path / "absent.sock",
            plain_file,
            tmp_path / "crio.sock",
            tmp_path / "containerd.sock",
        ]
        assert detect_cri_socket(candidates) == tmp_path / "crio.sock"
        assert detect_cri_socket(candidates[:2]) is None
    finally:
        for listener in sockets:
            listener.close()


def test_default_candidates_are_the_usual_runtime_sockets() -> None:
    assert CRI_SOCKET_CANDIDATES == (
        "/run/containerd/containerd.sock",
        "/run/crio/crio.sock",
        "/var/run/containerd/containerd.sock",
        "/var/run/crio/crio.sock",
    )
