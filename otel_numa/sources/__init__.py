"""Readers of the machine and of the kubelet's state.

Each reader returns immutable values or raises a :class:`SourceError`; nothing here knows about
OpenTelemetry.
"""

from otel_numa.sources.errors import SourceCorrupt, SourceError, SourceMissing, SourceUnavailable

__all__ = ["SourceCorrupt", "SourceError", "SourceMissing", "SourceUnavailable"]
