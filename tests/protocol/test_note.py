"""C2SP signed notes, checkpoints, verifier keys and cosignatures.

Known vector: the example note of golang.org/x/mod/sumdb/note (BSD-3-Clause),
the reference implementation of the C2SP signed-note format: its signer key
``PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz``,
its verifier key and its signed note. Ed25519 is deterministic, so signing the
text again must give the same note byte for byte.
"""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from akrelay.protocol import note as n

GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_SEED = base64.b64decode("AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz")[1:]
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_NOTE = (GO_TEXT + "\n\u2014 PeterNeumann "
           "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n")


def test_go_reference_note() -> None:
    key = Ed25519PrivateKey.from_private_bytes(GO_SEED)
    public = n.raw_public_key(key.public_key())
    assert n.vkey("PeterNeumann", public) == GO_VKEY
    assert n.sign_note(GO_TEXT, "PeterNeumann", key).encode() == GO_NOTE
    verifier = n.parse_vkey(GO_VKEY)
    note = n.parse_note(GO_NOTE)
    n.verify_note(note, verifier)
    with pytest.raises(n.NoteError):
        n.verify_note(n.parse_note(GO_NOTE.replace("cryptography", "cryptographY")), verifier)


@pytest.mark.parametrize("bad", [
    "PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # wrong ID
    "PeterNeumanm+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # wrong name
    "PeterNeumann+c74f20a3+AhpcQcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # not Ed25519 / length
    "PeterNeumann+c74f20a3", "+c74f20a3+ARpc", "PeterNeumann+zz4f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    "PeterNeumann+c74f20a3+!!!",
])
def test_bad_verifier_keys(bad: str) -> None:
    with pytest.raises(n.NoteError):
        n.parse_vkey(bad)


@pytest.mark.parametrize("bad", [
    "", "no blank line\n", "text\n\n", "text\n\nno dash\n", "text\n\n\u2014 name notbase64!\n",
    "text\n\n\u2014 name AAAA\n", "text\n\n\u2014 name AAAAAAAA", "a\rb\n\n\u2014 n AAAAAAAA\n",
    "x" * (n.MAX_NOTE_BYTES + 1),
])
def test_bad_notes(bad: str) -> None:
    with pytest.raises(n.NoteError):
        n.parse_note(bad)


def test_checkpoint_round_trip_and_checks() -> None:
    key = Ed25519PrivateKey.generate()
    cp = n.Checkpoint("localhost:8443", 12, bytes(range(32)))
    assert cp.body() == "localhost:8443\n12\n" + base64.b64encode(bytes(range(32))).decode() + "\n"
    signed = n.sign_note(cp.body(), cp.origin, key).encode()
    verifier = n.parse_vkey(n.vkey(cp.origin, n.raw_public_key(key.public_key())))
    got, _ = n.open_checkpoint(signed, verifier, origin="localhost:8443")
    assert got == cp
    with pytest.raises(n.NoteError):
        n.open_checkpoint(signed, verifier, origin="elsewhere")
    other = n.parse_vkey(n.vkey(cp.origin, n.raw_public_key(Ed25519PrivateKey.generate().public_key())))
    with pytest.raises(n.NoteError):
        n.open_checkpoint(signed, other)
    for body in ("o\n01\nAAAA\n", "o\n-1\n" + base64.b64encode(bytes(32)).decode() + "\n", "o\n1\nAAAA\n",
                 "\n1\n" + base64.b64encode(bytes(32)).decode() + "\n", "o\n1\n"):
        with pytest.raises(n.NoteError):
            n.parse_checkpoint(body)


def test_cosignature() -> None:
    log_key, witness = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    note = n.sign_note(n.Checkpoint("example.org", 3, bytes(32)).body(), "example.org", log_key)
    cosigned = n.cosign(note, "witness.example", witness, 1_700_000_000)
    again = n.parse_note(cosigned.encode())
    public = n.raw_public_key(witness.public_key())
    assert n.verify_cosignature(again, "witness.example", public) == 1_700_000_000
    assert len(again.signatures) == 2
    assert again.signatures[1].key_id == n.key_id("witness.example", public, 0x04) != n.key_id("witness.example", public)
    forged = n.Note(again.text.replace("\n3\n", "\n4\n"), again.signatures)
    with pytest.raises(n.NoteError):
        n.verify_cosignature(forged, "witness.example", public)
