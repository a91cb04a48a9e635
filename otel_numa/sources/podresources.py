"""Client of the kubelet's podresources gRPC API (v1): live pods, their exclusive CPUs, devices and
memory with NUMA affinity, and what the kubelet may allocate.

The kubelet serves it on ``<kubelet-root>/pod-resources/kubelet.sock``. The client keeps one channel
and reuses it across calls; the channel is created on first use and again only when the socket file
is replaced (the kubelet restarted), so a kubelet that comes and goes needs no new client.

What an answer may cost is bounded: gRPC refuses one larger than ``max_message_bytes``
(``resource_exhausted``), one of more than :data:`MAX_VALUES` values is refused before it is parsed, and
:mod:`otel_numa.sources.podresources_answer` refuses one naming ids the machine does not have or past its
caps (``out_of_range``, ``over_limit``). An answer is received as bytes and parsed only when they changed.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from otel_numa.model import AllocatableResources, PodResources
from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.sources.errors import SourceCorrupt, SourceMissing, SourceUnavailable
from otel_numa.sources.podresources_answer import OVER_LIMIT, AnswerReader, MachineLimits
from otel_numa.sources.wire_values import TooManyValues, check_values

# gRPC's own default (the kubelet's own clients take 16 MiB): a node of 5,000 containers with a device and
# two memory blocks each answers ~0.7 MB, and receiving an answer costs about three times its size.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Values (fields, list elements) one answer may hold: parsed, each costs up to ~45 bytes (~11 MB in all);
# a 5,000-container node's answer holds ~120,000. Counted from the bytes before they are parsed.
MAX_VALUES = 250_000
SERVICE = "/v1.PodResourcesLister/"

_Response = TypeVar("_Response", bound=Message)
_Value = TypeVar("_Value")


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
        # the digest of the last answer of each call (and the limits it was read with), and what was read
        # from it: between pod admissions the kubelet answers the same, and a digest of the bytes costs a
        # hundredth of parsing and building them again
        self._last: dict[str, tuple[bytes, MachineLimits, Any]] = {}
        # each method's callable, made once on the channel it was made on (a new channel: made again)
        self._calls_on: Any = None
        self._calls: dict[str, Any] = {}

    def list_pods(self, limits: MachineLimits | None = None) -> tuple[PodResources, ...]:
        """The pods the kubelet runs now, with the resources it assigned to each container; the same tuple
        as last time while the answer is the same."""
        pods: tuple[PodResources, ...] = self._read(
            "List",
            pb.ListPodResourcesRequest(),
            pb.ListPodResourcesResponse,
            lambda response, reader: reader.pods(response.pod_resources),
            limits or MachineLimits(),
        )
        return pods

    def allocatable(self, limits: MachineLimits | None = None) -> AllocatableResources:
        """What the kubelet may hand out; UNIMPLEMENTED on kubelets without GetAllocatableResources."""
        allocatable: AllocatableResources = self._read(
            "GetAllocatableResources",
            pb.AllocatableResourcesRequest(),
            pb.AllocatableResourcesResponse,
            lambda response, reader: reader.allocatable(response),
            limits or MachineLimits(),
        )
        return allocatable

    def close(self) -> None:
        with self._lock:
            self._channel.close()
            self._calls_on, self._calls = None, {}

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _read(
        self,
        method: str,
        request: Message,
        response_type: type[_Response],
        read: Callable[[_Response, AnswerReader], _Value],
        limits: MachineLimits,
    ) -> _Value:
        """The answer of ``method`` read by ``read(response, reader)``, or the last one's when the bytes and
        the limits are the same."""
        data = self._call(method, request)
        digest = hashlib.blake2b(data, digest_size=16).digest()
        last = self._last.get(method)
        if last is not None and last[0] == digest and last[1] == limits:
            kept: _Value = last[2]
            return kept
        what = f"{self._channel.socket_path} {method}"
        try:
            check_values(data, response_type.DESCRIPTOR, MAX_VALUES)
            response = response_type.FromString(data)
        except TooManyValues as exc:
            raise SourceCorrupt(f"{what}: {exc}; the answer is left out", error_type=OVER_LIMIT) from None
        except (DecodeError, SourceCorrupt) as exc:
            raise SourceCorrupt(f"{what}: the answer does not parse", error_type="parse_error") from exc
        del data  # the bytes, as large as the answer, are not kept while it is read
        value = read(response, AnswerReader(limits, what))
        if last is not None and last[0] == digest and last[2] == value:
            value = last[2]  # the same answer judged by new limits: the object the join already holds
        self._last[method] = (digest, limits, value)
        return value

    def _call(self, method: str, request: Message) -> bytes:
        """The answer's bytes (parsed by the caller, only when they changed)."""
        with self._lock:
            channel = self._channel.get()
            if channel is not self._calls_on:
                self._calls_on, self._calls = channel, {}
            call = self._calls.get(method)
            if call is None:
                call = self._calls[method] = channel.unary_unary(
                    SERVICE + method, request_serializer=type(request).SerializeToString
                )
            try:
                data: bytes = call(request, timeout=self._timeout_s)
                return data
            except grpc.RpcError as exc:
                failure = rpc_failure(exc, f"{self._channel.socket_path} {method}")
                if failure.error_type == "unavailable":
                    self._channel.close()  # the next call connects afresh instead of backing off
                    self._calls_on, self._calls = None, {}
                raise failure from exc
