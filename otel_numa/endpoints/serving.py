"""How the agent's HTTP servers (the Prometheus page and the probes) run: one accept loop that sleeps until a
connection arrives or the server stops, and a few long-lived worker threads that answer.

socketserver's usual way polls the listening socket twice a second and starts a thread per connection; on a
node every wakeup and thread start is CPU spent for nothing (tens of microseconds each on a small VM). Idle
workers block on their queue and cost nothing. Each connection has ``REQUEST_TIMEOUT_S`` per read or write,
so a client that connects and stays silent holds a worker only that long; workers are daemon threads, so
such a client never holds up the process's exit either.
"""

from __future__ import annotations

import functools
import os
import queue
import selectors
import socket
import socketserver
import threading
from collections.abc import Callable
from typing import Any

MAX_WORKERS = 8  # concurrent requests; Prometheus scrapes one at a time, probes are tiny
REQUEST_TIMEOUT_S = 30.0  # per socket read or write of one connection (Prometheus' scrape timeout is 10 s)


def address_family(host: str, port: int) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 address such as ``::``, AF_INET otherwise."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


class Workers:
    """Daemon threads named ``name``, made on demand up to ``limit`` and kept, that run submitted tasks.

    Not concurrent.futures' pool: its threads are joined at interpreter exit, so one connection stuck in a
    read would hold up a SIGTERM for the whole request timeout."""

    def __init__(self, name: str, limit: int) -> None:
        self._name = name
        self._limit = limit
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # one token per worker waiting for a task
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def submit(self, task: Callable[[], None]) -> None:
        self._tasks.put(task)
        if self._idle.acquire(blocking=False):
            return  # a waiting worker takes it
        with self._lock:
            if len(self._threads) < self._limit:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                task()
            finally:
                self._idle.release()

    def stop(self) -> None:
        """Each worker ends after the task it is running, if any."""
        with self._lock:
            for _ in self._threads:
                self._tasks.put(None)


class PooledMixIn:
    """Mixed into a socketserver TCP server ahead of it: binds ``host:port`` in the address's family, and
    requests are answered by :class:`Workers`, at most ``MAX_WORKERS`` at once, instead of a new thread per
    connection. ``thread_name`` names the accepting thread; the workers are named after it."""

    thread_name: str
    address_family: int
    timeout: float | None = 0  # handle_request() is called only once the socket is readable

    def __init__(self, host: str, port: int, handler: type[socketserver.BaseRequestHandler]) -> None:
        self.address_family = address_family(host, port)
        self.workers = Workers(f"{self.thread_name}-worker", MAX_WORKERS)
        super().__init__((host, port), handler)  # type: ignore[call-arg]  # the server class mixed in

    def process_request(self, request: Any, client_address: Any) -> None:
        self.workers.submit(functools.partial(self._answer, request, client_address))

    def _answer(self, request: Any, client_address: Any) -> None:
        server: Any = self  # a socketserver.BaseServer by construction
        try:
            server.finish_request(request, client_address)
        except Exception:
            server.handle_error(request, client_address)
        finally:
            server.shutdown_request(request)


class Serving:
    """Runs ``server`` (a :class:`PooledMixIn` server) in a thread of its own until :meth:`stop`."""

    def __init__(self, server: socketserver.TCPServer) -> None:
        if not isinstance(server, PooledMixIn):
            raise TypeError(f"{type(server).__name__} does not answer on a pool of workers")
        self.server: socketserver.TCPServer = server
        self._workers: Workers = server.workers
        self._wake_read, self._wake_write = os.pipe()
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, name=server.thread_name, daemon=True)

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
        self._workers.stop()
        if not self._thread.is_alive():  # a number still polled must not be reused
            for fd in (self._wake_read, self._wake_write):
                os.close(fd)
