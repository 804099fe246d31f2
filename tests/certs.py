"""Throwaway PKI for TLS tests: a CA, a server certificate for 127.0.0.1, a client one.

Made with `cryptography` (a dev extra) into a temporary folder; nothing touches the
system trust store.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    other_key: Path  # a key that belongs to no certificate here
    encrypted_key: Path  # the server key, encrypted with a password


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password
        else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             encryption)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str,
                 issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool,
                 usage: x509.ObjectIdentifier | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject))
               .issuer_name(_name(issuer)).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(folder: Path) -> Pki:
    ca_key, server_key, client_key, other_key = _key(), _key(), _key(), _key()
    ca = _certificate("surge test CA", ca_key, "surge test CA", ca_key, ca=True)
    server = _certificate("127.0.0.1", server_key, "surge test CA", ca_key, ca=False,
                          usage=ExtendedKeyUsageOID.SERVER_AUTH)
    client = _certificate("test client", client_key, "surge test CA", ca_key, ca=False,
                          usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    files = {
        "ca.pem": ca.public_bytes(serialization.Encoding.PEM),
        "cert.pem": server.public_bytes(serialization.Encoding.PEM),
        "key.pem": _pem(server_key),
        "client.pem": client.public_bytes(serialization.Encoding.PEM),
        "client-key.pem": _pem(client_key),
        "other-key.pem": _pem(other_key),
        "encrypted-key.pem": _pem(server_key, b"hunter2-password"),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
        (folder / name).chmod(0o600)
    return Pki(ca=folder / "ca.pem", cert=folder / "cert.pem", key=folder / "key.pem",
               client_cert=folder / "client.pem", client_key=folder / "client-key.pem",
               other_key=folder / "other-key.pem",
               encrypted_key=folder / "encrypted-key.pem")
