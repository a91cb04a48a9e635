"""``otel-numa``'s entry point: the stop signals are held before anything is imported
(:mod:`otel_numa.daemon.signals`), so a SIGTERM that comes while the agent starts ends it cleanly."""

from __future__ import annotations

from otel_numa.daemon import signals


def main() -> int:
    signals.hold()
    from otel_numa.cli.main import main as command_line

    return command_line()
