"""A stand-in container runtime (CRI RuntimeService v1) on a unix socket, written from the published
API and from what containerd and CRI-O put in verbose ContainerStatus answers.

It serves ``/runtime.v1.RuntimeService/{ListPodSandbox,PodSandboxStatus,ListContainers,
ContainerStatus}`` from :class:`CriState`, which a test may change at any time. Filters are applied
as the API defines them (every set field must match). Unknown ids answer NOT_FOUND. With
``verbose`` set, ``info["info"]`` is JSON in the layout of ``info_style``:

- ``containerd``: ``sandboxID``, ``pid``, ``removing``, ``snapshotKey``, ``snapshotter``,
  ``runtimeType``, ``runtimeOptions``, ``config`` (the ContainerConfig, ``envs`` as
  ``[{"key", "value"}]``) and ``runtimeSpec`` (OCI, ``process.env`` as ``["K=V"]``);
- ``crio``: ``sandboxID``, ``pid``, ``runtimeSpec``, ``privileged``.

In a separate process (prints ``ready`` once it listens; SIGTERM stops it)::

    python -m otel_numa.testing.cri_server --socket /tmp/x/containerd.sock --state state.json

where ``state.json`` is ``{"sandboxes": [<PodSandbox in protobuf JSON>], "containers":
[{"container": <Container in protobuf JSON>, "env": {"NAME": "value"}}], "info_style": "containerd"}``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc
from google.protobuf import json_format

from otel_numa.proto import cri_runtime_v1_pb2 as pb
from otel_numa.proto import cri_runtime_v1_pb2_grpc as pb_grpc
from otel_numa.testing.podresources_server import UnixGrpcServer, run_until_signalled

InfoStyle = Literal["containerd", "crio"]

# What an image based on a Debian userland sets; the runtime puts it before the pod's variables.
IMAGE_ENV = (("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),)


@dataclass
class RuntimeContainer:
    container: pb.Container
    env: dict[str, str] = field(default_factory=dict)  # from the pod spec, in order
    pid: int = 4242


@dataclass
class CriState:
    sandboxes: list[pb.PodSandbox] = field(default_factory=list)
    containers: list[RuntimeContainer] = field(default_factory=list)
    info_style: InfoStyle = "containerd"
    delay_s: float = 0.0


def _labels_match(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _sandbox_matches(sandbox: pb.PodSandbox, wanted: pb.PodSandboxFilter) -> bool:
    return (
        (not wanted.id or wanted.id == sandbox.id)
        and (not wanted.HasField("state") or wanted.state.state == sandbox.state)
        and _labels_match(wanted.label_selector, sandbox.labels)
    )


def _container_matches(container: pb.Container, wanted: pb.ContainerFilter) -> bool:
    return (
        (not wanted.id or wanted.id == container.id)
        and (not wanted.HasField("state") or wanted.state.state == container.state)
        and (not wanted.pod_sandbox_id or wanted.pod_sandbox_id == container.pod_sandbox_id)
        and _labels_match(wanted.label_selector, container.labels)
    )


def _runtime_spec(entry: RuntimeContainer, hostname: str) -> dict[str, Any]:
    env = [f"{name}={value}" for name, value in IMAGE_ENV]
    env.append(f"HOSTNAME={hostname}")
    env += [f"{name}={value}" for name, value in entry.env.items()]
    return {
        "ociVersion": "1.1.0",
        "process": {"user": {"uid": 0, "gid": 0}, "args": ["/bin/app"], "env": env, "cwd": "/"},
        "root": {"path": "rootfs"},
        "hostname": hostname,
        "linux": {"cgroupsPath": f"kubepods-pod.slice:cri-containerd:{entry.container.id}"},
    }


def verbose_container_info(entry: RuntimeContainer, hostname: str, style: InfoStyle) -> str:
    container = entry.container
    spec = _runtime_spec(entry, hostname)
    if style == "crio":
        return json.dumps(
            {
                "sandboxID": container.pod_sandbox_id,
                "pid": entry.pid,
                "runtimeSpec": spec,
                "privileged": False,
            }
        )
    config = {
        "metadata": {"name": container.metadata.name, "attempt": container.metadata.attempt},
        "image": {"image": container.image.image},
        # Go's encoding/json with omitempty: an empty value has no "value" key.
        "envs": [{"key": name, **({"value": value} if value else {})} for name, value in entry.env.items()],
        "labels": dict(container.labels),
        "annotations": dict(container.annotations),
        "log_path": f"{container.metadata.name}/{container.metadata.attempt}.log",
    }
    return json.dumps(
        {
            "sandboxID": container.pod_sandbox_id,
            "pid": entry.pid,
            "removing": False,
            "snapshotKey": container.id,
            "snapshotter": "overlayfs",
            "runtimeType": "io.containerd.runc.v2",
            "runtimeOptions": {"SystemdCgroup": True},
            "config": config,
            "runtimeSpec": spec,
        }
    )


class _RuntimeService(pb_grpc.RuntimeServiceServicer):
    def __init__(self, server: CriServer) -> None:
        self._server = server

    def ListPodSandbox(self, request: pb.ListPodSandboxRequest, context: Any) -> pb.ListPodSandboxResponse:
        state = self._begin("ListPodSandbox", context)
        return pb.ListPodSandboxResponse(
            items=[sandbox for sandbox in state.sandboxes if _sandbox_matches(sandbox, request.filter)]
        )

    def PodSandboxStatus(
        self, request: pb.PodSandboxStatusRequest, context: Any
    ) -> pb.PodSandboxStatusResponse:
        state = self._begin("PodSandboxStatus", context)
        sandbox = self._sandbox(state, request.pod_sandbox_id, context)
        status = pb.PodSandboxStatus(
            id=sandbox.id,
            metadata=sandbox.metadata,
            state=sandbox.state,
            created_at=sandbox.created_at,
            network=pb.PodSandboxNetworkStatus(ip="10.244.1.17"),
            labels=sandbox.labels,
            annotations=sandbox.annotations,
            runtime_handler=sandbox.runtime_handler,
        )
        info = (
            {"info": json.dumps({"pid": 4100, "image": "registry.k8s.io/pause:3.10"})}
            if request.verbose
            else {}
        )
        return pb.PodSandboxStatusResponse(status=status, info=info)

    def ListContainers(self, request: pb.ListContainersRequest, context: Any) -> pb.ListContainersResponse:
        state = self._begin("ListContainers", context)
        return pb.ListContainersResponse(
            containers=[
                entry.container
                for entry in state.containers
                if _container_matches(entry.container, request.filter)
            ]
        )

    def ContainerStatus(self, request: pb.ContainerStatusRequest, context: Any) -> pb.ContainerStatusResponse:
        state = self._begin("ContainerStatus", context)
        entry = self._container(state, request.container_id, context)
        container = entry.container
        status = pb.ContainerStatus(
            id=container.id,
            metadata=container.metadata,
            state=container.state,
            created_at=container.created_at,
            started_at=container.created_at + 1_000_000_000 if container.state != pb.CONTAINER_CREATED else 0,
            image=container.image,
            image_ref=container.image_ref,
            labels=container.labels,
            annotations=container.annotations,
            image_id=container.image_id,
        )
        info = {}
        if request.verbose:
            sandbox = self._sandbox(state, container.pod_sandbox_id, context)
            info["info"] = verbose_container_info(entry, sandbox.metadata.name, state.info_style)
        return pb.ContainerStatusResponse(status=status, info=info)

    def _begin(self, method: str, context: Any) -> CriState:
        self._server.begin_call(method, context, self._server.state.delay_s)
        return self._server.state

    @staticmethod
    def _container(state: CriState, container_id: str, context: Any) -> RuntimeContainer:
        for entry in state.containers:
            if entry.container.id == container_id:
                return entry
        context.abort(grpc.StatusCode.NOT_FOUND, f"container {container_id!r} not found")
        raise AssertionError("abort raises")

    @staticmethod
    def _sandbox(state: CriState, sandbox_id: str, context: Any) -> pb.PodSandbox:
        for sandbox in state.sandboxes:
            if sandbox.id == sandbox_id:
                return sandbox
        context.abort(grpc.StatusCode.NOT_FOUND, f"sandbox {sandbox_id!r} not found")
        raise AssertionError("abort raises")


class CriServer(UnixGrpcServer):
    """The RuntimeService on ``unix://<socket_path>``; a context manager."""

    socket_name = "containerd.sock"

    def __init__(self, socket_path: Path | None = None, state: CriState | None = None) -> None:
        super().__init__(socket_path)
        self.state = state if state is not None else CriState()

    def add_servicers(self, server: Any) -> None:
        pb_grpc.add_RuntimeServiceServicer_to_server(_RuntimeService(self), server)


def load_state(path: Path) -> CriState:
    document = json.loads(path.read_text())
    return CriState(
        sandboxes=[json_format.ParseDict(item, pb.PodSandbox()) for item in document.get("sandboxes", [])],
        containers=[
            RuntimeContainer(
                container=json_format.ParseDict(item["container"], pb.Container()), env=item.get("env", {})
            )
            for item in document.get("containers", [])
        ],
        info_style=document.get("info_style", "containerd"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="A stand-in CRI RuntimeService on a unix socket.")
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--state", type=Path, help="JSON file with sandboxes and containers")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each call waits first")
    args = parser.parse_args()

    state = load_state(args.state) if args.state else CriState()
    state.delay_s = args.delay
    run_until_signalled(CriServer(args.socket, state))


if __name__ == "__main__":
    main()


def one_running_container(
    server: CriServer,
    pod: tuple[str, str, str],
    container: tuple[str, str],
    *,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
    """The runtime's state: one ready sandbox for ``pod`` (uid, name, namespace) running ``container``
    (id, name)."""
    uid, name, namespace = pod
    container_id, container_name = container
    server.state.sandboxes = [
        pb.PodSandbox(
            id="sb1",
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace),
            state=pb.SANDBOX_READY,
            labels=dict(labels or {}),
            annotations=dict(annotations or {}),
        )
    ]
    server.state.containers = [
        RuntimeContainer(
            pb.Container(
                id=container_id,
                pod_sandbox_id="sb1",
                metadata=pb.ContainerMetadata(name=container_name),
                state=pb.CONTAINER_RUNNING,
            ),
            env=dict(env or {}),
        )
    ]
