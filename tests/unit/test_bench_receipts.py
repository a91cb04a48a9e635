"""The benchmarks count OTLP pushes from rotel's log: a push of more than 10,000 points is several requests,
each a ``Received metrics`` line, and only its last one ends the push."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from benchmarks.bench_cost import Receipts

# rotel 0.1's basic debug log, as it wrote it for an 8x48 node's pushes (14,450 points: 10,000 + 4,450)
ESC = "\x1b"


def received(points: int) -> str:
    return (
        f"{ESC}[2m2026-11-28T15:13:51.452927Z{ESC}[0m {ESC}[32m INFO{ESC}[0m Received metrics. "
        f'{ESC}[3mdata_type{ESC}[0m{ESC}[2m={ESC}[0m"metrics" '
        f"{ESC}[3mresource_metrics{ESC}[0m{ESC}[2m={ESC}[0m1 "
        f"{ESC}[3mmetrics{ESC}[0m{ESC}[2m={ESC}[0m{points}\n"
    )


def test_a_push_in_several_requests_counts_once_its_last_request_arrived(tmp_path: Path) -> None:
    log = tmp_path / "rotel.log"
    log.write_text(f"{ESC}[2m2026-11-28T15:13:48Z{ESC}[0m {ESC}[32m INFO{ESC}[0m Starting Rotel.\n")
    receipts = Receipts(SimpleNamespace(log_path=log))  # type: ignore[arg-type]
    assert receipts.count() == 0
    with open(log, "a") as writer:
        writer.write(received(10_000))
        writer.flush()
        assert receipts.count() == 0  # the push goes on
        line = received(4_450)
        writer.write(line[:40])  # a line rotel has not finished writing
        writer.flush()
        assert receipts.count() == 0
        writer.write(line[40:] + received(1_823))
    assert receipts.count() == 2
    assert receipts.wait_beyond(1, timeout_s=1) == 2
