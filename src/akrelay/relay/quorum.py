"""``akrelay audit --witness VKEY … --quorum K``: k of n witnesses cosigned what the audit verified.

A witness cosigns (C2SP ``cosignature/v1``) a checkpoint of the log only after it checked
consistency with every checkpoint it cosigned before, so K independent cosignatures on
checkpoints consistent with the audited one mean the relay showed those K witnesses the
same history as this auditor. Each witness's cosignature is looked for on the audited
checkpoint itself (extra signature lines), else fetched from the witness relay's
``/v1/knowledge/witness/checkpoint?origin=<log origin>`` (a witness named ``host:port``
is the relay ``https://host:port``). A cosigned checkpoint of another size counts when
the log's own consistency proof links it to the audited one; one that is *inconsistent*
is proof of a fork and fails the audit whatever the quorum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable
from urllib.parse import quote

from akrelay.protocol import merkle
from akrelay.protocol.note import (
    ALG_COSIGNATURE_V1, MAX_NOTE_BYTES, Checkpoint, NoteError, Verifier, open_checkpoint, parse_note, parse_vkey,
    verify_cosignature,
)

if TYPE_CHECKING:
    from akrelay.client import RelayClient

WITNESS_PATH = "/v1/knowledge/witness/checkpoint"


@dataclass
class QuorumResult:
    #: witness name -> what it cosigned (``size N``) for the ones that count
    good: dict[str, str] = field(default_factory=dict)
    #: witness name -> why it does not count (no cosignature, unreachable, a bad signature)
    missing: dict[str, str] = field(default_factory=dict)
    #: witness name -> the inconsistency it cosigned (a fork: fails the audit on its own)
    forked: dict[str, str] = field(default_factory=dict)


def parse_witnesses(texts: list[str]) -> list[Verifier]:
    """Distinct witness keys (a key given twice counts once); :class:`ValueError` for a bad one."""
    out: dict[tuple[str, bytes], Verifier] = {}
    for text in texts:
        try:
            verifier = parse_vkey(text, ALG_COSIGNATURE_V1)
        except NoteError as exc:
            raise ValueError(f"--witness {text!r}: {exc}") from None
        out.setdefault((verifier.name, verifier.public_key), verifier)
    return list(out.values())


def check_quorum(audited: Checkpoint, note: str, log_key: Verifier, witnesses: list[Verifier],
                 fetch: Callable[[str], str], consistency: Callable[[int, int], list[bytes]]) -> QuorumResult:
    """Which ``witnesses`` cosigned a checkpoint consistent with ``audited`` (signed by ``log_key``).

    ``fetch(url)`` returns a witness's cosigned note (raising on failure);
    ``consistency(m, n)`` is the audited relay's consistency proof.
    """
    result = QuorumResult()
    own = parse_note(note)
    for witness in witnesses:
        name = witness.name
        try:
            verify_cosignature(own, name, witness.public_key)
            result.good[name] = f"size {audited.size} (on the checkpoint itself)"
            continue
        except NoteError:
            pass
        url = f"https://{name}{WITNESS_PATH}?origin={quote(audited.origin, safe='')}"
        try:
            text = fetch(url)
        except Exception as exc:  # noqa: BLE001 - any failure to ask: this witness does not count
            result.missing[name] = f"no cosigned checkpoint from {url}: {exc}"
            continue
        try:
            checkpoint, cosigned = open_checkpoint(text, log_key, origin=audited.origin)
            verify_cosignature(cosigned, name, witness.public_key)
        except NoteError as exc:
            result.missing[name] = f"its checkpoint does not verify: {exc}"
            continue
        small, large = sorted((checkpoint, audited), key=lambda c: c.size)
        if small.size == large.size:
            consistent = small.root == large.root
        else:
            try:
                proof = consistency(small.size, large.size)
            except Exception as exc:  # noqa: BLE001 - the log cannot link them: not counted, not a fork
                result.missing[name] = (f"it cosigned size {checkpoint.size}, and the log gave no consistency proof "
                                        f"to size {audited.size}: {exc}")
                continue
            consistent = merkle.verify_consistency(small.size, large.size, small.root, large.root, proof)
        if consistent:
            result.good[name] = f"size {checkpoint.size}"
        else:
            result.forked[name] = (f"it cosigned size {checkpoint.size} root {checkpoint.root.hex()}, not consistent "
                                   f"with the audited size {audited.size} root {audited.root.hex()}")
    return result


def describe(result: QuorumResult, quorum: int) -> list[str]:
    lines = [f"witness {name}: ok, cosigned {what}" for name, what in result.good.items()]
    lines += [f"witness {name}: missing: {why}" for name, why in result.missing.items()]
    lines += [f"witness {name}: FORK: {why}" for name, why in result.forked.items()]
    return lines


def fetch_with(client: RelayClient) -> Callable[[str], str]:
    """A ``fetch`` for :func:`check_quorum` over an :class:`akrelay.client.RelayClient`'s TLS settings."""

    def fetch(url: str) -> str:
        with client._http.stream("GET", url, headers={"accept": "text/plain"}) as response:  # noqa: SLF001 - its TLS trust
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_NOTE_BYTES:
                    raise ValueError("the answer is too long for a checkpoint")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("the answer is not UTF-8") from None

    return fetch
