"""A self-signed TLS certificate so that ``akrelay serve`` speaks HTTPS out of the box.

The relay only ever runs over HTTPS (service origins are HTTPS URLs), so a fresh
data directory gets a certificate for ``localhost``, ``127.0.0.1`` and the
origin host; clients trust it with ``--cacert``. Operators replace it with
``--tls-cert/--tls-key``.

Beside it, ``tls-cert.json`` notes the names and the expiry of that certificate (by its
SHA-256), so that a restart checks an unchanged certificate without parsing it: importing
``cryptography.x509`` was about 0.1 s of CPU on the launcher's path to the workers (issue 25).
A missing or stale note only means parsing the certificate (and noting it again).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:  # annotations only: cryptography is imported where a certificate is parsed or made
    from cryptography import x509

CERT_NAME = "tls-cert.pem"
KEY_NAME = "tls-key.pem"
#: What the certificate with a given SHA-256 covers and until when (see the module's docstring).
NOTE_NAME = "tls-cert.json"


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    created: bool


def required_names(origin: str) -> list[str]:
    """``localhost``, ``127.0.0.1`` and the origin's host, without duplicates."""
    names = ["localhost", "127.0.0.1"]
    host = urlsplit(origin).hostname
    if host and host not in names:
        names.append(host)
    return names


def _san(name: str) -> x509.GeneralName:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _covers(cert_path: Path, names: list[str]) -> bool:
    try:
        pem = cert_path.read_bytes()
    except OSError:
        return False
    digest = hashlib.sha256(pem).hexdigest()
    noted = _noted(cert_path.with_name(NOTE_NAME), digest)
    if noted is None:
        parsed = _parse(pem)
        if parsed is None:
            return False
        noted = parsed
        _note(cert_path.with_name(NOTE_NAME), digest, *parsed)
    present, not_after = noted
    return all(name in present for name in names) and not_after > _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(days=1)


def _parse(pem: bytes) -> tuple[set[str], _dt.datetime] | None:
    """The names (DNS and IP) and the expiry of a PEM certificate, ``None`` if it has none or is not one."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    present = set(san.get_values_for_type(x509.DNSName))
    present |= {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return present, cert.not_valid_after_utc


def _noted(path: Path, digest: str) -> tuple[set[str], _dt.datetime] | None:
    """What the note says of the certificate with ``digest``, or ``None`` (no note, another certificate)."""
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
        if note["sha256"] != digest:
            return None
        return set(note["names"]), _dt.datetime.fromisoformat(note["not_after"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _note(path: Path, digest: str, names: set[str], not_after: _dt.datetime) -> None:
    note = {"sha256": digest, "names": sorted(names), "not_after": not_after.isoformat()}
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(note), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a read-only data directory: parse the certificate each time
        pass


def generate(names: list[str], *, days: int = 825) -> tuple[bytes, bytes]:
    """A P-256 self-signed certificate and key (PEM) covering ``names``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0]),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "akrelay self-signed")])
    now = _dt.datetime.now(_dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        # key identifiers: in a CA bundle of several relays' certificates (all named "localhost"),
        # OpenSSL then finds each one's own certificate instead of the first of that name
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def ensure_self_signed(data_dir: str | os.PathLike[str], origin: str) -> TlsFiles:
    """Reuse the data directory's certificate if it covers every name, else create one."""
    directory = Path(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / CERT_NAME, directory / KEY_NAME
    names = required_names(origin)
    if cert_path.is_file() and key_path.is_file() and _covers(cert_path, names):
        return TlsFiles(cert_path, key_path, False)
    cert_pem, key_pem = generate(names)
    _write_private(key_path, key_pem)
    tmp = cert_path.with_suffix(".tmp")
    tmp.write_bytes(cert_pem)
    os.replace(tmp, cert_path)
    parsed = _parse(cert_pem)
    if parsed is not None:
        _note(cert_path.with_name(NOTE_NAME), hashlib.sha256(cert_pem).hexdigest(), *parsed)
    return TlsFiles(cert_path, key_path, True)


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
