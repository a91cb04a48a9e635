"""``/healthz`` (the process serves and collection makes progress) and ``/readyz`` (the first snapshot was
taken) for probes, by ``GET`` or ``HEAD``."""

from __future__ import annotations

from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer

from otel_numa.endpoints.serving import REQUEST_TIMEOUT_S, PooledMixIn, Serving


class _PooledHTTPServer(PooledMixIn, HTTPServer):
    thread_name = "health-http"


class HealthServer:
    def __init__(
        self, host: str, port: int, ready: Callable[[], bool], healthy: Callable[[], bool] = lambda: True
    ) -> None:
        is_ready, is_healthy = ready, healthy

        class Handler(BaseHTTPRequestHandler):
            timeout = REQUEST_TIMEOUT_S

            def do_GET(self) -> None:
                status, body = self._status()
                self._answer(status, body)
                self.wfile.write(body)

            def do_HEAD(self) -> None:
                status, body = self._status()
                self._answer(status, body)

            def _status(self) -> tuple[int, bytes]:
                if self.path == "/healthz":
                    if is_healthy():
                        return 200, b"ok\n"
                    return 503, b"collection stalled\n"  # a liveness probe restarts a stuck agent
                if self.path == "/readyz":
                    return (200, b"ready\n") if is_ready() else (503, b"no snapshot yet\n")
                return 404, b"not found\n"

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: stay quiet
                pass

        self._serving = Serving(_PooledHTTPServer(host, port, Handler))

    @property
    def port(self) -> int:
        return int(self._serving.server.server_address[1])

    def start(self) -> None:
        self._serving.start()

    def stop(self) -> None:
        self._serving.stop()
