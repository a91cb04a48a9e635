"""The Prometheus page over TLS and mTLS: a real Prometheus scrapes it, clients without a good certificate
are refused, renewed certificates are served without a restart, and unusable files stop the start."""

from __future__ import annotations

import http.client
import re
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from otel_numa.testing.certs import Issued, issue, make_ca, project_secret, serial_of
from otel_numa.testing.peers import (
    AgentProcess,
    ScrapeJob,
    agent_command,
    http_get,
    run_agent,
    run_prometheus,
    wait_for,
)

pytestmark = pytest.mark.e2e

NODE = "tls-node"
SNAPSHOT = "16amd64-4n4c-cgroup-distance-merge"  # 4 NUMA nodes
KEPT_PREVIOUS = "TLS files changed but cannot be used, keeping the previous certificate"


@dataclass(frozen=True)
class Pki:
    ca: Issued
    server: Issued
    client: Issued
    rogue_client: Issued  # signed by a CA the agent does not trust


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = make_ca(tmp_path / "ca")
    rogue_ca = make_ca(tmp_path / "rogue-ca", name="someone else's CA")
    return Pki(
        ca=ca,
        server=issue(ca, tmp_path / "pki", "server", serial=0x1001),
        client=issue(ca, tmp_path / "pki", "scraper", client=True),
        rogue_client=issue(rogue_ca, tmp_path / "pki", "rogue-scraper", client=True),
    )


def machine_args(tmp_path: Path, hwloc_root: Callable[[str], tuple[Path, Path]]) -> list[str]:
    sysfs, procfs = hwloc_root(SNAPSHOT)
    return [
        *("--sysfs-root", str(sysfs), "--procfs-root", str(procfs), "--node-name", NODE),
        *("--kubelet-root", str(tmp_path / "no-kubelet")),
    ]


def client_context(ca: Issued, client: Issued | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert_file))  # verifies the page's certificate and IP
    if client is not None:
        context.load_cert_chain(client.cert_file, client.key_file)
    return context


def get_metrics(port: int, context: ssl.SSLContext) -> tuple[int, str]:
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def refusal(port: int, context: ssl.SSLContext) -> None:
    """Fails the test unless the page refuses the client (no HTTP answer at all)."""
    try:
        status, _ = get_metrics(port, context)
    except (ssl.SSLError, ConnectionError):
        return
    raise AssertionError(f"the page answered {status} to a client it should refuse")


def served_serial(port: int, context: ssl.SSLContext) -> int:
    """The serial number of the certificate a new TLS handshake gets."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.connect()
        assert connection.sock is not None
        der = connection.sock.getpeercert(binary_form=True)
        assert der is not None
        return serial_of(der)
    finally:
        connection.close()


def assert_no_plain_http(agent: AgentProcess) -> None:
    assert agent.prometheus_port is not None
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        connection = http.client.HTTPConnection("127.0.0.1", agent.prometheus_port, timeout=10)
        connection.request("GET", "/metrics")
        connection.getresponse()


def without_instance(
    series: dict[frozenset[tuple[str, str]], float],
) -> dict[frozenset[tuple[str, str]], float]:
    return {frozenset(kv for kv in key if kv[0] != "instance"): value for key, value in series.items()}


def test_prometheus_scrapes_the_page_over_tls(
    tmp_path: Path, pki: Pki, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    tls = ["--tls-cert-file", str(pki.server.cert_file), "--tls-key-file", str(pki.server.key_file)]
    with run_agent([*machine_args(tmp_path, hwloc_root), *tls], tmp_path) as agent:
        target = f"127.0.0.1:{agent.prometheus_port}"
        with run_prometheus(tmp_path, [target], tls_config={"ca_file": str(pki.ca.cert_file)}) as prom:
            wait_for(lambda: prom.query("numa_cpu_capacity"), 30, "the first scrape over TLS")
            job = {("job", "otel-numa"), ("k8s_node_name", NODE)}
            assert without_instance(prom.series("numa_node_count")) == {frozenset(job): 4}
            assert without_instance(prom.series("numa_cpu_capacity")) == {
                frozenset({*job, ("numa_node_id", str(node))}): 4 for node in range(4)
            }
            assert [t["scrapeUrl"] for t in prom.targets()] == [f"https://{target}/metrics"]

        # Without a client CA any client that trusts the page's certificate reads it; plain HTTP gets nothing.
        status, body = get_metrics(agent.prometheus_port or 0, client_context(pki.ca, None))
        assert status == 200 and "numa_node_count" in body
        assert_no_plain_http(agent)
        # The probes' endpoint stays plain HTTP on its own port.
        assert http_get(f"http://127.0.0.1:{agent.health_port}/healthz") == (200, b"ok\n")
        assert http_get(f"http://127.0.0.1:{agent.health_port}/readyz")[0] == 200


def test_mtls_refuses_clients_without_a_certificate_from_the_ca(
    tmp_path: Path, pki: Pki, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    tls = [
        *("--tls-cert-file", str(pki.server.cert_file), "--tls-key-file", str(pki.server.key_file)),
        *("--tls-client-ca-file", str(pki.ca.cert_file)),
    ]
    with run_agent([*machine_args(tmp_path, hwloc_root), *tls], tmp_path) as agent:
        port = agent.prometheus_port or 0
        target = f"127.0.0.1:{port}"
        with_certificate = {
            "ca_file": str(pki.ca.cert_file),
            "cert_file": str(pki.client.cert_file),
            "key_file": str(pki.client.key_file),
        }
        no_certificate = ScrapeJob("no-client-cert", [target], {"ca_file": str(pki.ca.cert_file)})
        with run_prometheus(
            tmp_path, [target], tls_config=with_certificate, extra_jobs=[no_certificate]
        ) as prom:
            wait_for(
                lambda: prom.query('numa_node_count{job="otel-numa"}'), 30, "the scrape with a certificate"
            )
            refused = wait_for(
                lambda: [t for t in prom.targets() if t["scrapePool"] == "no-client-cert" and t["lastError"]],
                30,
                "the scrape without a certificate to fail",
            )
            assert refused[0]["health"] == "down", refused
            assert without_instance(prom.series("up")) == {
                frozenset({("job", "otel-numa")}): 1,
                frozenset({("job", "no-client-cert")}): 0,
            }
            assert not prom.query('numa_node_count{job="no-client-cert"}')

        status, body = get_metrics(port, client_context(pki.ca, pki.client))
        assert status == 200 and f'numa_node_count{{k8s_node_name="{NODE}"}} 4.0' in body
        # TLS 1.3 clients learn of the refusal after their handshake: an alert or, in a race, a bare close.
        refusal(port, client_context(pki.ca, None))
        refusal(port, client_context(pki.ca, pki.rogue_client))
        assert_no_plain_http(agent)
        assert http_get(f"http://127.0.0.1:{agent.health_port}/healthz")[0] == 200
        # Refused handshakes are the clients' business: no traceback in the agent's log.
        assert "Traceback" not in agent.log()


def pem_files(server: Issued, ca: Issued) -> dict[str, bytes]:
    return {
        "tls.crt": server.cert_file.read_bytes(),
        "tls.key": server.key_file.read_bytes(),
        "ca.crt": ca.cert_file.read_bytes(),
    }


def test_renewed_certificates_are_served_without_a_restart(
    tmp_path: Path, pki: Pki, hwloc_root: Callable[[str], tuple[Path, Path]]
) -> None:
    secret = tmp_path / "secret"  # laid out as the kubelet mounts a Kubernetes TLS secret
    project_secret(secret, pem_files(pki.server, pki.ca))
    tls = [
        *("--tls-cert-file", str(secret / "tls.crt"), "--tls-key-file", str(secret / "tls.key")),
        *("--tls-client-ca-file", str(secret / "ca.crt")),
    ]
    client = client_context(pki.ca, pki.client)
    with run_agent([*machine_args(tmp_path, hwloc_root), *tls], tmp_path) as agent:
        port = agent.prometheus_port or 0
        assert served_serial(port, client) == 0x1001

        # The kubelet swaps the ..data symlink: the new certificate is served, the old one no more.
        renewed = issue(pki.ca, tmp_path / "renewed", "server", serial=0x2002)
        project_secret(secret, pem_files(renewed, pki.ca))
        wait_for(lambda: served_serial(port, client) == 0x2002, 15, "the renewed certificate")
        assert served_serial(port, client) == 0x2002
        status, body = get_metrics(port, client)
        assert status == 200 and "numa_node_count" in body
        refusal(port, client_context(pki.ca, None))
        assert KEPT_PREVIOUS not in agent.log()

        # A half-done renewal (a new certificate next to the old key) keeps the last good certificate ...
        third = issue(pki.ca, tmp_path / "third", "server", serial=0x3003)
        (secret / "tls.crt").write_bytes(third.cert_file.read_bytes())
        wait_for(lambda: KEPT_PREVIOUS in agent.log(), 15, "the agent to notice the unusable files")
        assert f"tls_key_file: {secret / 'tls.key'} does not match the certificate" in agent.log()
        assert served_serial(port, client) == 0x2002
        assert get_metrics(port, client)[0] == 200
        # ... is logged once although it is retried every second ...
        time.sleep(2.5)
        assert agent.log().count(KEPT_PREVIOUS) == 1
        # ... and is picked up as soon as the key follows.
        (secret / "tls.key").write_bytes(third.key_file.read_bytes())
        wait_for(lambda: served_serial(port, client) == 0x3003, 15, "the completed renewal")
        assert agent.process.poll() is None  # the same process all along


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agent_command(*args, "--once"),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize(
    ("case", "setting", "message"),
    [
        ("key of another certificate", "tls_key_file", "does not match the certificate in"),
        ("missing certificate file", "tls_cert_file", "cannot read"),
        ("certificate file that is no certificate", "tls_cert_file", "holds no PEM certificate"),
        ("encrypted key", "tls_key_file", "is encrypted"),
        ("client CA that is no certificate", "tls_client_ca_file", "holds no PEM certificate"),
        ("key without certificate", "tls_key_file", "tls_cert_file is needed too"),
        ("certificate without key", "tls_key_file", "tls_key_file is needed too"),
        ("client CA without certificate", "tls_client_ca_file", "set tls_cert_file and tls_key_file"),
    ],
)
def test_unusable_tls_settings_stop_the_start_with_one_line(
    tmp_path: Path, pki: Pki, case: str, setting: str, message: str
) -> None:
    other = issue(pki.ca, tmp_path / "other", "other-server")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        pki.server.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    cert, key, ca = str(pki.server.cert_file), str(pki.server.key_file), str(pki.ca.cert_file)
    args = {
        "key of another certificate": ["--tls-cert-file", cert, "--tls-key-file", str(other.key_file)],
        "missing certificate file": ["--tls-cert-file", str(tmp_path / "absent.crt"), "--tls-key-file", key],
        "certificate file that is no certificate": ["--tls-cert-file", str(junk), "--tls-key-file", key],
        "encrypted key": ["--tls-cert-file", cert, "--tls-key-file", str(encrypted)],
        "client CA that is no certificate": [
            *("--tls-cert-file", cert, "--tls-key-file", key, "--tls-client-ca-file", str(junk))
        ],
        "key without certificate": ["--tls-key-file", key],
        "certificate without key": ["--tls-cert-file", cert],
        "client CA without certificate": ["--tls-client-ca-file", ca],
    }[case]
    result = run_cli(*args)
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    # the setting, and the flag it was given as when it came from the command line
    assert re.match(rf"otel-numa: invalid setting {setting}( \(--[a-z-]+\))?: ", lines[0]), lines[0]
    assert message in lines[0]
    assert result.stdout == ""
