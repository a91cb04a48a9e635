"""The Prometheus page's server: prometheus_client's WSGI app on wsgiref, over TLS (optionally mTLS) when
files are given, run by :mod:`otel_numa.endpoints.serving` (a pool of workers, no polling).

The certificate, key and client CA are re-read when they change on disk, so a rotated certificate is served
without a restart. Kubernetes updates a mounted secret by swapping a symlinked directory: the files are
watched through ``os.stat``, which follows the links to whatever they point at now.
"""

from __future__ import annotations

import gzip
import logging
import os
import ssl
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import gzip_accepted

from otel_numa.endpoints.render_guard import RenderGuard
from otel_numa.endpoints.serving import REQUEST_TIMEOUT_S, PooledMixIn, Serving
from otel_numa.gzip_stream import GZIP_LEVEL
from otel_numa.options import TlsOptions

log = logging.getLogger(__name__)

# Kubernetes takes up to a minute to propagate a renewed secret; a second more is nothing, and each check
# is three stat calls.
DEFAULT_RELOAD_INTERVAL_S = 1.0


class TlsFileError(ValueError):
    """A TLS file cannot be used; ``setting`` names the setting that holds it."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(message)
        self.setting = setting


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsFileError(setting, f"cannot read {path}: {exc.strerror or exc}") from None


def _check_certificates(pem: bytes, path: Path, setting: str) -> None:
    """Fail unless the file holds at least one PEM certificate that OpenSSL parses."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError):
        raise TlsFileError(setting, f"{path} holds no PEM certificate") from None


class _EncryptedKey(Exception):
    pass


def _no_password() -> bytes:
    # An encrypted key would otherwise make OpenSSL prompt on the terminal.
    raise _EncryptedKey


def load_server_context(files: TlsOptions) -> ssl.SSLContext:
    """A server context for ``files``; raises TlsFileError naming the setting of the first bad file."""
    _check_certificates(_read(files.cert_file, "tls_cert_file"), files.cert_file, "tls_cert_file")
    _read(files.key_file, "tls_key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert_file, files.key_file, password=_no_password)
    except _EncryptedKey:
        raise TlsFileError(
            "tls_key_file", f"{files.key_file} is encrypted; an unencrypted key is needed"
        ) from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            problem = f"does not match the certificate in {files.cert_file}"
        else:
            problem = "holds no PEM private key"
        raise TlsFileError("tls_key_file", f"{files.key_file} {problem}") from None
    except OSError as exc:  # the files changed between the two reads
        raise TlsFileError("tls_key_file", f"cannot read {files.key_file}: {exc.strerror or exc}") from None
    if files.client_ca_file is not None:
        pem = _read(files.client_ca_file, "tls_client_ca_file")
        _check_certificates(pem, files.client_ca_file, "tls_client_ca_file")
        context.load_verify_locations(cadata=pem.decode("ascii"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


_Signature = tuple[tuple[int, int, int, int, int] | None, ...]


def _signature(files: TlsOptions) -> _Signature:
    """What ``stat`` says of each file, through its symlinks: changes when a file is replaced or edited."""
    paths = [files.cert_file, files.key_file, *([files.client_ca_file] if files.client_ca_file else [])]
    result: list[tuple[int, int, int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            result.append(None)
        else:
            result.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode))
    return tuple(result)


class CertificateReloader:
    """Holds the current server context; ``check`` swaps in a new one when the files changed and are good.

    A bad state on disk (a half-written rotation, a key that does not match yet) keeps the last good
    context, is logged once, and is retried at every check until it loads.
    """

    def __init__(self, files: TlsOptions) -> None:
        self.files = files
        self._signature = _signature(files)
        self.context = load_server_context(files)
        self._failing = False

    def check(self) -> bool:
        """Reload when the files changed (or the last try failed); True when a new context is in use."""
        signature = _signature(self.files)
        if signature == self._signature and not self._failing:
            return False
        try:
            context = load_server_context(self.files)
        except TlsFileError as exc:
            if not self._failing:
                log.warning(
                    "TLS files changed but cannot be used, keeping the previous certificate: %s: %s",
                    exc.setting,
                    exc,
                )
            self._failing = True
            return False
        self.context, self._signature, self._failing = context, signature, False
        log.info("TLS certificate reloaded from %s", self.files.cert_file)
        return True


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def compressing(app: WsgiApp, level: int = GZIP_LEVEL) -> WsgiApp:
    """``app`` (prometheus_client's, made without compression) with its metrics pages gzip-compressed at
    ``level`` for clients that accept gzip, as prometheus_client itself would at level 9. An answer ``app``
    encoded itself (the accelerated page) goes out as it is."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        is_page = environ.get("REQUEST_METHOD") == "GET" and environ.get("PATH_INFO") != "/favicon.ico"
        if not is_page or not gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            return app(environ, start_response)
        answer: list[Any] = []

        def keep(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], None]:
            answer[:] = [status, headers]
            return lambda _data: None

        body = b"".join(app(environ, keep))
        status, headers = answer
        if any(name.lower() == "content-encoding" for name, _ in headers):
            start_response(status, headers)
            return [body]
        start_response(status, [*headers, ("Content-Encoding", "gzip")])
        return [gzip.compress(body, compresslevel=level)]

    return serve


def answering_head(app: WsgiApp) -> WsgiApp:
    """``app`` with ``HEAD`` answered as ``GET`` is, the body left out (its length still given)."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)
        answer: list[Any] = []

        def keep(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], None]:
            answer[:] = [status, headers]
            return lambda _data: None

        length = sum(len(part) for part in app({**environ, "REQUEST_METHOD": "GET"}, keep))
        status, headers = answer
        if not any(name.lower() == "content-length" for name, _ in headers):
            headers = [*headers, ("Content-Length", str(length))]
        start_response(status, headers)
        return []

    return serve


def one_at_a_time(app: WsgiApp) -> WsgiApp:
    """``app`` answering one request at a time. Pages share one interpreter, so rendering two at once
    is no faster, but each holds its collection's objects and its text meanwhile: many clients asking at
    once would hold that many."""
    lock = threading.Lock()

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        with lock:
            return list(app(environ, start_response))

    return serve


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:  # a line per scrape would drown the agent's log
        pass


class _PooledWSGIServer(PooledMixIn, WSGIServer):
    thread_name = "metrics-http"
    # the long-running process's heap policy after a page was sent (otel_numa.daemon.heap); none by default
    after_response: Callable[[], None] = staticmethod(lambda: None)

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.after_response()


class MetricsServer:
    """The page on ``host:port``; over TLS when ``tls`` is given."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        tls: TlsOptions | None = None,
        reload_interval_s: float = DEFAULT_RELOAD_INTERVAL_S,
        *,
        app: WsgiApp | None = None,
        after_response: Callable[[], None] | None = None,
    ) -> None:
        """``app``: the page's WSGI app, uncompressed (default: prometheus_client's for ``registry``)."""
        self._reloader = CertificateReloader(tls) if tls is not None else None
        self._stopped = threading.Event()
        self._httpd = _PooledWSGIServer(host, port, _QuietHandler)
        if after_response is not None:
            self._httpd.after_response = after_response
        page = app if app is not None else make_wsgi_app(registry, disable_compression=True)
        self.render_guard = RenderGuard(page, registry)
        self._httpd.set_app(one_at_a_time(answering_head(compressing(self.render_guard))))
        self._watcher: threading.Thread | None = None
        if self._reloader is not None:
            # Each handshake starts on the listening context (which fixes whether a client certificate is
            # required) and switches to the latest good context, so rotated files take effect at once.
            # The handshake runs without blocking in the accepting thread, before the request reaches a
            # worker: a client that connects and stays silent holds no worker (see http_serving).
            listening = self._reloader.context
            listening.sni_callback = self._use_current_context
            self._httpd.socket = listening.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
            self._watcher = threading.Thread(target=self._watch, args=(reload_interval_s,), daemon=True)
            self._watcher.name = "tls-reload"
            self._watcher.start()
        self._serving = Serving(self._httpd)
        self._serving.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def _use_current_context(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: Any
    ) -> None:
        assert self._reloader is not None
        connection.context = self._reloader.context

    def _watch(self, interval_s: float) -> None:
        assert self._reloader is not None
        while not self._stopped.wait(interval_s):
            try:
                self._reloader.check()
            except Exception:  # never let the watcher die: the page would keep an expiring certificate
                log.exception("TLS file check failed")

    def shutdown(self) -> None:
        self._stopped.set()
        self._serving.stop()
        if self._watcher is not None:
            self._watcher.join(timeout=1)
