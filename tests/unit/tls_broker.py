"""Listeners that refuse a Kafka client as a broker's secured listener does, with no broker:
a TLS listener whose certificate a client with another CA cannot verify, one that demands a
client certificate, and one that closes every connection at once (a listener that expects
another security protocol). Certificates are made here, for the test, with `cryptography`."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.unit.sasl_broker import listening


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str,
                 issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool,
                 hosts: tuple[str, ...] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if hosts:
        names: list[x509.GeneralName] = [x509.DNSName(host) for host in hosts
                                         if not host[0].isdigit()]
        names += [x509.IPAddress(ipaddress.ip_address(host)) for host in hosts
                  if host[0].isdigit()]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certificates(directory: Path, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
                      ) -> dict[str, str]:
    """ca.pem, a server certificate it signs for `hosts` (server.pem, server.key), and another
    CA (otherca.pem) that signs nothing the server shows; their paths by those names."""
    paths: dict[str, str] = {}
    ca_key, other_key, server_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _certificate("test-ca", ca_key, "test-ca", ca_key, ca=True)
    other = _certificate("other-ca", other_key, "other-ca", other_key, ca=True)
    server = _certificate("broker", server_key, "test-ca", ca_key, ca=False, hosts=hosts)
    for name, data in (("ca.pem", _pem(ca)), ("otherca.pem", _pem(other)),
                       ("server.pem", _pem(server)), ("server.key", _key_pem(server_key))):
        (directory / name).write_bytes(data)
        paths[name] = str(directory / name)
    return paths


@contextmanager
def tls_broker(paths: dict[str, str], *, client_certificate: bool = False) -> Iterator[str]:
    """'127.0.0.1:<port>' of a TLS listener showing server.pem (demanding a client certificate
    signed by ca.pem when `client_certificate`); after a handshake it reads and closes."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(paths["server.pem"], paths["server.key"])
    if client_certificate:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(paths["ca.pem"])

    def serve(connection: socket.socket) -> None:
        with connection, suppress(OSError), \
                context.wrap_socket(connection, server_side=True) as secured:
            secured.recv(4)

    with listening(serve) as address:
        yield address


@contextmanager
def closing_broker() -> Iterator[str]:
    """'127.0.0.1:<port>' of a listener that closes each connection once it has read from it,
    as a broker's listener does a client speaking another security protocol."""

    def serve(connection: socket.socket) -> None:
        with connection, suppress(OSError):
            connection.recv(1024)

    with listening(serve) as address:
        yield address
