"""A stand-in kubelet podresources server (v1) on a unix socket, written from the published API.

It serves ``/v1.PodResourcesLister/List``, ``Get`` and ``GetAllocatableResources``
from :class:`PodResourcesState`, which a test may change at any time. ``delay_s`` makes every
call wait first (a slow kubelet), ``allocatable_unimplemented`` makes GetAllocatableResources answer
UNIMPLEMENTED (kubelets before the method existed).

In a test::

    with PodResourcesServer() as server:
        server.state.pods = [pb.PodResources(name="web", namespace="shop")]
        client = PodResourcesClient(server.socket_path)

In a separate process (prints ``ready`` once it listens; SIGTERM stops it)::

    python -m otel_numa.testing.podresources_server --socket /tmp/x/kubelet.sock --state state.json

where ``state.json`` is ``{"pods": [<PodResources in protobuf JSON>], "allocatable":
<AllocatableResourcesResponse in protobuf JSON>}``; with ``--reload`` the file is read again at the next
call after it was replaced (a benchmark's pod churn).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc
from google.protobuf import json_format

from otel_numa.proto import podresources_v1_pb2 as pb
from otel_numa.proto import podresources_v1_pb2_grpc as pb_grpc


@dataclass
class PodResourcesState:
    pods: list[pb.PodResources] = field(default_factory=list)
    allocatable: pb.AllocatableResourcesResponse = field(default_factory=pb.AllocatableResourcesResponse)
    delay_s: float = 0.0
    allocatable_unimplemented: bool = False


def short_socket_dir() -> Path:
    """A fresh directory with a short path: unix socket paths are limited to 107 bytes."""
    return Path(tempfile.mkdtemp(prefix="otel-numa-sock-"))


class _Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(self, server: PodResourcesServer) -> None:
        self._server = server

    def List(self, request: pb.ListPodResourcesRequest, context: Any) -> pb.ListPodResourcesResponse:
        self._server.begin_call("List", context, self._server.state.delay_s)
        return pb.ListPodResourcesResponse(pod_resources=self._server.state.pods)

    def Get(self, request: pb.GetPodResourcesRequest, context: Any) -> pb.GetPodResourcesResponse:
        """One pod by name and namespace; NOT_FOUND when the kubelet runs no such pod (as it answers)."""
        self._server.begin_call("Get", context, self._server.state.delay_s)
        for pod in self._server.state.pods:
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pb.GetPodResourcesResponse(pod_resources=pod)
        context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("unreachable")

    def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: Any
    ) -> pb.AllocatableResourcesResponse:
        self._server.begin_call("GetAllocatableResources", context, self._server.state.delay_s)
        if self._server.state.allocatable_unimplemented:
            context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "unknown method GetAllocatableResources for service v1.PodResourcesLister",
            )
        response = pb.AllocatableResourcesResponse()
        response.CopyFrom(self._server.state.allocatable)
        return response


class UnixGrpcServer:
    """A real ``grpc.server`` bound to ``unix://<socket_path>``; a context manager.

    Without a socket path it binds in a fresh short-named directory of its own. ``calls`` counts the
    calls per method; ``on_call`` (if set) runs at the start of every call with the method name, so a
    test can change the state between two calls of one client operation.
    """

    socket_name = "server.sock"

    def __init__(self, socket_path: Path | None = None) -> None:
        self._owned_dir: Path | None = None
        if socket_path is None:
            self._owned_dir = short_socket_dir()
            socket_path = self._owned_dir / self.socket_name
        self.socket_path = socket_path
        self.calls: Counter[str] = Counter()
        self.on_call: Callable[[str], None] | None = None
        self._server: Any = None
        self._stopping = threading.Event()

    def add_servicers(self, server: Any) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._stopping.clear()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.add_servicers(self._server)
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop serving; gRPC removes the socket file, as a server that exits cleanly does."""
        self._stopping.set()  # wakes delayed handlers so their threads end now
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def close(self) -> None:
        self.stop()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)

    def begin_call(self, method: str, context: Any, delay_s: float) -> None:
        """Count the call, run ``on_call``, then wait ``delay_s`` unless the call ends first."""
        self.calls[method] += 1
        if self.on_call is not None:
            self.on_call(method)
        if delay_s <= 0:
            return
        finished = threading.Event()
        context.add_callback(finished.set)  # the client gave up or the server stopped
        deadline = time.monotonic() + delay_s
        while not finished.is_set() and not self._stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            finished.wait(min(0.05, remaining))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class PodResourcesServer(UnixGrpcServer):
    socket_name = "kubelet.sock"

    def __init__(self, socket_path: Path | None = None, state: PodResourcesState | None = None) -> None:
        super().__init__(socket_path)
        self.state = state if state is not None else PodResourcesState()

    def add_servicers(self, server: Any) -> None:
        pb_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), server)


STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def run_until_signalled(server: UnixGrpcServer) -> None:
    """Serve until SIGTERM or SIGINT, after printing ``ready`` for the parent process.

    The signals are blocked before gRPC makes its threads (which inherit the mask) and the main thread takes
    them with ``sigwait``: with a Python handler, the kernel may hand the signal to one of gRPC's threads,
    and the handler then waits for a main thread asleep on a lock that nothing interrupts."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    server.start()
    print("ready", flush=True)
    signal.sigwait(STOP_SIGNALS)
    server.stop()


def load_state(path: Path) -> PodResourcesState:
    document = json.loads(path.read_text())
    pods = [json_format.ParseDict(pod, pb.PodResources()) for pod in document.get("pods", [])]
    allocatable = json_format.ParseDict(document.get("allocatable", {}), pb.AllocatableResourcesResponse())
    return PodResourcesState(pods=pods, allocatable=allocatable)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--state", type=Path, help="JSON file with pods and allocatable")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each call waits first")
    parser.add_argument("--allocatable-unimplemented", action="store_true")
    parser.add_argument("--reload", action="store_true", help="read --state again when it was replaced")
    args = parser.parse_args()

    state = load_state(args.state) if args.state else PodResourcesState()
    state.delay_s = args.delay
    state.allocatable_unimplemented = args.allocatable_unimplemented
    server = PodResourcesServer(args.socket, state)
    if args.reload and args.state:
        server.on_call = _reloading(server, args.state)
    run_until_signalled(server)


def _reloading(server: PodResourcesServer, path: Path) -> Callable[[str], None]:
    """Reads ``path`` again into the server's pods and allocatable when its inode or mtime changed."""
    seen = [path.stat()]

    def reload(_method: str) -> None:
        status = path.stat()
        if (status.st_ino, status.st_mtime_ns) != (seen[0].st_ino, seen[0].st_mtime_ns):
            seen[0] = status
            fresh = load_state(path)
            server.state.pods, server.state.allocatable = fresh.pods, fresh.allocatable

    return reload


if __name__ == "__main__":
    main()
