"""Client of the kubelet's podresources gRPC API (v1): live pods, their exclusive CPUs, devices and
memory with NUMA affinity, and what the kubelet may allocate.

The kubelet serves it on ``<kubelet-root>/pod-resources/kubelet.sock``. The client keeps one channel
and reuses it across calls; the channel is created on first use and again only when the socket file
is replaced (the kubelet restarted), so a kubelet that comes and goes needs no new client.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc

from otel_numa.model import (
    AllocatableResources,
    ContainerDevices,
    ContainerMemory,
    ContainerResources,
    DraClaim,
    DraDevice,
    PodResources,
    shared_name,
    shared_set,
)
from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.proto import podresources_v1_pb2_grpc as pb_grpc
from otel_numa.sources.errors import SourceMissing, SourceUnavailable

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

_Response = TypeVar("_Response")


def rpc_failure(exc: grpc.RpcError, what: str) -> SourceUnavailable:
    """Turn a failed RPC into a :class:`SourceUnavailable` whose error type is the status code name."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    error_type = code.name.lower() if isinstance(code, grpc.StatusCode) else "unavailable"
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    return SourceUnavailable(f"{what}: {error_type}: {details or exc}", error_type=error_type)


class UnixSocketChannel:
    """A gRPC channel to a unix socket, created lazily and replaced when the socket file is.

    gRPC reconnects a channel by itself, but only after a back-off during which calls fail at once.
    A restarted server creates a new socket file, so a channel is replaced when the file's identity
    changes (inode numbers are reused, hence the change time too) and after a connection failure
    (the caller closes it), and the first call to a restarted server succeeds.
    """

    def __init__(self, socket_path: Path, *, max_message_bytes: int) -> None:
        self._socket_path = socket_path
        self._max_message_bytes = max_message_bytes
        self._channel: Any = None
        self._socket_identity: tuple[int, int, int] | None = None

    @property
    def socket_path(self) -> Path:
        return self._socket_path

    def get(self) -> Any:
        """The channel for the socket as it is now; SourceMissing when the socket is absent."""
        identity = self._current_socket_identity()
        if self._channel is not None and identity != self._socket_identity:
            self.close()
        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix://{os.path.abspath(self._socket_path)}",
                options=[
                    ("grpc.max_receive_message_length", self._max_message_bytes),
                    # A local server that restarts is back within seconds; do not wait minutes.
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                ],
            )
            self._socket_identity = identity
        return self._channel

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._socket_identity = None

    def _current_socket_identity(self) -> tuple[int, int, int]:
        try:
            info = os.stat(self._socket_path)
        except (FileNotFoundError, NotADirectoryError) as exc:
            self.close()
            raise SourceMissing(f"{self._socket_path}: no such socket") from exc
        except OSError as exc:
            raise SourceUnavailable(f"{self._socket_path}: {exc.strerror or exc}") from exc
        if not stat.S_ISSOCK(info.st_mode):
            raise SourceUnavailable(f"{self._socket_path}: not a socket", error_type="not_a_socket")
        return (info.st_dev, info.st_ino, info.st_ctime_ns)


class PodResourcesClient:
    """Reads the kubelet's podresources API over one persistent channel.

    Every call raises :class:`SourceMissing` when the socket does not exist (checked before any RPC,
    so it is immediate) and :class:`SourceUnavailable` when the RPC fails; its ``error_type`` is the
    gRPC status code in lower case (``unavailable``, ``deadline_exceeded``, ``unimplemented``,
    ``resource_exhausted`` for an answer above ``max_message_bytes``). No call blocks longer than
    ``timeout_s``. Safe to share between threads.
    """

    def __init__(
        self,
        socket_path: Path,
        *,
        timeout_s: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._channel = UnixSocketChannel(socket_path, max_message_bytes=max_message_bytes)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        # the last List answer (its wire form) and the pods read from it: between pod admissions the kubelet
        # answers the same, and comparing the bytes costs a hundredth of building the pods again
        self._last_list: tuple[bytes, tuple[PodResources, ...]] = (b"", ())

    def list_pods(self) -> tuple[PodResources, ...]:
        """The pods the kubelet runs now, with the resources it assigned to each container; the same tuple
        as last time while the answer is the same."""
        response: pb.ListPodResourcesResponse = self._call(
            "List", lambda stub: stub.List(pb.ListPodResourcesRequest(), timeout=self._timeout_s)
        )
        wire = response.SerializeToString(deterministic=True)
        last_wire, last_pods = self._last_list
        if wire and wire == last_wire:
            return last_pods
        pods = tuple(_pod_resources(pod) for pod in response.pod_resources)
        self._last_list = (wire, pods)
        return pods

    def allocatable(self) -> AllocatableResources:
        """What the kubelet may hand out; UNIMPLEMENTED on kubelets without GetAllocatableResources."""
        response: pb.AllocatableResourcesResponse = self._call(
            "GetAllocatableResources",
            lambda stub: stub.GetAllocatableResources(
                pb.AllocatableResourcesRequest(), timeout=self._timeout_s
            ),
        )
        return AllocatableResources(
            cpu_ids=shared_set(response.cpu_ids),
            devices=tuple(_devices(device) for device in response.devices),
            memory=tuple(_memory(block) for block in response.memory),
        )

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

    def _call(self, method: str, invoke: Callable[[pb_grpc.PodResourcesListerStub], _Response]) -> _Response:
        with self._lock:
            stub = pb_grpc.PodResourcesListerStub(self._channel.get())
            try:
                return invoke(stub)
            except grpc.RpcError as exc:
                failure = rpc_failure(exc, f"{self._channel.socket_path} {method}")
                if failure.error_type == "unavailable":
                    self._channel.close()  # the next call connects afresh instead of backing off
                raise failure from exc


def _numa_ids(topology: pb.TopologyInfo) -> tuple[int, ...]:
    return tuple(sorted({node.ID for node in topology.nodes}))


def _devices(device: pb.ContainerDevices) -> ContainerDevices:
    return ContainerDevices(
        resource_name=shared_name(device.resource_name),
        device_ids=tuple(device.device_ids),
        numa_ids=_numa_ids(device.topology),
    )


def _memory(block: pb.ContainerMemory) -> ContainerMemory:
    return ContainerMemory(memory_type=block.memory_type, size=block.size, numa_ids=_numa_ids(block.topology))


def _claim_device(resource: pb.ClaimResource) -> DraDevice:
    return DraDevice(
        driver=shared_name(resource.driver_name),
        pool=resource.pool_name,
        device=resource.device_name,
        cdi_devices=tuple(cdi.name for cdi in resource.cdi_devices),
        share_id=resource.share_id if resource.HasField("share_id") else None,
    )


def _claims(dynamic: Iterable[pb.DynamicResource]) -> tuple[DraClaim, ...]:
    return tuple(
        DraClaim(
            name=shared_name(claim.claim_name),
            namespace=shared_name(claim.claim_namespace),
            devices=tuple(_claim_device(resource) for resource in claim.claim_resources),
        )
        for claim in dynamic
    )


def _containers(containers: Iterable[pb.ContainerResources]) -> tuple[ContainerResources, ...]:
    return tuple(
        ContainerResources(
            name=shared_name(container.name),
            cpu_ids=shared_set(container.cpu_ids),
            devices=tuple(_devices(device) for device in container.devices),
            memory=tuple(_memory(block) for block in container.memory),
            dynamic_resources=_claims(container.dynamic_resources),
        )
        for container in containers
    )


def _pod_resources(pod: pb.PodResources) -> PodResources:
    return PodResources(
        name=shared_name(pod.name),
        namespace=shared_name(pod.namespace),
        containers=_containers(pod.containers),
        cpu_ids=shared_set(pod.cpu_ids),
        memory=tuple(_memory(block) for block in pod.memory),
    )
