"""How the agent's HTTP servers (the Prometheus page and the probes) run: one thread that accepts connections
and waits for each one's request head, and a few long-lived worker threads that answer complete requests.

Only a connection whose whole request head has arrived (after its TLS handshake, on the TLS page) reaches a
worker, so slow or silent clients cannot starve the workers: they wait in the accepting thread, which reads
without blocking, and are closed when their head is not in after ``HEAD_TIMEOUT_S``. Each port holds at most
``MAX_CONNECTIONS`` connections; at the cap the oldest connection still waiting for its head is closed to make
room (a real scraper sends its head at once), else accepting pauses until one ends. Running out of file
descriptors pauses accepting with a growing back-off instead of retrying at once. Failed connections are
logged once per kind and counted (:mod:`otel_numa.endpoints.connection_failures`).

socketserver's usual way polls the listening socket twice a second and starts a thread per connection; here
an idle server sleeps in ``select`` and idle workers block on their queue, at no cost.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import queue
import selectors
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otel_numa.endpoints.connection_failures import (
    CAPPED,
    HEAD_TIMEOUT,
    HEAD_TOO_LARGE,
    OUT_OF_DESCRIPTORS,
    ConnectionFailures,
    is_out_of_descriptors,
    kind_of,
)

log = logging.getLogger(__name__)

MAX_WORKERS = 8  # requests answered at once; Prometheus scrapes one at a time, probes are tiny
MAX_CONNECTIONS = 64  # per port: waiting for their head, queued or being answered
HEAD_TIMEOUT_S = 5.0  # from accept to a complete request head, TLS handshake included
REQUEST_TIMEOUT_S = 10.0  # per socket read or write once the head is in (Prometheus' scrape timeout is 10 s)
MAX_HEAD_BYTES = 64 * 1024  # larger heads are answered 431, as http.server answers an over-long line
LISTEN_BACKLOG = 1024  # a fleet's Prometheus replicas and probes connecting at once (the kernel caps it)
EVICT_AFTER_S = 0.25  # at the cap, a connection waiting this long for its head is closed for a new one
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.05, 2.0  # accepting pauses this long when descriptors run out (doubling)

_TOO_LARGE = b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_STOP, _SLOT_FREED = b"x", b"s"


def address_family(host: str, port: int) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 address such as ``::``, AF_INET otherwise."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return infos[0][0]


class Workers:
    """Daemon threads named ``name``, made on demand up to ``limit`` and kept, that run submitted tasks.

    Not concurrent.futures' pool: its threads are joined at interpreter exit, so one connection stuck in a
    write would hold up a SIGTERM for the whole request timeout."""

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


class _HeadThenSocket(io.RawIOBase):
    """Reads the bytes the accepting thread already took from the connection, then the connection."""

    def __init__(self, head: bytes, connection: socket.socket) -> None:
        self._head = memoryview(head)
        self._connection = connection

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size] = self._head[:size]
            self._head = self._head[size:]
            return size
        return self._connection.recv_into(buffer)


class _HeadFirst(socketserver.StreamRequestHandler):
    """Mixed in ahead of a server's handler: its ``rfile`` starts with the head already read."""

    server: Any

    def setup(self) -> None:
        super().setup()
        head = self.server.take_head(self.request)
        if head:
            self.rfile.close()
            self.rfile = io.BufferedReader(_HeadThenSocket(head, self.connection))


class PooledMixIn:
    """Mixed into a socketserver TCP server ahead of it: binds ``host:port`` in the address's family with a
    listen backlog of ``LISTEN_BACKLOG``; :class:`Serving` accepts and hands complete requests to
    :class:`Workers`. ``thread_name`` names the accepting thread and the workers and the log lines."""

    thread_name: str
    address_family: int
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, host: str, port: int, handler: type[socketserver.BaseRequestHandler]) -> None:
        self.address_family = address_family(host, port)
        self.workers = Workers(f"{self.thread_name}-worker", MAX_WORKERS)
        self.failures = ConnectionFailures(self.thread_name)
        self._heads: dict[int, bytes] = {}
        self._heads_lock = threading.Lock()
        with_head = type(handler.__name__, (_HeadFirst, handler), {})
        super().__init__((host, port), with_head)  # type: ignore[call-arg]  # the server class mixed in

    def give_head(self, request: socket.socket, head: bytes) -> None:
        with self._heads_lock:
            self._heads[id(request)] = head

    def take_head(self, request: socket.socket) -> bytes:
        with self._heads_lock:
            return self._heads.pop(id(request), b"")

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A socket error is the client's (reset, timeout): counted, no traceback. Anything else is a bug."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            self.failures.count(kind_of(error), client_address)
        else:
            super().handle_error(request, client_address)  # type: ignore[misc]  # the server class mixed in


@dataclass
class _Waiting:
    """A connection whose request head has not all arrived yet."""

    connection: socket.socket
    address: Any
    accepted_at: float
    head: bytearray = field(default_factory=bytearray)
    handshaken: bool = False
    events: int = selectors.EVENT_READ  # what the selector waits for: TLS may need to write to read on


class Serving:
    """Runs ``server`` (a :class:`PooledMixIn` server) in a thread of its own until :meth:`stop`."""

    def __init__(self, server: socketserver.TCPServer) -> None:
        if not isinstance(server, PooledMixIn):
            raise TypeError(f"{type(server).__name__} does not answer on a pool of workers")
        self.server: socketserver.TCPServer = server
        self._pooled: PooledMixIn = server
        self._workers: Workers = server.workers
        self._failures = server.failures
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=server.thread_name, daemon=True)
        self._selector = selectors.DefaultSelector()
        self._waiting: dict[socket.socket, _Waiting] = {}  # in accept order: the oldest first
        self._ready: list[tuple[socket.socket, Any]] = []  # complete heads, handed over before the next sleep
        self._lock = threading.Lock()
        self._open = 0  # connections accepted and not yet closed
        self._paused_at_cap = False
        self._listening = False
        self._resume_at: float | None = None  # accepting paused until then (descriptors ran out)
        self._backoff_s = BACKOFF_FIRST_S

    def start(self) -> None:
        self.server.socket.setblocking(False)
        self._thread.start()

    # the accepting thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        selector = self._selector
        selector.register(self._wake_read, selectors.EVENT_READ)
        self._listen(True)
        try:
            while True:
                for key, _events in selector.select(self._next_timeout()):
                    if key.fileobj == self._wake_read:
                        if _STOP in os.read(self._wake_read, 512):
                            return
                    elif key.fileobj is self.server.socket:
                        self._accept()
                    else:
                        self._advance(key.data)
                self._expire()
                self._update_listening()
                self._submit_ready()
        finally:
            for waiting in list(self._waiting.values()):
                self._close(waiting)
            for connection, _address in self._ready:  # complete, but stopping came first
                connection.close()
                with self._lock:
                    self._open -= 1
            selector.close()

    def _next_timeout(self) -> float | None:
        """Seconds until the next deadline: a head timeout, an eviction or the end of a back-off."""
        moments = []
        if self._waiting:
            oldest = next(iter(self._waiting.values())).accepted_at
            moments.append(oldest + (EVICT_AFTER_S if self._paused_at_cap else HEAD_TIMEOUT_S))
        if self._resume_at is not None:
            moments.append(self._resume_at)
        if not moments:
            return None  # idle: sleep until a connection or a stop
        return max(0.0, min(moments) - time.monotonic())

    def _listen(self, on: bool) -> None:
        if on != self._listening:
            if on:
                self._selector.register(self.server.socket, selectors.EVENT_READ)
            else:
                self._selector.unregister(self.server.socket)
            self._listening = on

    def _update_listening(self) -> None:
        now = time.monotonic()
        if self._resume_at is not None and now >= self._resume_at:
            self._resume_at = None
        with self._lock:
            at_cap = self._open >= MAX_CONNECTIONS
            if at_cap and self._waiting:
                oldest = next(iter(self._waiting.values()))
                if now - oldest.accepted_at >= EVICT_AFTER_S:
                    self._failures.count(CAPPED, oldest.address)
                    self._close_locked(oldest)
                    at_cap = False
            self._paused_at_cap = at_cap
        self._listen(not at_cap and self._resume_at is None)

    def _accept(self) -> None:
        while True:
            with self._lock:
                if self._open >= MAX_CONNECTIONS:
                    return
            try:
                connection, address = self.server.socket.accept()
            except (BlockingIOError, InterruptedError):
                self._backoff_s = BACKOFF_FIRST_S
                return
            except OSError as error:
                if is_out_of_descriptors(error):
                    self._out_of_descriptors()
                    return
                self._failures.count(kind_of(error))  # ECONNABORTED and the like: the next one may do
                continue
            with self._lock:
                self._open += 1
            connection.setblocking(False)
            waiting = _Waiting(connection, address, time.monotonic())
            self._waiting[connection] = waiting
            self._selector.register(connection, selectors.EVENT_READ, waiting)
            self._advance(waiting)  # most clients sent their request with the connection

    def _out_of_descriptors(self) -> None:
        """Pause accepting (new connections stay in the kernel's queue), and give back the descriptors of the
        connections that have waited long for their head: the agent's own file reads need them too."""
        self._failures.count(OUT_OF_DESCRIPTORS)
        now = time.monotonic()
        self._resume_at = now + self._backoff_s
        self._backoff_s = min(BACKOFF_MAX_S, self._backoff_s * 2)
        for waiting in list(self._waiting.values()):
            if now - waiting.accepted_at < EVICT_AFTER_S:
                break  # in accept order: the rest are younger
            self._failures.count(CAPPED, waiting.address)
            self._close(waiting)

    def _advance(self, waiting: _Waiting) -> None:
        """Go on with the handshake or the head as far as the client has sent; hand over a complete head."""
        connection = waiting.connection
        try:
            if isinstance(connection, ssl.SSLSocket) and not waiting.handshaken:
                connection.do_handshake()
                waiting.handshaken = True
            while True:
                chunk = connection.recv(MAX_HEAD_BYTES + 1 - len(waiting.head))
                if not chunk:  # the client gave up
                    self._close(waiting)
                    return
                start = max(0, len(waiting.head) - 3)
                waiting.head += chunk
                if waiting.head.find(b"\r\n\r\n", start) >= 0 or waiting.head.find(b"\n\n", start) >= 0:
                    self._hand_over(waiting)
                    return
                if len(waiting.head) > MAX_HEAD_BYTES:
                    self._failures.count(HEAD_TOO_LARGE, waiting.address)
                    _send_quietly(connection, _TOO_LARGE)
                    self._close(waiting)
                    return
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            self._wait_for(waiting, selectors.EVENT_READ)  # more to come: the selector says when
        except ssl.SSLWantWriteError:
            self._wait_for(waiting, selectors.EVENT_WRITE)
        except OSError as error:  # ssl.SSLError included: a refused client certificate, plain HTTP on TLS
            self._failures.count(kind_of(error), waiting.address)
            self._close(waiting)

    def _wait_for(self, waiting: _Waiting, events: int) -> None:
        if waiting.events != events:
            self._selector.modify(waiting.connection, events, waiting)
            waiting.events = events

    def _expire(self) -> None:
        deadline = time.monotonic() - HEAD_TIMEOUT_S
        while self._waiting:
            oldest = next(iter(self._waiting.values()))
            if oldest.accepted_at > deadline:
                return
            self._failures.count(HEAD_TIMEOUT, oldest.address)
            self._close(oldest)

    def _hand_over(self, waiting: _Waiting) -> None:
        connection = waiting.connection
        self._selector.unregister(connection)
        del self._waiting[connection]
        connection.settimeout(REQUEST_TIMEOUT_S)
        self._pooled.give_head(connection, bytes(waiting.head))
        self._ready.append((connection, waiting.address))

    def _submit_ready(self) -> None:
        """Hand the complete requests to the workers, last before the selector sleeps: a worker woken
        earlier would wait for this thread's bookkeeping to let go of the interpreter."""
        ready, self._ready = self._ready, []
        for connection, address in ready:
            self._workers.submit(functools.partial(self._answer, connection, address))

    def _close(self, waiting: _Waiting) -> None:
        with self._lock:
            self._close_locked(waiting)

    def _close_locked(self, waiting: _Waiting) -> None:
        self._selector.unregister(waiting.connection)
        del self._waiting[waiting.connection]
        waiting.connection.close()
        self._open -= 1

    # a worker ---------------------------------------------------------------------------------------

    def _answer(self, request: socket.socket, client_address: Any) -> None:
        server = self.server
        try:
            server.finish_request(request, client_address)
        except Exception:
            server.handle_error(request, client_address)
        finally:
            self._pooled.take_head(request)  # when the handler failed before taking it
            server.shutdown_request(request)
            with self._lock:
                self._open -= 1
                if self._paused_at_cap and not self._stopped:  # the accepting thread waits for a slot
                    _write_quietly(self._wake_write, _SLOT_FREED)

    # stopping ---------------------------------------------------------------------------------------

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, close the listening socket and let answers in progress finish on their own."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True  # under the lock: no worker writes to the pipe from now on
            _write_quietly(self._wake_write, _STOP)
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.server.server_close()
        self._workers.stop()
        self._failures.flush()
        if not self._thread.is_alive():  # a number still polled must not be reused
            self._selector.close()
            for fd in (self._wake_read, self._wake_write):
                os.close(fd)


def _send_quietly(connection: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # best effort: the connection is closed next
        connection.send(data)


def _write_quietly(fd: int, data: bytes) -> None:
    with contextlib.suppress(BlockingIOError):  # the pipe is full of wakeups already
        os.write(fd, data)
