"""Asking a witness to cosign a log's checkpoint (the client side of C2SP ``tlog-witness``).

:func:`push_checkpoint` sends the log's latest checkpoint to a witness's
``add-checkpoint`` with ``old 0``; a witness that already cosigned a checkpoint of
the log answers 409 with that size, and the push is repeated once with the log's
consistency proof from it. The answer's cosignature lines are appended to the
checkpoint, so the result is the cosigned note.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from akrelay.protocol.note import MAX_NOTE_BYTES, parse_note
from akrelay.relay.audit import AuditFailure, LogReader, fetch_checkpoint, verifier_for

if TYPE_CHECKING:
    from akrelay.client import RelayClient

ADD_CHECKPOINT_PATH = "/v1/knowledge/witness/add-checkpoint"


def _post(witness: RelayClient, body: bytes) -> tuple[int, bytes]:
    url = witness.origin + ADD_CHECKPOINT_PATH
    with witness._http.stream("POST", url, content=body,  # noqa: SLF001 - the client's TLS trust
                              headers={"content-type": "text/plain", "accept": "text/plain"}) as response:
        data = b""
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) > MAX_NOTE_BYTES:
                raise AuditFailure("the witness's answer is too long", url)
        return response.status_code, data


def _refusal(status: int, data: bytes) -> str:
    import json

    try:
        error = json.loads(data)["error"]
        return f"{error['code']} ({status}): {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}"


def push_checkpoint(log: RelayClient, witness: RelayClient, *, pinned: str | None = None) -> str:
    """The log's latest checkpoint cosigned by ``witness`` (both :class:`akrelay.client.RelayClient`)."""
    reader = LogReader(log)
    verifier, url = verifier_for(log, pinned)
    checkpoint, note = fetch_checkpoint(reader, verifier, url)
    old, proof = 0, b""
    for _ in range(2):
        status, data = _post(witness, f"old {old}\n".encode() + proof + b"\n" + note.encode())
        if status == 200:
            try:
                return parse_note(note + data.decode("utf-8")).encode()
            except (UnicodeDecodeError, ValueError) as exc:
                raise AuditFailure(f"the witness answered lines that are not signatures: {exc}") from None
        size = None
        if status == 409:
            import json

            try:
                size = json.loads(data)["error"]["data"]["size"]
            except (ValueError, KeyError, TypeError):
                size = None
        if type(size) is not int or size == old or not 0 <= size <= checkpoint.size:
            raise AuditFailure(f"the witness refused the checkpoint of size {checkpoint.size}: {_refusal(status, data)}")
        old = size
        proof = b"".join(base64.b64encode(h) + b"\n" for h in reader.consistency(old, checkpoint.size)) \
            if 0 < old < checkpoint.size else b""
    raise AuditFailure("the witness kept answering 409 conflict")
