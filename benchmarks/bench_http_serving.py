"""What serving one scrape costs, the agent's own server against well-kept WSGI servers, and whether each
keeps answering a normal scraper while slow and silent clients hold connections.

Every server serves the same app (prometheus_client's WSGI app over a fixed registry, gzip at the agent's
level) in a process of its own; the client scrapes it back to back with Prometheus' headers and the server
process's CPU time is read before and after. ``/favicon.ico`` (an empty answer from the same app) gives the
serving overhead alone. Then 80 silent and 80 slowloris connections are opened, and a normal scraper tries
the page 5 times with a 1 s timeout.

    .venv/bin/python -m benchmarks.bench_http_serving [--scrapes 300] [--series 3000]

waitress and cheroot are measured when installed (``pip install waitress cheroot``); they are not
dependencies of the agent.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import psutil

from otel_numa.testing.peers import free_port, wait_for

SERVERS = ("agent", "prometheus_client", "waitress", "cheroot")
LIBRARY_OF = {"waitress": "waitress", "cheroot": "cheroot"}
HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


def serve(kind: str, port: int, series: int) -> None:
    """Run in the server process: serve the page on ``port`` until killed."""
    from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app, start_http_server

    from otel_numa.endpoints.metrics_page import MetricsServer, compressing

    registry = CollectorRegistry()
    gauge = Gauge("numa_bench_value", "A value.", ["numa_node_id", "k8s_pod_uid"], registry=registry)
    for index in range(series):
        gauge.labels(str(index % 8), f"pod-{index:06d}").set(index)
    app = compressing(make_wsgi_app(registry, disable_compression=True))
    if kind == "agent":
        MetricsServer("127.0.0.1", port, registry)
    elif kind == "prometheus_client":  # wsgiref with a thread per connection, gzip at level 9
        start_http_server(port, "127.0.0.1", registry)
    elif kind == "waitress":
        importlib.import_module("waitress").serve(app, host="127.0.0.1", port=port, _quiet=True)
    elif kind == "cheroot":
        wsgi = importlib.import_module("cheroot.wsgi")
        wsgi.Server(("127.0.0.1", port), app).start()
    threading.Event().wait()


@dataclass
class Result:
    kind: str
    page_us: float
    empty_us: float
    page_bytes: int
    answered_under_attack: int
    probes: int


@contextlib.contextmanager
def server_process(kind: str, series: int) -> Iterator[tuple[int, psutil.Process]]:
    port = free_port()
    command = [sys.executable, "-m", "benchmarks.bench_http_serving", "--serve", kind, "--port", str(port)]
    process = subprocess.Popen([*command, "--series", str(series)])
    try:
        wait_for(lambda: get(port, "/metrics", 2) is not None, 30, f"{kind} to serve")
        yield port, psutil.Process(process.pid)
    finally:
        process.kill()
        process.wait()


def get(port: int, path: str, timeout_s: float) -> bytes | None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=HEADERS)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body: bytes = response.read()
            return body
    except OSError:
        return None


def cpu_us_per_request(process: psutil.Process, port: int, path: str, requests: int) -> tuple[float, int]:
    for _ in range(10):  # warm up
        get(port, path, 5)
    times = process.cpu_times()
    before = times.user + times.system
    size = 0
    for _ in range(requests):
        body = get(port, path, 5)
        assert body is not None, f"{path} failed"
        size = len(body)
    times = process.cpu_times()
    return (times.user + times.system - before) / requests * 1e6, size


def under_attack(port: int, probes: int) -> int:
    """Probes answered within 1 s while 80 silent and 80 slowloris connections are held."""
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(80)]
    slow = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(80)]
    stop = threading.Event()

    def drip() -> None:
        for connection in slow:
            with contextlib.suppress(OSError):
                connection.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        while not stop.wait(0.3):
            for connection in slow:
                with contextlib.suppress(OSError):
                    connection.send(b"X")

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        time.sleep(1.0)
        answered = 0
        for _ in range(probes):
            began = time.monotonic()
            if get(port, "/metrics", 1.0) is not None and time.monotonic() - began < 1.0:
                answered += 1
        return answered
    finally:
        stop.set()
        dripper.join()
        for connection in silent + slow:
            connection.close()


def measure(kind: str, scrapes: int, series: int) -> Result:
    with server_process(kind, series) as (port, process):
        page_us, page_bytes = cpu_us_per_request(process, port, "/metrics", scrapes)
        empty_us, _ = cpu_us_per_request(process, port, "/favicon.ico", scrapes)
        answered = under_attack(port, 5)
    return Result(kind, page_us, empty_us, page_bytes, answered, 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--series", type=int, default=3000)
    parser.add_argument("--servers", default=",".join(SERVERS), help="comma list of " + ", ".join(SERVERS))
    parser.add_argument("--serve", choices=SERVERS)
    parser.add_argument("--port", type=int)
    options = parser.parse_args()
    if options.serve:
        serve(options.serve, options.port, options.series)
        return
    print(f"{options.series} series, {options.scrapes} scrapes each, server CPU per request")
    print("| server | page (gzip) | empty answer | page bytes | answered within 1 s under attack |")
    print("|---|---|---|---|---|")
    for kind in options.servers.split(","):
        library = LIBRARY_OF.get(kind)
        if library and importlib.util.find_spec(library) is None:
            print(f"| {kind} | not installed | | | |")
            continue
        result = measure(kind, options.scrapes, options.series)
        print(
            f"| {kind} | {result.page_us:,.0f} us | {result.empty_us:,.0f} us | {result.page_bytes:,} |"
            f" {result.answered_under_attack}/{result.probes} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
