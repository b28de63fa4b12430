"""The C2SP ``tlog-witness`` add-checkpoint exchange, sans-I/O.

A log (or anyone) sends a witness ``old <size>``, up to 63 consistency-proof lines
(standard base64), a blank line and a signed checkpoint. The witness answers with
its ``cosignature/v1`` line once the checkpoint verifies with the log's key and is
consistent with the latest checkpoint it cosigned for that origin. This module
parses requests and decides; storing the latest checkpoint is the caller's.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from akrelay.protocol import merkle
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.note import MAX_NOTE_BYTES, Checkpoint, Note, NoteError, Verifier, parse_checkpoint, parse_note, verify_note

#: C2SP: "The client MUST NOT send more than 63 consistency proof lines."
MAX_PROOF_LINES = 63
#: The largest add-checkpoint body: the old-size line, the proof lines and a note.
MAX_BODY = 64 + MAX_PROOF_LINES * 48 + MAX_NOTE_BYTES


@dataclass(frozen=True)
class AddCheckpoint:
    old_size: int
    proof: tuple[bytes, ...]
    note: Note
    checkpoint: Checkpoint


def _bad(message: str) -> ProtocolError:
    return ProtocolError("invalid_request", message)


def parse_add_checkpoint(body: bytes) -> AddCheckpoint:
    """The request, or a 400 ``invalid_request`` saying what is malformed."""
    if len(body) > MAX_BODY:
        raise ProtocolError("payload_too_large", f"An add-checkpoint body is at most {MAX_BODY} bytes.")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad("The add-checkpoint body is not UTF-8.") from None
    head, sep, rest = text.partition("\n\n")
    if not sep:
        raise _bad("An add-checkpoint body is 'old <size>', proof lines, a blank line, then the checkpoint.")
    lines = head.split("\n")
    first = lines[0]
    size = first[4:]
    if not first.startswith("old ") or not size.isascii() or not size.isdigit() or len(size) > 19 \
            or (size != "0" and size[0] == "0"):
        raise _bad("The first line must be 'old <size>' with a decimal size without leading zeros.")
    if len(lines) - 1 > MAX_PROOF_LINES:
        raise _bad(f"At most {MAX_PROOF_LINES} consistency proof lines are allowed.")
    proof = []
    for n, line in enumerate(lines[1:], 1):
        try:
            value = base64.b64decode(line.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            value = b""
        if len(value) != merkle.HASH_SIZE:
            raise _bad(f"Consistency proof line {n} is not a base64 32-byte hash.")
        proof.append(value)
    try:
        note = parse_note(rest)
        checkpoint = parse_checkpoint(note.text)
    except NoteError as exc:
        raise _bad(f"The checkpoint is malformed: {exc}.") from None
    if int(size) > checkpoint.size:
        raise _bad(f"The old size {size} is larger than the checkpoint's size {checkpoint.size}.")
    if size == "0" and proof:
        raise _bad("The consistency proof must be empty when the old size is 0.")
    return AddCheckpoint(int(size), tuple(proof), note, checkpoint)


def check_signature(request: AddCheckpoint, verifiers: dict[str, Verifier]) -> None:
    """404 ``not_found`` for an origin the witness does not know, 403 if the log's key did not sign it."""
    verifier = verifiers.get(request.checkpoint.origin)
    if verifier is None:
        raise ProtocolError("not_found", f"This witness does not know the log {request.checkpoint.origin!r}.")
    try:
        verify_note(request.note, verifier)
    except NoteError as exc:
        raise ProtocolError("permission_denied", f"The checkpoint is not signed by the log's known key: {exc}.") \
            from None


def check_consistency(request: AddCheckpoint, latest: Checkpoint | None) -> None:
    """Against the latest checkpoint cosigned for the origin (``None``: never): 409 or 422 when it fails."""
    latest_size = latest.size if latest is not None else 0
    if request.old_size != latest_size:
        raise ProtocolError("checkpoint_conflict", f"The old size {request.old_size} is not the size of the latest "
                            f"checkpoint this witness cosigned for {request.checkpoint.origin!r}: {latest_size}.",
                            {"size": latest_size})
    if latest is None:
        return
    new = request.checkpoint
    if new.size == latest.size:
        if new.root != latest.root:
            raise ProtocolError("checkpoint_conflict", f"A checkpoint of size {new.size} with another root was "
                                "cosigned before: the log has forked.", {"size": latest_size})
        return
    if not merkle.verify_consistency(latest.size, new.size, latest.root, new.root, request.proof):
        raise ProtocolError("inconsistent_checkpoint", f"The consistency proof from size {latest.size} to "
                            f"{new.size} does not verify against the roots.")
