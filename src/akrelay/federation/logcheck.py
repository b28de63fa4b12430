"""Verifying a peer's signed Merkle log during a sync pass (issue 23).

After a pass has enumerated the peer's records, :func:`check_pass` fetches the
peer's checkpoint and verifies its signature with the pinned ``log_key``, then
walks the log entries the last verified checkpoint did not cover:

* the entries must extend the kept frontier to the checkpoint's root, so a
  fork or a rewrite of anything already verified fails (the root is recomputed
  from entries, which also proves consistency with the previous checkpoint; the
  peer's own consistency proof is fetched as evidence when it does not);
* every record this pass pulled must be its entry (same ``seq``, same hash), and
  every entry the pass should have pulled and that is not withheld must have
  been pulled (a missing record);
* entries accepted after the enumeration's snapshot are fetched by ``batch``.

A failure raises :class:`LogMisbehaved` with the evidence; the engine marks the
peer ``misbehaving`` and pulls no more from it. Records beyond what the
checkpoint covers are left for the next pass (the sync checkpoint only moves
as far as the verified log).
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import TYPE_CHECKING, Callable, Mapping

from akrelay.protocol import merkle
from akrelay.protocol.note import Checkpoint, NoteError, open_checkpoint, parse_vkey
from akrelay.store.tlog import leaf_of

if TYPE_CHECKING:
    from akrelay.federation.peers import Peer
    from akrelay.federation.state import PeerState
    from akrelay.federation.transport import PeerTransport
    from akrelay.jsontypes import JSON

CHECKPOINT_PATH = "/v1/knowledge/checkpoint"
LOG_PATH = "/v1/knowledge/log"
CONSISTENCY_PATH = "/v1/knowledge/proof/consistency"
PAGE = 1000
#: How long a pass waits for the peer to sign a checkpoint covering its enumeration (it signs once a second).
COVER_WAIT = 3.0


class LogMisbehaved(Exception):
    def __init__(self, reason: str, evidence: dict[str, object]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence


def _hash(text: object, size: int, what: str) -> bytes:
    if not isinstance(text, str):
        raise LogMisbehaved(f"{what} is not base64", {})
    try:
        raw = base64.urlsafe_b64decode(text + "=") if size == 43 else base64.b64decode(text, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise LogMisbehaved(f"{what} is not base64", {}) from None
    if len(raw) != 32:
        raise LogMisbehaved(f"{what} is not a 32-byte hash", {})
    return raw


def log_name(origin: str) -> str:
    return origin.removeprefix("https://")


class _Fetch:
    def __init__(self, transport: PeerTransport, origin: str) -> None:
        self.transport = transport
        self.origin = origin

    def checkpoint(self) -> str:
        return str(self.transport.get_text(self.origin + CHECKPOINT_PATH))

    def entries(self, start: int, limit: int) -> list[JSON]:
        page = self.transport.get_json(self.origin + LOG_PATH, {"start": str(start), "limit": str(limit)})
        entries = page.get("entries") if isinstance(page, dict) else None
        if not isinstance(entries, list):
            raise LogMisbehaved("the peer's /log page has no entries array", {"start": start})
        return entries

    def consistency(self, first: int, second: int) -> list[str]:
        try:
            body = self.transport.get_json(self.origin + CONSISTENCY_PATH, {"from": str(first), "to": str(second)})
        except Exception as exc:  # noqa: BLE001 - evidence only: what the peer answered
            return [f"error: {exc}"]
        hashes = body.get("hashes") if isinstance(body, dict) else None
        return [h for h in hashes if isinstance(h, str)] if isinstance(hashes, list) else []


def check_pass(peer: Peer, transport: PeerTransport, st: PeerState, pulled: dict[int, object], pass_start: int,
               snapshot: int, batch: Callable[[list[str]], Mapping[str, object]], *, sleep: Callable[[float], None] = time.sleep,
               monotonic: Callable[[], float] = time.monotonic) -> int:
    """Verify the peer's log for this pass; return the seq up to which the pass is verified.

    (``batch`` returns a peer's batch page as parsed: its records are read where they are objects. ``pulled``
    holds each record's claimed hash as the page had it, compared with the log's entries only.)

    ``pulled`` maps the seq of every record the enumeration returned to its
    event hash (base64url); ``pass_start`` is the seq the enumeration started
    after, ``snapshot`` the peer's checkpoint (seq) at its first page. The
    caller's sync checkpoint moves to the returned seq, so what the signed log
    does not cover yet is pulled and checked again by the next pass.
    """
    fetch = _Fetch(transport, peer.origin)
    if peer.log_key is None:
        raise ValueError(f"{peer.origin} has no log key to check its log with")
    verifier = parse_vkey(peer.log_key)
    name = log_name(peer.origin)
    old: Checkpoint | None = None
    if st.log_note:
        old, _ = open_checkpoint(st.log_note, verifier, origin=name)
    covered = pass_start
    if old is not None and old.size:  # records up to the last verified entry were matched by an earlier pass
        last = fetch.entries(old.size - 1, 1)
        last_seq = last[0].get("seq") if last and isinstance(last[0], dict) else None
        if type(last_seq) is int:
            covered = max(covered, last_seq)
    for seq in [s for s in pulled if s <= covered]:
        del pulled[seq]
    after_snapshot: list[tuple[int, int, str]] = []
    deadline = monotonic() + COVER_WAIT
    while True:
        note = fetch.checkpoint()
        try:
            new, _ = open_checkpoint(note, verifier, origin=name)
        except NoteError as exc:
            raise LogMisbehaved(f"the peer's checkpoint does not verify with its pinned key: {exc}",
                                {"old": st.log_note, "new": note}) from None
        evidence: dict[str, object] = {"old": st.log_note, "new": note}
        if old is not None and new.size < old.size:
            raise LogMisbehaved(f"the peer's log shrank from {old.size} to {new.size} entries (a rewrite)", evidence)
        if old is not None and new.size == old.size and new.root != old.root:
            raise LogMisbehaved(f"two checkpoints of size {new.size} with different roots (a fork)", evidence)
        frontier = merkle.Frontier(old.size if old else 0, [_hash(h, 44, "a kept frontier hash") for h in st.log_frontier])
        while frontier.size < new.size:
            entries = fetch.entries(frontier.size, min(PAGE, new.size - frontier.size))
            if not entries:
                raise LogMisbehaved(f"the peer's /log ends at {frontier.size}, before its checkpoint's {new.size}",
                                    evidence)
            for entry in entries[: new.size - frontier.size]:
                index = frontier.size
                raw_seq = entry.get("seq") if isinstance(entry, dict) else None
                if not isinstance(entry, dict) or entry.get("index") != index or type(raw_seq) is not int:
                    raise LogMisbehaved(f"the peer's log entry {index} is malformed", evidence)
                seq, text = raw_seq, entry.get("hash")
                if not isinstance(text, str):
                    raise LogMisbehaved(f"the hash of log entry {index} is not base64", {})
                frontier.append(leaf_of(seq, _hash(text, 43, f"the hash of log entry {index}")))
                withheld = entry.get("withheld") is True
                if seq in pulled:
                    if pulled.pop(seq) != text:
                        raise LogMisbehaved(f"the record with seq {seq} differs from its log entry {index} (a rewrite)",
                                            evidence | {"index": index, "entry": text})
                elif pass_start < seq <= snapshot and not withheld:
                    raise LogMisbehaved(f"log entry {index} (seq {seq}) is a record the peer did not serve (missing)",
                                        evidence | {"index": index, "entry": text})
                elif seq > snapshot and not withheld:
                    after_snapshot.append((index, seq, text))
                covered = max(covered, seq)
        if frontier.root() != new.root:
            proof = fetch.consistency(old.size, new.size) if old is not None and old.size else []
            raise LogMisbehaved(f"the peer's log entries do not hash to its signed root of size {new.size} "
                                f"(a rewrite or a fork{f' since size {old.size}' if old else ''})",
                                evidence | {"consistency_proof": proof})
        st.log_note = note
        st.log_frontier = [base64.b64encode(h).decode() for h in frontier.hashes]
        old = new
        if covered >= snapshot or monotonic() > deadline:
            break
        sleep(0.5)  # the checkpoint does not cover this pass yet: the peer signs about once a second
    for start in range(0, len(after_snapshot), 100):  # accepted after the enumeration began: fetched by ID
        chunk = after_snapshot[start:start + 100]
        page = batch([text for _, _, text in chunk])
        rows = page.get("result", [])
        found = {r["envelope"]["hash"]: r.get("seq") for r in (rows if isinstance(rows, list) else ()) if isinstance(r, dict)}
        for index, seq, text in chunk:
            if found.get(text) != seq:
                raise LogMisbehaved(f"log entry {index} (seq {seq}) is a record the peer does not serve (missing)",
                                    {"new": st.log_note, "index": index, "entry": text})
    return min(covered, snapshot)
