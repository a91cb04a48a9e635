"""The test peers' start-up (otel_numa/testing/peers.py): a server whose free port another program took
before it could bind it is started again on another port, never handed to a test while a stranger answers."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from otel_numa.testing import peers
from otel_numa.testing.peers import listening_ports, start_on_free_ports, stop_process


def http_server(ports: tuple[int, ...]) -> subprocess.Popen[bytes]:
    """Python's own HTTP server on ``ports[0]``: it exits when the port is taken."""
    command = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(ports[0])]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def stranger() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


def test_a_server_whose_port_was_taken_is_started_again_on_another(
    stranger: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed = iter([stranger])
    free_port = peers.free_port
    monkeypatch.setattr(peers, "free_port", lambda: next(handed, None) or free_port())
    started: list[tuple[int, ...]] = []

    def start(ports: tuple[int, ...]) -> subprocess.Popen[bytes]:
        started.append(ports)
        return http_server(ports)

    process, (port,) = start_on_free_ports(start, 1, "the server")
    try:
        assert started[0] == (stranger,) and len(started) == 2
        assert port != stranger and process.poll() is None
        assert listening_ports(process.pid) == {port}
    finally:
        stop_process(process)


def test_a_server_that_fails_for_another_reason_is_handed_back_as_it_is() -> None:
    def start(_ports: tuple[int, ...]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])

    process, _ports = start_on_free_ports(start, 2, "the server")
    assert process.poll() == 3


def test_ports_taken_every_time_fail_with_the_reason(stranger: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "free_port", lambda: stranger)
    with pytest.raises(AssertionError, match="another program took its free ports 3 times"):
        start_on_free_ports(http_server, 1, "the server")
