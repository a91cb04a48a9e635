"""Typed errors raised by the sources.

``error_type`` is the value of the ``error.type`` attribute on ``numa.agent.source.errors``, so it
must stay low-cardinality: a fixed word, never a path or a message.
"""

from __future__ import annotations


class SourceError(Exception):
    """A source could not produce a value this round."""

    error_type = "error"

    def __init__(self, message: str, *, error_type: str | None = None) -> None:
        super().__init__(message)
        if error_type is not None:
            self.error_type = error_type


class SourceMissing(SourceError):
    """The file, directory or socket does not exist (normal on many nodes; never fatal)."""

    error_type = "missing"


class SourceCorrupt(SourceError):
    """The data exists but does not parse or does not verify; it is rejected as a whole."""

    error_type = "corrupt"


class SourceUnavailable(SourceError):
    """The data exists but cannot be read now (permissions, I/O error, RPC failure)."""

    error_type = "unavailable"
