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
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from typing import Any

import requests

CERTIFICATE_VARIABLES = ("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")
# the exporter builds its own session from these; leave it alone then
CREDENTIAL_PROVIDER_VARIABLES = (
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_METRICS_CREDENTIAL_PROVIDER",
)


MAX_RESPONSE_BYTES = 64 * 1024
_CHUNK_BYTES = 16 * 1024


class _CollectorSession(requests.Session):
    """A session that keeps at most ``MAX_RESPONSE_BYTES`` of each response body."""

    def request(self, method: str, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs["stream"] = True
        response = super().request(method, url, *args, **kwargs)
        return keep_head_of_body(response)


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
