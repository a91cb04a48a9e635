"""Calls a WSGI app in process, as the agent's page server would."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterable
from typing import Any

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def call_wsgi(
    app: WSGIApp,
    *,
    accept: str = "",
    accept_encoding: str = "",
    method: str = "GET",
    query: str = "",
    gunzip: bool = True,
) -> tuple[str, dict[str, str], bytes]:
    """The status, headers and body (gunzipped when the app gzipped it, unless ``gunzip`` is false) of one
    request to ``app``."""
    answer: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answer[:] = [status, dict(headers)]
        return lambda _data: None

    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": "/metrics",
        "QUERY_STRING": query,
        "HTTP_ACCEPT": accept,
        "HTTP_ACCEPT_ENCODING": accept_encoding,
    }
    body = b"".join(app(environ, start_response))
    status, headers = answer
    if gunzip and headers.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return status, headers, body
