"""The requests session of the OTLP/HTTP exporter: the collector's answer is not kept, and the collector CA
named by the standard variables is the one used.

An OTLP export response is a few bytes (at most a partial-success message), but requests reads a whole body
into memory, so a broken or hostile collector answering each push with hundreds of megabytes would raise the
agent's memory by that much. The session streams the body instead, keeps its first ``MAX_RESPONSE_BYTES``
(decompressed) for whoever looks, and closes the connection rather than read the rest. The status code alone
decides whether a push was delivered, as before.

The OTLP/HTTP exporter hands ``OTEL_EXPORTER_OTLP_(METRICS_)CERTIFICATE`` to a requests session, but requests
replaces a session's CA file with ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` when either is set in the
environment (many base images set them), so the collector's private CA would silently not be trusted.

Each wait of a request is bounded by the exporter's timeout, but a collector that answers one byte at a time
is never silent for that long. The session's connections are therefore known while a request uses them, and
:func:`abort_requests` shuts the sockets of a thread's request down: the push's deadline
(:mod:`otel_numa.export.otlp_deadline`) then ends a request whatever the collector sends.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import threading
from collections.abc import Mapping
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3 import HTTPConnectionPool, HTTPSConnectionPool, PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.poolmanager import pool_classes_by_scheme

CERTIFICATE_VARIABLES = ("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")
# the exporter builds its own session from these; leave it alone then
CREDENTIAL_PROVIDER_VARIABLES = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_METRICS_CREDENTIAL_PROVIDER",
)


MAX_RESPONSE_BYTES = 64 * 1024
_CHUNK_BYTES = 16 * 1024


# The connections each thread's collector request is using, by thread id.
_in_use: dict[int, set[HTTPConnection]] = {}
_in_use_lock = threading.Lock()


def _using(connection: HTTPConnection) -> None:
    with _in_use_lock:
        in_use = _in_use.get(threading.get_ident())
        if in_use is not None:
            in_use.add(connection)


def abort_requests(thread_id: int) -> int:
    """Shut down the sockets of the collector request that thread ``thread_id`` is making (its reads and
    writes then fail at once); the number shut down."""
    with _in_use_lock:
        connections = list(_in_use.get(thread_id, ()))
    aborted = 0
    for connection in connections:
        sock = connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # closed meanwhile: nothing left to end
                sock.shutdown(socket.SHUT_RDWR)
                aborted += 1
    return aborted


class _WatchedConnection(HTTPConnection):
    def connect(self) -> None:
        _using(self)
        super().connect()

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        _using(self)  # a pooled connection is used again without connecting
        return super().getresponse(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    def connect(self) -> None:
        _using(self)
        super().connect()

    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        _using(self)
        return super().getresponse(*args, **kwargs)


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_WATCHED_POOLS = {"http": _WatchedPool, "https": _WatchedHTTPSPool}


def _watched(manager: PoolManager) -> PoolManager:
    """``manager`` making watched connections, unless it makes its own kind (a SOCKS proxy's)."""
    if manager.pool_classes_by_scheme is pool_classes_by_scheme:
        manager.pool_classes_by_scheme = _WATCHED_POOLS
    return manager


class _WatchedAdapter(HTTPAdapter):
    """requests' adapter, with connections :func:`abort_requests` can end (direct or through a proxy)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        _watched(self.poolmanager)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        return _watched(super().proxy_manager_for(proxy, **proxy_kwargs))


class _CollectorSession(requests.Session):
    """A session that keeps at most ``MAX_RESPONSE_BYTES`` of each response body, whose requests
    :func:`abort_requests` can end."""

    def __init__(self) -> None:
        super().__init__()
        self.mount("https://", _WatchedAdapter())
        self.mount("http://", _WatchedAdapter())

    def request(self, method: str, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs["stream"] = True
        thread = threading.get_ident()
        with _in_use_lock:
            _in_use[thread] = set()
        try:
            response = super().request(method, url, *args, **kwargs)
            return keep_head_of_body(response)
        finally:
            with _in_use_lock:
                del _in_use[thread]


def keep_head_of_body(response: requests.Response, limit: int = MAX_RESPONSE_BYTES) -> requests.Response:
    """``response`` (made with ``stream=True``) with at most ``limit`` bytes of its body read; a longer body
    is cut there and its connection closed instead of drained."""
    kept = bytearray()
    complete = False
    try:
        for chunk in response.iter_content(_CHUNK_BYTES):
            kept += chunk
            if len(kept) > limit:
                break
        else:
            complete = True
    except requests.RequestException:
        pass  # a broken body: what was read is kept, the status code still stands
    if complete:
        response.close()  # read to its end: the connection goes back to the pool
    else:
        response.raw.close()  # closes the connection: the rest is never read
        del kept[limit:]
    response.raw = io.BytesIO(bytes(kept))  # what ``content`` and ``text`` read from now on
    return response


class _CollectorCaSession(_CollectorSession):
    """A session whose own CA file (set by the exporter) wins over the process-wide CA bundle variables."""

    def merge_environment_settings(
        self,
        url: str,
        proxies: dict[str, str] | None,
        stream: bool | None,
        verify: Any,
        cert: Any,
    ) -> dict[str, Any]:
        settings: dict[str, Any] = super().merge_environment_settings(url, proxies, stream, verify, cert)
        if verify is None and isinstance(self.verify, str):
            settings["verify"] = self.verify
        return settings


def otlp_http_session(environ: Mapping[str, str] = os.environ) -> requests.Session | None:
    """The session to give the OTLP/HTTP exporter; None where a credential provider gives the exporter its
    own session (its bodies are then read whole)."""
    if any(environ.get(name) for name in CREDENTIAL_PROVIDER_VARIABLES):
        return None
    if any(environ.get(name) for name in CERTIFICATE_VARIABLES):
        return _CollectorCaSession()
    return _CollectorSession()
