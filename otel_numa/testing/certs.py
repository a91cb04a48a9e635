"""Throw-away X.509 material for TLS tests: a CA, server and client certificates, written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_PRIVATE_KEY = ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class Issued:
    """A certificate with its key, and where both were written."""

    certificate: x509.Certificate
    key: _PRIVATE_KEY
    cert_file: Path
    key_file: Path

    @property
    def serial(self) -> int:
        return self.certificate.serial_number


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(directory: Path, stem: str, certificate: x509.Certificate, key: _PRIVATE_KEY) -> Issued:
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return Issued(certificate, key, cert_file, key_file)


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=1)
    )


def make_ca(directory: Path, name: str = "otel-numa test CA") -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    certificate = _validity(builder).sign(key, hashes.SHA256())
    return _write(directory, "ca", certificate, key)


def issue(
    ca: Issued,
    directory: Path,
    stem: str,
    *,
    client: bool = False,
    serial: int | None = None,
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
) -> Issued:
    """A leaf certificate signed by ``ca``: for a server (``hosts`` as SANs) or, with ``client``, a client."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(stem))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(serial if serial is not None else x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if not client:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    certificate = _validity(builder).sign(ca.key, hashes.SHA256())
    return _write(directory, stem, certificate, key)


def serial_of(der: bytes) -> int:
    """The serial number of a DER certificate (as ``SSLSocket.getpeercert(binary_form=True)`` gives it)."""
    return x509.load_der_x509_certificate(der).serial_number


def project_secret(directory: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` the way the kubelet updates a mounted secret: a new hidden directory, then one
    atomic rename of the ``..data`` symlink; the visible names are symlinks through ``..data``."""
    directory.mkdir(parents=True, exist_ok=True)
    previous = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    version = directory / f"..{time.time_ns()}"
    version.mkdir()
    for name, content in files.items():
        (version / name).write_bytes(content)
    staging = directory / "..data_tmp"
    staging.symlink_to(version.name)
    staging.rename(directory / "..data")
    for name in files:
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(Path("..data") / name)
    if previous is not None:
        shutil.rmtree(directory / previous)
