"""OTLP/HTTP over TLS: the collector CA named by the standard variables must be the one used.

The OTLP/HTTP exporter hands ``OTEL_EXPORTER_OTLP_(METRICS_)CERTIFICATE`` to a requests session, but requests
replaces a session's CA file with ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` when either is set in the
environment (many base images set them), so the collector's private CA would silently not be trusted.
"""

from __future__ import annotations

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


class _CollectorCaSession(requests.Session):
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
    """The session to give the OTLP/HTTP exporter; None: the exporter's own (no collector CA configured)."""
    if not any(environ.get(name) for name in CERTIFICATE_VARIABLES):
        return None
    if any(environ.get(name) for name in CREDENTIAL_PROVIDER_VARIABLES):
        return None
    return _CollectorCaSession()
