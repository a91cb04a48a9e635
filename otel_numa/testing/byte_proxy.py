"""A TCP relay on loopback that counts the bytes clients send through it: the size of OTLP pushes on the
wire (gRPC or HTTP framing and compression included) between agents and a collector."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Self

from otel_numa.testing.peers import free_port


class ByteCountingProxy:
    """Listens on 127.0.0.1:``port`` and relays every connection to 127.0.0.1:``upstream_port``."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.sent = 0  # client -> upstream
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port), backlog=128)
        self._closed = False

    def start(self) -> Self:
        threading.Thread(target=self._accept, name="byte-proxy", daemon=True).start()
        return self

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, counted: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if counted:
                    with self._lock:
                        self.sent += len(chunk)
                target.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, target):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()
