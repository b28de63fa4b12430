"""C2SP signed notes, ``tlog-checkpoint`` bodies, verifier keys and ``cosignature/v1``, sans-I/O.

A signed note is a UTF-8 text ending in a newline, a blank line, then one line
per signature: ``— <name> <base64(key ID || signature)>`` (U+2014 and a space).
An Ed25519 key ID is the first 4 bytes of ``SHA-256(name || 0x0A || 0x01 || key)``;
a ``cosignature/v1`` key ID uses the byte 0x04, and its signature covers
``cosignature/v1\\ntime <t>\\n`` followed by the checkpoint body.
The signing keys are :mod:`cryptography` Ed25519 objects the caller holds.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

DASH = "\u2014 "
ALG_ED25519 = 0x01
ALG_COSIGNATURE_V1 = 0x04
#: A note longer than this is refused before parsing (a checkpoint is a few hundred bytes).
MAX_NOTE_BYTES = 1 << 16
MAX_SIGNATURES = 100


class NoteError(ValueError):
    """A malformed note, checkpoint or verifier key, or a signature that does not verify."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise NoteError(f"{what} is not standard base64") from None


def _check_name(name: str) -> None:
    if not name or any(c.isspace() for c in name) or "+" in name:
        raise NoteError(f"key name {name!r} must be non-empty, without spaces or '+'")


def raw_public_key(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id(name: str, public_key: bytes, alg: int = ALG_ED25519) -> bytes:
    """The 4-byte key ID (key hash) of ``name`` and a raw 32-byte public key."""
    return hashlib.sha256(name.encode() + b"\n" + bytes([alg]) + public_key).digest()[:4]


def vkey(name: str, public_key: bytes) -> str:
    """The C2SP verifier key ``<name>+<8 hex of key ID>+<base64(0x01 || key)>``."""
    _check_name(name)
    return f"{name}+{key_id(name, public_key).hex()}+{_b64(bytes([ALG_ED25519]) + public_key)}"


@dataclass(frozen=True)
class Verifier:
    name: str
    key_id: bytes
    public_key: bytes

    def verify(self, message: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature, message)
            return True
        except (InvalidSignature, ValueError):
            return False


def parse_vkey(text: str, alg: int = ALG_ED25519) -> Verifier:
    """A C2SP verifier key: a log's (``alg`` 0x01) or, with ``ALG_COSIGNATURE_V1``, a witness's (0x04)."""
    parts = text.strip().split("+", 2)  # the base64 key may itself contain '+'
    if len(parts) != 3:
        raise NoteError("a verifier key is <name>+<hex key ID>+<base64 key>")
    name, hex_id, b64 = parts
    _check_name(name)
    try:
        kid = bytes.fromhex(hex_id)
    except ValueError:
        raise NoteError("the verifier key's ID is not hex") from None
    key = _unb64(b64, "the verifier key")
    if len(kid) != 4 or len(hex_id) != 8:
        raise NoteError("the verifier key's ID is 8 hex digits")
    if len(key) != 33 or key[0] != alg:
        if alg == ALG_COSIGNATURE_V1:
            raise NoteError("a witness verifier key is cosignature/v1 (0x04 || 32-byte Ed25519 key)")
        raise NoteError("only Ed25519 verifier keys (0x01 || 32 bytes) are supported")
    if key_id(name, key[1:], alg) != kid:
        raise NoteError("the verifier key's ID does not match its name and key")
    return Verifier(name, kid, key[1:])


@dataclass(frozen=True)
class Signature:
    name: str
    key_id: bytes
    signature: bytes  # after the key ID (for a cosignature: the 8-byte time, then the signature)

    def line(self) -> str:
        return f"{DASH}{self.name} {_b64(self.key_id + self.signature)}\n"


@dataclass(frozen=True)
class Note:
    text: str  # the body, ending in "\n"
    signatures: tuple[Signature, ...] = ()

    def encode(self) -> str:
        return self.text + "\n" + "".join(s.line() for s in self.signatures)


def parse_note(data: str | bytes) -> Note:
    if isinstance(data, bytes):
        if len(data) > MAX_NOTE_BYTES:
            raise NoteError("the note is too long")
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise NoteError("the note is not UTF-8") from None
    if len(data) > MAX_NOTE_BYTES:
        raise NoteError("the note is too long")
    cut = data.rfind("\n\n")
    if cut < 0 or not data.endswith("\n"):
        raise NoteError("a signed note is a text, a blank line and signature lines, each ending in a newline")
    text, sigs = data[: cut + 1], data[cut + 2 :]
    if "\r" in data or any(ord(c) < 0x20 and c != "\n" for c in data):
        raise NoteError("a note has no control characters but newlines")
    signatures: list[Signature] = []
    for line in sigs.split("\n")[:-1]:
        if not line.startswith(DASH):
            raise NoteError("a signature line starts with an em dash and a space")
        fields = line[len(DASH) :].split(" ")
        if len(fields) != 2:
            raise NoteError("a signature line is '— <name> <base64>'")
        name, blob = fields
        _check_name(name)
        raw = _unb64(blob, "a signature")
        if len(raw) < 5:
            raise NoteError("a signature is too short")
        signatures.append(Signature(name, raw[:4], raw[4:]))
        if len(signatures) > MAX_SIGNATURES:
            raise NoteError("too many signatures")
    if not signatures:
        raise NoteError("the note has no signature")
    return Note(text, tuple(signatures))


def sign_note(text: str, name: str, key: Ed25519PrivateKey) -> Note:
    """``text`` (ending in a newline) signed by ``key`` as ``name``."""
    _check_name(name)
    if not text.endswith("\n") or "\n\n" in text:
        raise NoteError("a note text ends in a newline and has no blank line")
    public = raw_public_key(key.public_key())
    return Note(text, (Signature(name, key_id(name, public), key.sign(text.encode())),))


def verify_note(note: Note, verifier: Verifier) -> None:
    """Raise :class:`NoteError` unless one signature line is ``verifier``'s and verifies."""
    for sig in note.signatures:
        if sig.name == verifier.name and sig.key_id == verifier.key_id:
            if verifier.verify(note.text.encode(), sig.signature):
                return
            raise NoteError(f"the signature of {verifier.name} does not verify")
    raise NoteError(f"the note has no signature by {verifier.name}+{verifier.key_id.hex()}")


# -- tlog-checkpoint ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        return "".join(line + "\n" for line in (self.origin, str(self.size), _b64(self.root), *self.extensions))


def parse_checkpoint(text: str) -> Checkpoint:
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "":
        raise NoteError("a checkpoint body is an origin, a size and a root hash, each on its own line")
    origin, size_text, root_text, *ext = lines[:-1]
    if not origin:
        raise NoteError("the checkpoint's origin line is empty")
    if not size_text.isascii() or not size_text.isdigit() or (size_text != "0" and size_text[0] == "0"):
        raise NoteError("the checkpoint's tree size is not a decimal number")
    if len(size_text) > 19:
        raise NoteError("the checkpoint's tree size is too large")
    root = _unb64(root_text, "the checkpoint's root hash")
    if len(root) != 32:
        raise NoteError("the checkpoint's root hash is not 32 bytes")
    if any(not line for line in ext):
        raise NoteError("a checkpoint extension line is empty")
    return Checkpoint(origin, int(size_text), root, tuple(ext))


def open_checkpoint(data: str | bytes, verifier: Verifier, origin: str | None = None) -> tuple[Checkpoint, Note]:
    """Parse a signed checkpoint and check ``verifier``'s signature (and the origin line if given)."""
    note = parse_note(data)
    verify_note(note, verifier)
    checkpoint = parse_checkpoint(note.text)
    if origin is not None and checkpoint.origin != origin:
        raise NoteError(f"the checkpoint is for origin {checkpoint.origin!r}, not {origin!r}")
    return checkpoint, note


# -- cosignature/v1 (C2SP tlog-cosignature) ----------------------------------------------------------------
def cosignature_message(body: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {int(timestamp)}\n{body}".encode()


def cosign(note: Note, name: str, key: Ed25519PrivateKey, timestamp: int) -> Note:
    """Add a witness's ``cosignature/v1`` line over the checkpoint ``note.text`` at ``timestamp`` (Unix seconds)."""
    _check_name(name)
    public = raw_public_key(key.public_key())
    sig = key.sign(cosignature_message(note.text, timestamp))
    line = Signature(name, key_id(name, public, ALG_COSIGNATURE_V1), struct.pack(">Q", timestamp) + sig)
    kept = tuple(s for s in note.signatures if s.name != name)
    return Note(note.text, kept + (line,))


def verify_cosignature(note: Note, name: str, public_key: bytes) -> int:
    """The timestamp of ``name``'s valid cosignature on ``note``; :class:`NoteError` if there is none."""
    kid = key_id(name, public_key, ALG_COSIGNATURE_V1)
    for sig in note.signatures:
        if sig.name == name and sig.key_id == kid and len(sig.signature) == 72:
            timestamp = struct.unpack(">Q", sig.signature[:8])[0]
            if Verifier(name, kid, public_key).verify(cosignature_message(note.text, timestamp), sig.signature[8:]):
                return int(timestamp)
            raise NoteError(f"the cosignature of {name} does not verify")
    raise NoteError(f"the note has no cosignature by {name}")
