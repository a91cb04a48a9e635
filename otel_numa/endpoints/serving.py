"""How the agent's HTTP servers (the Prometheus page and the probes) run: one thread that accepts connections
and waits for each one's request head, and a few long-lived worker threads that answer complete requests.

Only a connection whose whole request head has arrived (after its TLS handshake, on the TLS page) reaches a
worker, so slow or silent clients cannot starve the workers: they wait in the accepting thread, which reads
without blocking, and are closed when their head is not in after ``HEAD_TIMEOUT_S``. A worker writes its
answer into memory and sends what the connection takes at once; the rest is sent by the accepting thread,
without blocking, so a client that asks and never reads holds no worker either. Each answer has
``ANSWER_TIMEOUT_S`` from its complete head to its last byte, by the wall clock; an answer not taken by then
is dropped and its connection reset. Answers being written or sent hold about ``MAX_HELD_BYTES`` at most:
past it, complete requests wait for room, and an answer whose client has read nothing for ``EVICT_AFTER_S``
is dropped to make it. Each port holds at most
``MAX_CONNECTIONS`` connections; at the cap the oldest connection still waiting for its head, else the answer
whose client has stopped reading longest, is closed to make room (a real scraper sends its head at once and
reads its answer as it comes), else accepting pauses until one ends. Running out of file descriptors pauses
accepting with a growing back-off instead of retrying at once. Failed connections are logged once per kind
and counted (:mod:`otel_numa.endpoints.connection_failures`).

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
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otel_numa.endpoints.connection_failures import (
    ANSWER_NOT_READ,
    CAPPED,
    HEAD_TIMEOUT,
    HEAD_TOO_LARGE,
    OUT_OF_DESCRIPTORS,
    RESET,
    ConnectionFailures,
    is_out_of_descriptors,
    kind_of,
)

log = logging.getLogger(__name__)

MAX_WORKERS = 8  # requests answered at once; Prometheus scrapes one at a time, probes are tiny
MAX_CONNECTIONS = 64  # per port: waiting for their head, queued or being answered
HEAD_TIMEOUT_S = 5.0  # from accept to a complete request head, TLS handshake included
REQUEST_TIMEOUT_S = 10.0  # per socket read once the head is in (Prometheus' scrape timeout is 10 s)
ANSWER_TIMEOUT_S = 10.0  # from a complete head to the answer's last byte sent, by the wall clock
MAX_HELD_BYTES = 16 * 1024 * 1024  # per port: answers being sent (and about to be written), held whole
SEND_CHUNK_BYTES = 256 * 1024  # per non-blocking send: the same length is offered again after a TLS retry
MAX_HEAD_BYTES = 64 * 1024  # larger heads are answered 431, as http.server answers an over-long line
LISTEN_BACKLOG = 1024  # a fleet's Prometheus replicas and probes connecting at once (the kernel caps it)
EVICT_AFTER_S = 0.25  # at the cap, a connection waiting this long for its head is closed for a new one
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.05, 2.0  # accepting pauses this long when descriptors run out (doubling)

_TOO_LARGE = b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_STOP, _SLOT_FREED, _TO_SEND = b"x", b"s", b"w"
# where a request is when its connection ends: waiting for room, in a worker's hands, or being sent
_WAITING, _WORKING, _SENDING = "waiting", "working", "sending"
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset, drops what is unsent


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
    """Mixed in ahead of a server's handler: its ``rfile`` starts with the head already read, and its
    ``wfile`` keeps the answer in memory for :class:`Serving` to send."""

    server: Any

    def setup(self) -> None:
        super().setup()
        head = self.server.take_head(self.request)
        if head:
            self.rfile.close()
            self.rfile = io.BufferedReader(_HeadThenSocket(head, self.connection))
        self.wfile.close()
        self.wfile = io.BytesIO()

    def finish(self) -> None:
        answer = self.wfile
        assert isinstance(answer, io.BytesIO)
        self.server.give_answer(self.request, memoryview(answer.getvalue()))
        super().finish()


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
        self._answers: dict[int, memoryview] = {}
        self._heads_lock = threading.Lock()
        with_head = type(handler.__name__, (_HeadFirst, handler), {})
        super().__init__((host, port), with_head)  # type: ignore[call-arg]  # the server class mixed in

    def give_head(self, request: socket.socket, head: bytes) -> None:
        with self._heads_lock:
            self._heads[id(request)] = head

    def take_head(self, request: socket.socket) -> bytes:
        with self._heads_lock:
            return self._heads.pop(id(request), b"")

    def give_answer(self, request: socket.socket, answer: memoryview) -> None:
        with self._heads_lock:
            self._answers[id(request)] = answer

    def take_answer(self, request: socket.socket) -> memoryview | None:
        with self._heads_lock:
            return self._answers.pop(id(request), None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A socket error is the client's (reset, timeout): counted, no traceback. Anything else is a bug."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            self.failures.count(kind_of(error), client_address)
        else:
            super().handle_error(request, client_address)  # type: ignore[misc]  # the server class mixed in


@dataclass
class _Sending:
    """An answer that its connection has not taken all of yet."""

    connection: socket.socket
    address: Any
    answer: memoryview
    deadline: float
    progressed_at: float  # when the client last took some of it
    sent: int = 0
    offered: int = 0  # a TLS write that must be retried: the length offered (OpenSSL wants it again)
    events: int = selectors.EVENT_WRITE


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
        # complete heads with their answers' deadlines, handed to the workers before the next sleep
        self._ready: list[tuple[socket.socket, Any, float]] = []
        self._in_work = 0  # requests handed to the workers whose answers are not back yet
        self._per_peer: Counter[str] = Counter()  # requests handed to the workers and not ended, by peer
        self._answer_bytes = 0  # what one more answer holds: the recent answers' largest, slowly forgotten
        self._room_wanted = False  # complete requests wait for answers to be sent (or dropped)
        self._sending: dict[socket.socket, _Sending] = {}  # answers being sent by this thread
        self._held = 0  # bytes of those answers (held whole until sent)
        self._to_send: list[_Sending] = []  # handed over by the workers, under the lock
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
                    elif isinstance(key.data, _Sending):
                        self._send(key.data)
                    else:
                        self._advance(key.data)
                self._take_over_sending()
                self._expire()
                self._update_listening()
                self._submit_ready()
        finally:
            for waiting in list(self._waiting.values()):
                self._close(waiting)
            with self._lock:
                handed, self._to_send = self._to_send, []
            for sending in [*self._sending.values(), *handed]:
                self._drop(sending)
            for connection, _address, _deadline in self._ready:  # complete, but stopping came first
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
        if self._sending:
            moments.append(min(sending.deadline for sending in self._sending.values()))
            if self._paused_at_cap or self._room_wanted:
                stalled = min(sending.progressed_at for sending in self._sending.values())
                moments.append(stalled + EVICT_AFTER_S)
        if self._ready:
            moments.append(min(deadline for _connection, _address, deadline in self._ready))
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
        if at_cap and self._sending:
            stalled = min(self._sending.values(), key=lambda sending: sending.progressed_at)
            if now - stalled.progressed_at >= EVICT_AFTER_S:
                self._failures.count(CAPPED, stalled.address)
                self._drop(stalled)
                at_cap = False
        with self._lock:
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
        self._expire_sending()
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
        self._ready.append((connection, waiting.address, time.monotonic() + ANSWER_TIMEOUT_S))

    def _submit_ready(self) -> None:
        """Hand the complete requests to the workers while their answers fit, last before the selector
        sleeps: a worker woken earlier would wait for this thread's bookkeeping to let go of the
        interpreter."""
        now = time.monotonic()
        kept = []
        for connection, address, deadline in self._ready:
            if deadline <= now:  # waited for room until its client gave up
                self._failures.count(ANSWER_NOT_READ, address)
                self._end(connection, address, sent=False, stage=_WAITING)
            else:
                kept.append((connection, address, deadline))
        self._ready = kept
        while self._ready:
            if not self._room_for_one():
                self._room_wanted = True
                return
            with self._lock:
                # the peer with the fewest requests in hand first (the oldest of its own): a client that
                # asks many times and never reads does not put the others' scrapes behind its own
                chosen = min(
                    range(len(self._ready)), key=lambda index: self._per_peer[_peer(self._ready[index][1])]
                )
                connection, address, deadline = self._ready.pop(chosen)
                self._in_work += 1
                self._per_peer[_peer(address)] += 1
            self._workers.submit(functools.partial(self._answer, connection, address, deadline))
        self._room_wanted = False

    def _room_for_one(self) -> bool:
        """Whether one more answer fits in ``MAX_HELD_BYTES`` with those being sent and written, after
        dropping stalled ones if need be; with none of them, an answer of any size does."""
        with self._lock:
            in_work, size = self._in_work, self._answer_bytes
        if in_work == 0 and not self._sending:
            return True
        self._make_room((in_work + 1) * size)
        return self._held + (in_work + 1) * size <= MAX_HELD_BYTES or (in_work == 0 and not self._sending)

    # sending what the workers answered ----------------------------------------------------------------

    def _take_over_sending(self) -> None:
        """Send, from now on, the answers the workers could not send all of at once."""
        with self._lock:
            handed, self._to_send = self._to_send, []
        for sending in handed:
            self._sending[sending.connection] = sending
            self._held += len(sending.answer)
            self._selector.register(sending.connection, sending.events, sending)

    def _make_room(self, size: int) -> None:
        """Drop the answers whose clients have read nothing for longest until ``size`` more bytes fit in
        ``MAX_HELD_BYTES`` (answers still being read are kept: their clients take them)."""
        now = time.monotonic()
        while self._sending and self._held + size > MAX_HELD_BYTES:
            stalled = min(self._sending.values(), key=lambda sending: sending.progressed_at)
            if now - stalled.progressed_at < EVICT_AFTER_S:
                return
            self._failures.count(ANSWER_NOT_READ, stalled.address)
            self._drop(stalled)

    def _send(self, sending: _Sending) -> None:
        events = _send_some(sending)
        if events is None:
            self._drop(sending, sent=True)
        elif events == 0:
            self._failures.count(RESET, sending.address)
            self._drop(sending)
        elif events != sending.events:
            self._selector.modify(sending.connection, events, sending)
            sending.events = events

    def _expire_sending(self) -> None:
        now = time.monotonic()
        for sending in [each for each in self._sending.values() if each.deadline <= now]:
            self._failures.count(ANSWER_NOT_READ, sending.address)
            self._drop(sending)

    def _drop(self, sending: _Sending, sent: bool = False) -> None:
        """Close an answer's connection: sent whole, or given up on."""
        if self._sending.pop(sending.connection, None) is not None:
            self._selector.unregister(sending.connection)
            self._held -= len(sending.answer)
        self._end(sending.connection, sending.address, sent, stage=_SENDING)

    def _close(self, waiting: _Waiting) -> None:
        with self._lock:
            self._close_locked(waiting)

    def _close_locked(self, waiting: _Waiting) -> None:
        self._selector.unregister(waiting.connection)
        del self._waiting[waiting.connection]
        waiting.connection.close()
        self._open -= 1

    # a worker ---------------------------------------------------------------------------------------

    def _answer(self, request: socket.socket, client_address: Any, deadline: float) -> None:
        """Answer into memory, send what the connection takes now and hand the rest to the accepting
        thread."""
        server = self.server
        answer: memoryview | None = None
        try:
            server.finish_request(request, client_address)
            answer = self._pooled.take_answer(request)
        except Exception:
            server.handle_error(request, client_address)
        finally:
            self._pooled.take_head(request)  # when the handler failed before taking it
            self._pooled.take_answer(request)
            if answer:
                with self._lock:  # the larger answers count: a small one (gzip, a probe) must not let many in
                    self._answer_bytes = max(len(answer), self._answer_bytes - self._answer_bytes // 8)
        if not answer or time.monotonic() >= deadline:
            if answer:
                self._failures.count(ANSWER_NOT_READ, client_address)
            self._end(request, client_address, sent=False)
            return
        now = time.monotonic()
        sending = _Sending(request, client_address, answer, deadline, now)
        try:
            request.setblocking(False)
        except OSError:
            self._end(request, client_address, sent=False)
            return
        events = _send_some(sending)
        if events is None:
            self._end(request, client_address, sent=True)
        elif events == 0:
            self._failures.count(RESET, client_address)
            self._end(request, client_address, sent=False)
        else:
            sending.events = events
            with self._lock:
                stopped = self._stopped
                if not stopped:
                    self._in_work -= 1
                    self._to_send.append(sending)
                    _write_quietly(self._wake_write, _TO_SEND)
            if stopped:
                self._end(request, client_address, sent=False)

    def _end(self, request: socket.socket, address: Any, sent: bool, stage: str = _WORKING) -> None:
        """Close a connection whose answer was sent (or never will be: reset, so that the kernel holds
        none of it either) and free its slot; ``stage``: where the request was."""
        if not sent:
            with contextlib.suppress(OSError):
                request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        self.server.shutdown_request(request)
        with self._lock:
            self._open -= 1
            if stage != _WAITING:
                self._per_peer[_peer(address)] -= 1
                if not self._per_peer[_peer(address)]:
                    del self._per_peer[_peer(address)]
            if stage == _WORKING:
                self._in_work -= 1
            waited = self._paused_at_cap or (stage == _WORKING and self._room_wanted)
            if waited and not self._stopped:  # the accepting thread waits for a slot or room
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


def _peer(address: Any) -> str:
    """The client's host (its address without the port)."""
    return str(address[0]) if isinstance(address, tuple) and address else str(address)


def _send_some(sending: _Sending) -> int | None:
    """Send as much of the answer as the connection takes without blocking. None when all is sent, else
    the selector events to wait for before trying again (0: the connection failed)."""
    connection, answer = sending.connection, sending.answer
    try:
        while sending.sent < len(answer):
            size = sending.offered or min(SEND_CHUNK_BYTES, len(answer) - sending.sent)
            try:
                written = connection.send(answer[sending.sent : sending.sent + size])
            except ssl.SSLWantWriteError:
                sending.offered = size
                return selectors.EVENT_WRITE
            except ssl.SSLWantReadError:
                sending.offered = size
                return selectors.EVENT_READ
            sending.offered = 0
            if written:
                sending.sent += written
                sending.progressed_at = time.monotonic()
    except (BlockingIOError, InterruptedError):
        return selectors.EVENT_WRITE
    except OSError:
        return 0
    return None


def _send_quietly(connection: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # best effort: the connection is closed next
        connection.send(data)


def _write_quietly(fd: int, data: bytes) -> None:
    with contextlib.suppress(BlockingIOError):  # the pipe is full of wakeups already
        os.write(fd, data)
