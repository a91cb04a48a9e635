"""How the agent's HTTP servers (the Prometheus page and the probes) run: one accept loop that sleeps until a
connection arrives or the server stops, and a few long-lived worker threads that answer.

socketserver's usual way polls the listening socket twice a second and starts a thread per connection; on a
node every wakeup and thread start is CPU spent for nothing (tens of microseconds each on a small VM). Idle
workers block on their queue and cost nothing. Each connection has ``REQUEST_TIMEOUT_S`` per read or write,
so a client that connects and stays silent holds a worker only that long.
"""

from __future__ import annotations

import os
import selectors
import socket
import socketserver
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MAX_WORKERS = 8  # concurrent requests; Prometheus scrapes one at a time, probes are tiny
REQUEST_TIMEOUT_S = 30.0  # per socket read or write of one connection (Prometheus' scrape timeout is 10 s)


def address_family(host: str, port: int) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 address such as ``::``, AF_INET otherwise."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


class PooledMixIn:
    """Mixed into a socketserver TCP server ahead of it: requests are answered by a pool of worker threads,
    made on demand up to ``MAX_WORKERS`` and kept, instead of a new thread per connection."""

    workers: ThreadPoolExecutor

    def process_request(self, request: Any, client_address: Any) -> None:
        self.workers.submit(self._answer, request, client_address)

    def _answer(self, request: Any, client_address: Any) -> None:
        server: Any = self  # a socketserver.BaseServer by construction
        try:
            server.finish_request(request, client_address)
        except Exception:
            server.handle_error(request, client_address)
        finally:
            server.shutdown_request(request)


class Serving:
    """Runs ``server`` (a :class:`PooledMixIn` server) in a thread named ``name`` until :meth:`stop`."""

    def __init__(self, server: socketserver.TCPServer, name: str) -> None:
        if not isinstance(server, PooledMixIn):
            raise TypeError(f"{type(server).__name__} does not answer on a pool of workers")
        self.server = server
        server.timeout = 0  # handle_request() is called only once the socket is readable
        self._workers = server.workers = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix=f"{name}-worker")
        self._wake_read, self._wake_write = os.pipe()
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, name=name, daemon=True)

    def start(self) -> None:
        # Non-blocking: a connection reset between the wakeup and accept() must not block the loop.
        self.server.socket.setblocking(False)
        self._thread.start()

    def _accept(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.server.socket, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while True:
                ready = {key.fileobj for key, _events in selector.select()}
                if self._wake_read in ready:
                    return
                self.server.handle_request()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, close the listening socket and let answers in progress finish on their own."""
        if self._stopped:
            return
        self._stopped = True
        os.write(self._wake_write, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.server.server_close()
        self._workers.shutdown(wait=False, cancel_futures=True)
        if not self._thread.is_alive():  # a number still polled must not be reused
            for fd in (self._wake_read, self._wake_write):
                os.close(fd)
