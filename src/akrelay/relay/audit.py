"""Auditing a relay's Merkle log from the outside (``akrelay audit``, ``get/submit --prove``, peers).

What is checked, each step with the sans-I/O core (:mod:`akrelay.protocol.merkle`,
:mod:`akrelay.protocol.note`) over plain HTTP reads:

1. the checkpoint's signature, against the discovery document's ``vkey`` or a pinned one;
2. consistency with the last checkpoint seen from that origin (a small JSON state file):
   a smaller tree, another root at the same size or a failing consistency proof is a fork;
3. with ``full``: the root recomputed from every entry of ``/v1/knowledge/log``, and
   every record that is not withheld fetched (by batches) and matched to its entry.

Every mismatch raises :class:`AuditFailure` saying what and where; the state file
is written only after every check passed.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from akrelay.protocol import merkle
from akrelay.protocol.note import Checkpoint, NoteError, Verifier, open_checkpoint, parse_vkey
from akrelay.store.base import event_hash_bytes
from akrelay.store.tlog import leaf_of

if TYPE_CHECKING:
    from akrelay.client import RelayClient

CHECKPOINT_PATH = "/v1/knowledge/checkpoint"
PAGE = 1000
BATCH = 100


class AuditFailure(Exception):
    """The relay's log does not check out: ``what`` went wrong, ``where`` (index, seq, sizes)."""

    def __init__(self, what: str, where: str = "") -> None:
        super().__init__(f"{what}{f' ({where})' if where else ''}")
        self.what = what
        self.where = where


@dataclass
class AuditResult:
    checkpoint: Checkpoint
    note: str
    previous: int | None = None
    entries: int = 0
    records: int = 0
    withheld: int = 0
    notes: list[str] = field(default_factory=list)


def _b64(text: object, what: str) -> bytes:
    try:
        value = base64.b64decode(str(text).encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise AuditFailure(f"{what} is not base64") from None
    if len(value) != 32:
        raise AuditFailure(f"{what} is not 32 bytes")
    return value


def _b64url(text: object, what: str) -> bytes:
    if not isinstance(text, str) or len(text) != 43:
        raise AuditFailure(f"{what} is not a 43-character base64url hash")
    try:
        return event_hash_bytes(text)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise AuditFailure(f"{what} is not base64url") from None


class LogReader:
    """The log reads of one relay, over a :class:`akrelay.client.RelayClient`'s HTTP connection."""

    def __init__(self, client: RelayClient) -> None:
        self.client = client

    def _url(self, path: str) -> str:
        return self.client.origin + path

    def json(self, path: str) -> Mapping[str, object]:
        """A JSON object the relay answered; its members are checked where they are read."""
        body = self.client._request("GET", self._url(path))  # noqa: SLF001 - the client's checked GET
        if not isinstance(body, dict):
            raise AuditFailure("the relay's answer is not a JSON object", path)
        return body

    def checkpoint_text(self, url: str | None = None) -> str:
        url = url or self._url(CHECKPOINT_PATH)
        self.client._check_url(url)  # noqa: SLF001
        response = self.client._http.get(url, headers={"accept": "text/plain"})  # noqa: SLF001
        if response.status_code != 200:
            raise AuditFailure(f"the checkpoint answered HTTP {response.status_code}", url)
        return str(response.text)

    def entries(self, start: int, limit: int) -> dict[str, object]:
        return dict(self.json(f"/v1/knowledge/log?start={start}&limit={limit}"))

    def inclusion(self, seq: int, size: int) -> list[bytes]:
        body = self.json(f"/v1/knowledge/proof/inclusion?seq={seq}&size={size}")
        return [_b64(h, "an inclusion proof hash") for h in _hashes(body)]

    def consistency(self, first: int, second: int) -> list[bytes]:
        body = self.json(f"/v1/knowledge/proof/consistency?from={first}&to={second}")
        return [_b64(h, "a consistency proof hash") for h in _hashes(body)]


def _hashes(body: Mapping[str, object]) -> list[object]:
    """A proof's ``hashes`` member (absent: none)."""
    hashes = body.get("hashes", [])
    if not isinstance(hashes, list):
        raise AuditFailure("a proof's hashes are not an array")
    return hashes


def verifier_for(client: RelayClient, pinned: str | None) -> tuple[Verifier, str | None]:
    """The log's verifier (pinned, else discovery's) and its checkpoint URL from discovery."""
    doc = client.discovery or client.discover()
    info = doc.get("log") if isinstance(doc, dict) else None
    url = info.get("checkpoint") if isinstance(info, dict) else None
    try:
        if pinned:
            return parse_vkey(pinned), url if isinstance(url, str) else None
        if not isinstance(info, dict) or not isinstance(info.get("vkey"), str):
            raise AuditFailure("the relay's discovery document has no log (no `log.vkey`), and no key was pinned")
        return parse_vkey(info["vkey"]), url if isinstance(url, str) else None
    except NoteError as exc:
        raise AuditFailure(f"the log key is not a valid verifier key: {exc}") from None


def fetch_checkpoint(reader: LogReader, verifier: Verifier, url: str | None = None) -> tuple[Checkpoint, str]:
    text = reader.checkpoint_text(url)
    try:
        checkpoint, _ = open_checkpoint(text, verifier, origin=verifier.name)
    except NoteError as exc:
        raise AuditFailure(f"the checkpoint does not verify: {exc}", url or CHECKPOINT_PATH) from None
    return checkpoint, text


def check_consistency(reader: LogReader, old: Checkpoint, new: Checkpoint) -> None:
    """Raise :class:`AuditFailure` unless ``new`` extends ``old`` (append-only)."""
    if new.size < old.size:
        raise AuditFailure("the log shrank: the new checkpoint is smaller than one seen before",
                           f"sizes {old.size} then {new.size}")
    if new.size == old.size:
        if new.root != old.root:
            raise AuditFailure("fork: two checkpoints of the same size with different roots", f"size {new.size}")
        return
    proof = reader.consistency(old.size, new.size)
    if not merkle.verify_consistency(old.size, new.size, old.root, new.root, proof):
        raise AuditFailure("the log was rewritten: the consistency proof fails", f"from size {old.size} to {new.size}")


def verify_inclusion(reader: LogReader, record: Mapping[str, object], checkpoint: Checkpoint) -> int:
    """Check that ``record`` (an acceptance record) is in the tree of ``checkpoint``; its leaf index."""
    seq = record.get("seq")
    if type(seq) is not int:
        raise AuditFailure("the record has no integer seq")
    body = reader.json(f"/v1/knowledge/proof/inclusion?seq={seq}&size={checkpoint.size}")
    index = body.get("index")
    if type(index) is not int:
        raise AuditFailure("the inclusion proof has no index", f"seq {seq}")
    hashes = [_b64(h, "an inclusion proof hash") for h in _hashes(body)]
    envelope = record.get("envelope")
    leaf = leaf_of(seq, _b64url(envelope.get("hash") if isinstance(envelope, dict) else None, "the record's hash"))
    if not merkle.verify_inclusion(index, checkpoint.size, leaf, hashes, checkpoint.root):
        raise AuditFailure("the inclusion proof does not verify", f"seq {seq}, index {index}, size {checkpoint.size}")
    return index


class State:
    """The last verified checkpoint per log origin, in a small JSON file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data: dict[str, object] = {}
        if path is not None and path.exists():
            try:
                self.data = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise AuditFailure(f"the state file {path} is unreadable: {exc}") from None
            if not isinstance(self.data, dict):
                raise AuditFailure(f"the state file {path} is not a JSON object")

    def get(self, origin: str) -> Checkpoint | None:
        value = self.data.get(origin)
        if not isinstance(value, dict):
            return None
        try:
            return Checkpoint(origin, int(value["size"]), _b64(value["root"], "the saved root"))
        except (KeyError, TypeError, ValueError):
            raise AuditFailure(f"the state file's entry for {origin} is malformed") from None

    def put(self, checkpoint: Checkpoint, note: str) -> None:
        self.data[checkpoint.origin] = {"size": checkpoint.size, "root": base64.b64encode(checkpoint.root).decode(),
                                        "note": note}
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)


def audit(client: RelayClient, *, pinned: str | None = None, state: State | None = None, full: bool = False,
          progress: Callable[[str, int, int], None] | None = None) -> AuditResult:
    """Audit the relay behind ``client``; :class:`AuditFailure` on the first mismatch."""
    reader = LogReader(client)
    verifier, url = verifier_for(client, pinned)
    expected = client.origin.removeprefix("https://")
    if verifier.name != expected:
        raise AuditFailure(f"the log key is for origin {verifier.name!r}, not for this relay ({expected!r})")
    checkpoint, note = fetch_checkpoint(reader, verifier, url)
    result = AuditResult(checkpoint, note)
    state = state or State(None)
    previous = state.get(checkpoint.origin)
    if previous is not None:
        result.previous = previous.size
        try:
            check_consistency(reader, previous, checkpoint)
        except AuditFailure as exc:
            if state.path is None:
                raise
            # the kept checkpoint may be of another relay that served this origin before (a newcomer's
            # second relay on localhost:8443): say where it came from, so that the reader can tell
            raise AuditFailure(exc.what, "; ".join(filter(None, [
                exc.where, f"against the checkpoint of {checkpoint.origin} kept in {state.path}; if another relay "
                f"now serves this origin, audit it with --state pointing at another file"]))) from None
    if full:
        _full(reader, client, checkpoint, result, progress)
    state.put(checkpoint, note)
    return result


def _full(reader: LogReader, client: RelayClient, checkpoint: Checkpoint, result: AuditResult,
          progress: Callable[[str, int, int], None] | None) -> None:
    frontier = merkle.Frontier()
    visible: list[tuple[int, int, bytes]] = []  # (index, seq, event hash) of records to fetch
    last_seq = 0
    while frontier.size < checkpoint.size:
        page = reader.entries(frontier.size, min(PAGE, checkpoint.size - frontier.size))
        entries = page.get("entries")
        if not isinstance(entries, list) or not entries:
            raise AuditFailure("the log has fewer entries than its checkpoint", f"at index {frontier.size}, "
                               f"checkpoint size {checkpoint.size}")
        for entry in entries:
            index = frontier.size
            if not isinstance(entry, dict) or entry.get("index") != index:
                raise AuditFailure("the log's entries are not contiguous", f"expected index {index}")
            seq = entry.get("seq")
            if type(seq) is not int or seq <= last_seq:
                raise AuditFailure("the log's seqs do not increase", f"index {index}")
            last_seq = seq
            event_hash = _b64url(entry.get("hash"), f"the hash of entry {index}")
            frontier.append(leaf_of(seq, event_hash))
            if entry.get("withheld") is True:
                result.withheld += 1
            else:
                visible.append((index, seq, event_hash))
            if frontier.size == checkpoint.size:
                break
        if progress is not None:
            progress("entries", frontier.size, checkpoint.size)
    result.entries = frontier.size
    if frontier.root() != checkpoint.root:
        raise AuditFailure("the log's entries do not hash to the checkpoint's root",
                           f"size {checkpoint.size}: entries or records were changed")
    for start in range(0, len(visible), BATCH):
        chunk = visible[start : start + BATCH]
        _check_records(client, chunk)
        result.records += len(chunk)
        if progress is not None:
            progress("records", result.records, len(visible))


def _check_records(client: RelayClient, chunk: list[tuple[int, int, bytes]]) -> None:
    from akrelay.client import ResponseError, ServiceError

    ids = {base64.urlsafe_b64encode(h).rstrip(b"=").decode(): (index, seq) for index, seq, h in chunk}
    try:
        page = client.batch(list(ids))
    except ResponseError:
        page = None  # one bad record spoils the page: find it one by one
    if page is not None:
        for event_id in page.get("missing", []):
            index, seq = ids[event_id]
            raise AuditFailure("a record in the log is missing from the relay", f"index {index}, seq {seq}, "
                               f"hash {event_id}")
        for record in page.get("result", []):
            index, seq = ids[record["envelope"]["hash"]]
            if record.get("seq") != seq:
                raise AuditFailure("a record's seq differs from its log entry",
                                   f"index {index}: entry seq {seq}, record seq {record.get('seq')}")
        return
    for event_id, (index, seq) in ids.items():
        try:
            record = client.get(event_id)
        except ResponseError as exc:
            raise AuditFailure(f"a record does not verify: {exc}", f"index {index}, seq {seq}") from None
        except ServiceError as exc:
            raise AuditFailure(f"a record in the log cannot be read: {exc.code}", f"index {index}, seq {seq}") from None
        if record.get("seq") != seq:
            raise AuditFailure("a record's seq differs from its log entry", f"index {index}, seq {seq}")
