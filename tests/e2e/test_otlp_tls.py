"""OTLP over TLS through the standard OTEL_EXPORTER_OTLP_* variables, for both protocols: a real collector
(rotel) behind a real TLS terminator (Debian's nginx) that wants a client certificate and checks a header.
The push arrives with everything right, and is refused without the header, without the client certificate,
or when the agent does not trust the collector's CA."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from otel_numa.testing.certs import Issued, issue, make_ca
from otel_numa.testing.peers import (
    OtlpTlsProxy,
    ProxiedRequest,
    Rotel,
    run_agent,
    run_otlp_tls_proxy,
    run_rotel,
    wait_for,
)

pytestmark = pytest.mark.e2e

SNAPSHOT = "16amd64-4n4c-cgroup-distance-merge"  # 4 NUMA nodes
KIB = 1024
TOKEN = "Bearer n0t-a-real-token"


@dataclass(frozen=True)
class Pki:
    ca: Issued
    collector: Issued
    agent: Issued  # the agent's client certificate
    rogue_ca: Issued


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = make_ca(tmp_path / "ca")
    return Pki(
        ca=ca,
        collector=issue(ca, tmp_path / "pki", "collector"),
        agent=issue(ca, tmp_path / "pki", "otel-numa-agent", client=True),
        rogue_ca=make_ca(tmp_path / "rogue-ca", name="someone else's CA"),
    )


GENERIC = "OTEL_EXPORTER_OTLP_"
METRICS_ONLY = "OTEL_EXPORTER_OTLP_METRICS_"  # take precedence over the generic ones


def otlp_environment(protocol: str, proxy: OtlpTlsProxy, pki: Pki, prefix: str = GENERIC) -> dict[str, str]:
    """What an operator sets: the collector's address and CA, the client certificate, a header, gzip."""
    port = proxy.grpc_port if protocol == "grpc" else proxy.http_port
    return {
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        f"{prefix}ENDPOINT": f"https://127.0.0.1:{port}",
        f"{prefix}CERTIFICATE": str(pki.ca.cert_file),
        f"{prefix}CLIENT_CERTIFICATE": str(pki.agent.cert_file),
        f"{prefix}CLIENT_KEY": str(pki.agent.key_file),
        # header values are URL-encoded in the variable (the space of "Bearer ...")
        f"{prefix}HEADERS": "authorization=" + TOKEN.replace(" ", "%20"),
        f"{prefix}COMPRESSION": "gzip",
        # a process-wide CA bundle (set by many base images) must not replace the collector's CA
        "REQUESTS_CA_BUNDLE": str(pki.rogue_ca.cert_file),
    }


def agent_args(tmp_path: Path, machine: tuple[Path, Path], node: str) -> list[str]:
    sysfs, procfs = machine
    return [
        *("--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--node-name", node),
        *("--kubelet-root", str(tmp_path / "no-kubelet"), "--exporter", "otlp", "--interval", "1"),
    ]


def nodes_received(rotel: Rotel) -> set[str]:
    return {str(batch.resource.get("k8s.node.name")) for batch in rotel.batches()}


def received_from(rotel: Rotel, node: str) -> bool:
    return node in nodes_received(rotel)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_push_through_tls_with_header_and_client_certificate(
    protocol: str, tmp_path: Path, pki: Pki, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    grpc = protocol == "grpc"
    machine = hwloc_root(SNAPSHOT)
    with (
        run_rotel(tmp_path) as rotel,
        run_otlp_tls_proxy(
            tmp_path,
            rotel,
            pki.collector.cert_file,
            pki.collector.key_file,
            required_header=("authorization", TOKEN),
            client_ca_file=pki.ca.cert_file,
        ) as proxy,
    ):
        port = proxy.grpc_port if grpc else proxy.http_port

        def answered(status: int) -> bool:
            return any(r.port == port and r.status == status for r in proxy.requests())

        # No header: the terminator answers 401 and nothing reaches the collector.
        env = otlp_environment(protocol, proxy, pki)
        del env["OTEL_EXPORTER_OTLP_HEADERS"]
        with run_agent(agent_args(tmp_path, machine, "no-header"), tmp_path, env, prometheus=False) as agent:
            wait_for(lambda: answered(401), 30, "the push without the header to be answered 401")
            wait_for(
                lambda: "401" in agent.log() or "UNAUTHENTICATED" in agent.log(), 10, "the agent to log it"
            )

        # No client certificate: nginx refuses the request (400) before it reaches the collector.
        env = otlp_environment(protocol, proxy, pki)
        del env["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"], env["OTEL_EXPORTER_OTLP_CLIENT_KEY"]
        with run_agent(agent_args(tmp_path, machine, "no-client-cert"), tmp_path, env, prometheus=False):
            wait_for(lambda: answered(400), 30, "the push without a client certificate to be refused")

        # The agent trusts another CA: its TLS handshake fails, so no request is made at all.
        env = otlp_environment(protocol, proxy, pki)
        env["OTEL_EXPORTER_OTLP_CERTIFICATE"] = str(pki.rogue_ca.cert_file)
        requests_before = len(proxy.requests())
        with run_agent(agent_args(tmp_path, machine, "wrong-ca"), tmp_path, env, prometheus=False) as agent:
            wait_for(
                lambda: "certificate verify failed" in agent.log().replace("_", " ").lower(),
                30,
                "the agent to report the collector's certificate as untrusted",
            )
            # gRPC's TLS closes the connection, Python's sends an "unknown ca" alert first
            failures = ("closed connection in SSL handshake", "alert unknown ca")
            wait_for(
                lambda: any(f in proxy.error_log() for f in failures), 10, "nginx to see the handshake fail"
            )
        assert len(proxy.requests()) == requests_before

        # Everything right, with the generic variables or the metrics-only ones: the push arrives, over TLS,
        # with the header, gzip-compressed, and the terminator saw the agent's client certificate.
        def accepted() -> list[ProxiedRequest]:
            return [r for r in proxy.requests() if r.port == port and r.status == 200]

        def accepted_beyond(count: int) -> bool:
            return len(accepted()) > count

        for prefix, node in ((GENERIC, "accepted"), (METRICS_ONLY, "accepted-metrics-variables")):
            env = otlp_environment(protocol, proxy, pki, prefix)
            accepted_before = len(accepted())
            with run_agent(agent_args(tmp_path, machine, node), tmp_path, env, prometheus=False):
                wait_for(partial(received_from, rotel, node), 30, f"an OTLP export from {node}")
                # nginx logs a request when its answer has gone back; stopping the agent before that would
                # leave it logged as 499 (client gone), so wait for a whole exchange while the agent runs.
                wait_for(partial(accepted_beyond, accepted_before), 30, f"nginx to log a push from {node}")

        resource, capacity = wait_for(lambda: rotel.latest("numa.memory.capacity"), 30, "an OTLP export")
        for request in accepted():
            assert request.uri == (
                "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export" if grpc else "/v1/metrics"
            )
            assert (request.grpc_encoding if grpc else request.content_encoding) == "gzip"
            assert request.client_subject == "CN=otel-numa-agent"
        assert resource["k8s.node.name"] == "accepted-metrics-variables"
        assert {p.attributes["numa.node.id"]: p.value for p in capacity.points} == {
            0: 8387892 * KIB,
            1: 8388608 * KIB,
            2: 8388608 * KIB,
            3: 8388608 * KIB,
        }
        # Only the run with everything right got through.
        assert nodes_received(rotel) == {"accepted", "accepted-metrics-variables"}
