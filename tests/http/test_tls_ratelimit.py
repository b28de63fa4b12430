"""The self-signed certificate and the token buckets, in isolation."""

from __future__ import annotations

import ipaddress

from cryptography import x509

from akrelay.http.ratelimit import TokenBucket, retry_after_seconds
from akrelay.tls import ensure_self_signed, required_names


def _names(path) -> set[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(san.get_values_for_type(x509.DNSName)) | {str(i) for i in san.get_values_for_type(x509.IPAddress)}


def test_certificate_covers_localhost_loopback_and_origin_host(tmp_path) -> None:
    files = ensure_self_signed(tmp_path / "data", "https://relay.example.org:9443")
    assert files.created and files.cert.is_file() and files.key.is_file()
    assert _names(files.cert) == {"localhost", "127.0.0.1", "relay.example.org"}
    assert files.key.stat().st_mode & 0o077 == 0
    again = ensure_self_signed(tmp_path / "data", "https://relay.example.org:9443")
    assert not again.created and again.cert.read_bytes() == files.cert.read_bytes()


def test_certificate_is_replaced_when_the_origin_host_changes(tmp_path) -> None:
    first = ensure_self_signed(tmp_path, "https://localhost:8443").cert.read_bytes()
    second = ensure_self_signed(tmp_path, "https://10.0.0.7:8443")
    assert second.created and second.cert.read_bytes() != first
    assert "10.0.0.7" in _names(second.cert)
    assert required_names("https://[::1]:8443")[-1] == str(ipaddress.ip_address("::1"))


def test_an_unchanged_certificate_is_checked_from_its_note_without_cryptography(tmp_path) -> None:
    """A restart reads ``tls-cert.json`` instead of importing ``cryptography.x509`` (issue 25)."""
    import json
    import subprocess
    import sys

    ensure_self_signed(tmp_path, "https://relay.example.org:9443")
    probe = ("import json, sys; from akrelay.tls import ensure_self_signed; "
             f"f = ensure_self_signed({str(tmp_path)!r}, 'https://relay.example.org:9443'); "
             "print(json.dumps([f.created, sorted(m for m in sys.modules if m.startswith('cryptography'))]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == [False, []]


def test_a_note_of_another_certificate_is_not_trusted(tmp_path) -> None:
    """The note names its certificate by SHA-256: a certificate copied over the noted one is parsed."""
    import json

    first = ensure_self_signed(tmp_path / "a", "https://relay.example.org:9443").cert.read_bytes()
    noted = json.loads((tmp_path / "a" / "tls-cert.json").read_text())
    assert "relay.example.org" in noted["names"]
    other = ensure_self_signed(tmp_path / "b", "https://localhost:8443")  # localhost and 127.0.0.1 only
    for path in (other.cert, other.key):  # copied over the first, its note left in place
        (tmp_path / "a" / path.name).write_bytes(path.read_bytes())
    again = ensure_self_signed(tmp_path / "a", "https://relay.example.org:9443")
    assert again.created and "relay.example.org" in _names(again.cert)
    assert again.cert.read_bytes() not in (first, other.cert.read_bytes())


def test_token_bucket_burst_refill_and_per_client_isolation() -> None:
    now = [0.0]
    bucket = TokenBucket(2.0, 3, clock=lambda: now[0])
    assert [bucket.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = bucket.take("a")
    assert 0.49 < wait <= 0.5
    assert bucket.take("b") == 0.0  # another client has its own bucket
    now[0] += 0.5
    assert bucket.take("a") == 0.0
    assert bucket.take("a") > 0
    assert retry_after_seconds(0.01) == 1 and retry_after_seconds(2.2) == 3


def test_zero_rate_disables_the_limit() -> None:
    bucket = TokenBucket(0, 1)
    assert not bucket.enabled
    assert all(bucket.take("a") == 0.0 for _ in range(1000))


def test_bucket_table_is_bounded() -> None:
    bucket = TokenBucket(1.0, 1, clock=lambda: 0.0, max_keys=10)
    for i in range(100):
        bucket.take(f"10.0.0.{i}")
    assert len(bucket._buckets) == 10
