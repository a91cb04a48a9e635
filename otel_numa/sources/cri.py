"""Opt-in enrichment from the container runtime (CRI RuntimeService v1): which pod and container a
container id belongs to, the pod's labels and annotations, and allowlisted environment variables.

Only read-only calls are made: ListPodSandbox, ListContainers, PodSandboxStatus (for a sandbox
created between the two lists) and, when environment variables are wanted, ContainerStatus with
``verbose`` set, whose ``info["info"]`` is runtime-specific JSON:

- containerd: ``{"sandboxID", "pid", ..., "config": <ContainerConfig>, "runtimeSpec": <OCI spec>}``,
  where ``config.envs`` is ``[{"key": ..., "value": ...}]`` (what the kubelet asked for);
- CRI-O: ``{"sandboxID", "pid", "runtimeSpec": <OCI spec>, "privileged"}``, without ``config``.

Both carry the OCI ``runtimeSpec.process.env`` (``["NAME=value", ...]``), the environment the
process really starts with (image defaults included), so it is read first; ``config.envs`` is the
fallback when a runtime gives no runtime spec.
"""

from __future__ import annotations

import json
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Self, TypeVar

import grpc

from otel_numa.proto import cri_runtime_v1_pb2 as pb
from otel_numa.proto import cri_runtime_v1_pb2_grpc as pb_grpc
from otel_numa.sources.errors import SourceUnavailable
from otel_numa.sources.podresources import DEFAULT_MAX_MESSAGE_BYTES, UnixSocketChannel, rpc_failure
from otel_numa.sources.secret_names import is_secret_like as is_secret_like  # re-exported

CRI_SOCKET_CANDIDATES = (
    "/run/containerd/containerd.sock",
    "/run/crio/crio.sock",
    "/var/run/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
)

# The kubelet adds these to every sandbox's labels; they repeat the sandbox metadata.
KUBELET_SANDBOX_LABELS = frozenset(
    {"io.kubernetes.pod.name", "io.kubernetes.pod.namespace", "io.kubernetes.pod.uid"}
)

_Response = TypeVar("_Response")


def detect_cri_socket(candidates: Sequence[Path]) -> Path | None:
    """The first candidate that exists and is a unix socket, else None."""
    for candidate in candidates:
        try:
            mode = candidate.stat().st_mode
        except OSError:
            continue
        if stat.S_ISSOCK(mode):
            return candidate
    return None


@dataclass(frozen=True)
class ContainerInfo:
    container_id: str
    pod_uid: str
    pod_name: str
    namespace: str
    container_name: str
    pod_labels: Mapping[str, str]  # the pod's labels, without the kubelet's io.kubernetes.pod.* ones
    pod_annotations: Mapping[str, str]
    env: Mapping[str, str]  # allowlisted, never secret-like names only


def env_from_verbose_info(info: Mapping[str, str]) -> dict[str, str]:
    """The environment in a verbose ContainerStatus ``info`` map (containerd or CRI-O layout).

    For a name set twice the first value wins, as for getenv(3). Missing or malformed JSON gives an
    empty mapping: enrichment is best effort.
    """
    try:
        document = json.loads(info.get("info", ""))
    except ValueError:
        return {}
    if not isinstance(document, dict):
        return {}
    from_spec = _env_from_runtime_spec(document.get("runtimeSpec"))
    if from_spec is not None:
        return from_spec
    return _env_from_container_config(document.get("config"))


def _env_from_runtime_spec(spec: object) -> dict[str, str] | None:
    process = spec.get("process") if isinstance(spec, dict) else None
    entries = process.get("env") if isinstance(process, dict) else None
    if not isinstance(entries, list):
        return None
    env: dict[str, str] = {}
    for entry in entries:
        if isinstance(entry, str) and "=" in entry:
            name, value = entry.split("=", 1)
            env.setdefault(name, value)
    return env


def _env_from_container_config(config: object) -> dict[str, str]:
    entries = config.get("envs") if isinstance(config, dict) else None
    env: dict[str, str] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
            continue
        value = entry.get("value", "")  # Go's omitempty drops empty values
        env.setdefault(entry["key"], value if isinstance(value, str) else "")
    return env


@dataclass(frozen=True)
class _Pod:
    uid: str
    name: str
    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


def _pod_of(sandbox: pb.PodSandbox | pb.PodSandboxStatus) -> _Pod:
    labels = {key: value for key, value in sandbox.labels.items() if key not in KUBELET_SANDBOX_LABELS}
    return _Pod(
        uid=sandbox.metadata.uid,
        name=sandbox.metadata.name,
        namespace=sandbox.metadata.namespace,
        labels=MappingProxyType(labels),
        annotations=MappingProxyType(dict(sandbox.annotations)),
    )


class CriClient:
    """Reads running containers from the runtime's CRI socket over one persistent channel.

    :meth:`containers` raises :class:`SourceMissing` when the socket does not exist and
    :class:`SourceUnavailable` (``error_type`` = gRPC status code in lower case) when a call fails;
    the whole call, one RPC per container included, finishes within ``timeout_s``.
    """

    def __init__(self, socket_path: Path, timeout_s: float = 5.0) -> None:
        self._channel = UnixSocketChannel(socket_path, max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()

    def containers(self, env_allowlist: frozenset[str]) -> tuple[ContainerInfo, ...]:
        """Running containers with their pod; ``env`` holds only allowlisted, non-secret-like names.

        With nothing to read from the environment, no per-container call is made.
        """
        wanted_env = frozenset(name for name in env_allowlist if not is_secret_like(name))
        with self._lock:
            deadline = time.monotonic() + self._timeout_s
            stub = pb_grpc.RuntimeServiceStub(self._channel.get())
            sandboxes: pb.ListPodSandboxResponse = self._call(
                "ListPodSandbox",
                deadline,
                lambda timeout: stub.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=timeout),
            )
            running = pb.ContainerFilter(state=pb.ContainerStateValue(state=pb.CONTAINER_RUNNING))
            listed: pb.ListContainersResponse = self._call(
                "ListContainers",
                deadline,
                lambda timeout: stub.ListContainers(
                    pb.ListContainersRequest(filter=running), timeout=timeout
                ),
            )
            pods = {sandbox.id: _pod_of(sandbox) for sandbox in sandboxes.items}
            found = []
            for container in listed.containers:
                pod = pods.get(container.pod_sandbox_id) or self._sandbox_status(
                    stub, container.pod_sandbox_id, deadline
                )
                if pod is None:
                    continue  # its sandbox is gone: the container is being removed
                pods[container.pod_sandbox_id] = pod
                env = self._env(stub, container.id, wanted_env, deadline) if wanted_env else {}
                if env is None:
                    continue  # removed between the list and its status
                found.append(
                    ContainerInfo(
                        container_id=container.id,
                        pod_uid=pod.uid,
                        pod_name=pod.name,
                        namespace=pod.namespace,
                        container_name=container.metadata.name,
                        pod_labels=pod.labels,
                        pod_annotations=pod.annotations,
                        env=MappingProxyType(env),
                    )
                )
        found.sort(key=lambda info: (info.namespace, info.pod_name, info.container_name, info.container_id))
        return tuple(found)

    def close(self) -> None:
        with self._lock:
            self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _sandbox_status(
        self, stub: pb_grpc.RuntimeServiceStub, sandbox_id: str, deadline: float
    ) -> _Pod | None:
        """A sandbox missing from the list (created since): ask for it; None when it is gone."""
        request = pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id)
        response: pb.PodSandboxStatusResponse | None = self._call_unless_not_found(
            "PodSandboxStatus", deadline, lambda timeout: stub.PodSandboxStatus(request, timeout=timeout)
        )
        return None if response is None else _pod_of(response.status)

    def _env(
        self, stub: pb_grpc.RuntimeServiceStub, container_id: str, wanted: frozenset[str], deadline: float
    ) -> dict[str, str] | None:
        """The wanted variables of one container; None when the container is gone."""
        request = pb.ContainerStatusRequest(container_id=container_id, verbose=True)
        response: pb.ContainerStatusResponse | None = self._call_unless_not_found(
            "ContainerStatus", deadline, lambda timeout: stub.ContainerStatus(request, timeout=timeout)
        )
        if response is None:
            return None
        env = env_from_verbose_info(response.info)
        return {name: value for name, value in sorted(env.items()) if name in wanted}

    def _call_unless_not_found(
        self, method: str, deadline: float, invoke: Callable[[float], _Response]
    ) -> _Response | None:
        try:
            return self._call(method, deadline, invoke)
        except SourceUnavailable as exc:
            if exc.error_type == "not_found":
                return None
            raise

    def _call(self, method: str, deadline: float, invoke: Callable[[float], _Response]) -> _Response:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SourceUnavailable(
                f"{self._channel.socket_path} {method}: out of time", error_type="deadline_exceeded"
            )
        try:
            return invoke(remaining)
        except grpc.RpcError as exc:
            failure = rpc_failure(exc, f"{self._channel.socket_path} {method}")
            if failure.error_type == "unavailable":
                self._channel.close()  # the next call connects afresh instead of backing off
            raise failure from exc
