"""Certificates and keys for the loopback control plane (cryptography; nothing leaves the run
directory): a cluster CA (API server serving cert, client certs), a front-proxy CA (the API
aggregator's client cert, for KEDA's metrics adapter), the service-account signing key, and
KEDA's CA + serving cert (its operator's gRPC metrics service and its adapter)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID = datetime.timedelta(days=2)


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass
class CA:
    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    cert_path: Path

    @classmethod
    def create(cls, out: Path, name: str) -> CA:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + VALID)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, encipher_only=False, decipher_only=False),
                               critical=True)
                .sign(key, hashes.SHA256()))
        path = out / f"{name}.crt"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (out / f"{name}.key").write_bytes(_pem_key(key))
        return cls(name, key, cert, path)

    def issue(self, out: Path, name: str, *, cn: str, orgs: tuple[str, ...] = (), hosts: tuple[str, ...] = (),
              server: bool = False, client: bool = False) -> tuple[Path, Path]:
        """A leaf cert + key, written as ``<name>.crt`` / ``<name>.key`` in ``out``."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
        now = datetime.datetime.now(datetime.UTC)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        b = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(self.cert.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if hosts:
            sans: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = b.sign(self.key, hashes.SHA256())
        crt, k = out / f"{name}.crt", out / f"{name}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        k.write_bytes(_pem_key(key))
        return crt, k


def service_account_keys(out: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv, pub = out / "sa.key", out / "sa.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub
