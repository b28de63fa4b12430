"""The signed, append-only Merkle log of every acceptance (issue 23): checkpoints and proofs.

The store appends the tree in the commit (:mod:`akrelay.store.tlog`); this
module signs C2SP checkpoints of it with the relay's log key and answers the
``/v1/knowledge/log`` and ``/proof`` reads, with every bad size a
:class:`ProtocolError` (400). Hashing and formats are the sans-I/O core's
(:mod:`akrelay.protocol.merkle`, :mod:`akrelay.protocol.note`).

Signing: :meth:`TransparencyLog.tick` (called every second by the node's log
component, and by a read that finds no checkpoint yet) signs when the log has
grown and the last checkpoint is at least :data:`MIN_INTERVAL` old, so a
growing log gets one at most once a second and, with the ticker, at least
once a minute. Before signing it proves the new tree consistent with the last
signed checkpoint, kept durably in the store (``meta``, shared by every node of
a Redis deployment) and in the data directory; if that fails (a restore from an
older backup, a rewritten database) it signs nothing and says so, and keeps
serving the last good checkpoint.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NotRequired, Sequence, TypedDict

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from akrelay.protocol import merkle
from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.note import (ALG_COSIGNATURE_V1, Checkpoint, NoteError, Verifier, key_id, open_checkpoint,
                                   parse_vkey, raw_public_key, sign_note, vkey)
from akrelay.store.base import Store, StoreUnavailable
from akrelay.store.capabilities import LogFollowing

log = logging.getLogger("akrelay.transparency")

KEY_NAME = "log-key.pem"
CHECKPOINT_FILE = "log-checkpoint"
META_KEY = "tlog.checkpoint"
#: at most one checkpoint a second
MIN_INTERVAL = 1.0
MAX_PAGE = 1000
CHECKPOINT_PATH = "/v1/knowledge/checkpoint"
WITNESS_PATH = "/v1/knowledge/witness/checkpoint"


class EntryObject(TypedDict):
    """One entry of ``GET /v1/log/entries``: ``retained`` is there (false) once the record is gone."""

    index: int
    seq: int
    hash: str
    withheld: bool
    retained: NotRequired[bool]


class EntriesPage(TypedDict):
    entries: list[EntryObject]
    size: int


class InclusionProof(TypedDict):
    seq: int
    index: int
    size: int
    hashes: list[str]


#: ``from`` is a Python keyword, hence the functional form.
ConsistencyProof = TypedDict("ConsistencyProof", {"from": int, "to": int, "hashes": list[str]})


class LogInconsistent(RuntimeError):
    """The stored tree does not extend the last signed checkpoint: nothing more is signed."""


def log_name(origin: str) -> str:
    """The checkpoint origin line: the relay's origin without ``https://`` (``localhost:8443``)."""
    return origin.removeprefix("https://").removeprefix("http://").rstrip("/")


def load_or_create_key(path: Path, *, create: bool) -> Ed25519PrivateKey:
    """The Ed25519 log key in ``path`` (PKCS#8 PEM); made once, atomically, when ``create`` and absent.

    Several workers may start at once: the key is written to a private temporary
    file and hard-linked into place, so exactly one key wins and nobody reads a
    half-written file.
    """
    if not path.exists():
        if not create:
            raise FileNotFoundError(f"the log key file {path} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, pem)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: the log key must be an Ed25519 private key (PKCS#8 PEM)")
    return key


@dataclass(frozen=True)
class Signed:
    """A signed checkpoint as kept: the note, its parsed body and when it was signed (Unix seconds)."""

    note: str
    checkpoint: Checkpoint
    time: float

    def encode(self) -> bytes:
        return json.dumps({"note": self.note, "time": self.time}, sort_keys=True).encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _int_param(params: dict[str, str], name: str, default: int | None = None) -> int:
    text = params.get(name)
    if text is None:
        if default is None:
            raise ProtocolError("invalid_request", f"The query parameter {name!r} is required.")
        return default
    if not text.isascii() or not text.isdigit() or len(text) > 16:
        raise ProtocolError("invalid_request", f"The query parameter {name!r} must be a non-negative decimal integer.")
    return int(text)


class TransparencyLog:
    """Checkpoints and proofs over one store's Merkle log, signed with one key."""

    def __init__(self, store: Store, origin: str, key: Ed25519PrivateKey, *,
                 data_dir: Path | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.name = log_name(origin)
        self.key = key
        self.public_key = raw_public_key(key.public_key())
        self.vkey = vkey(self.name, self.public_key)
        self.verifier: Verifier = parse_vkey(self.vkey)
        self.clock = clock
        self.file = data_dir / CHECKPOINT_FILE if data_dir is not None else None
        self._lock = threading.Lock()
        #: set when the stored tree does not extend the last signed checkpoint (the reason)
        self.inconsistent: str | None = None

    def nodes(self, keys: Sequence[tuple[int, int]]) -> list[bytes]:
        return self.store.log_nodes(keys)

    # -- the last signed checkpoint --------------------------------------------------------------------
    def _decode(self, raw: bytes | None) -> Signed | None:
        if raw is None:
            return None
        try:
            value = json.loads(raw)
            checkpoint, _ = open_checkpoint(value["note"], self.verifier, origin=self.name)
            return Signed(value["note"], checkpoint, float(value["time"]))
        except (ValueError, KeyError, TypeError, NoteError) as exc:
            raise LogInconsistent(f"the stored checkpoint does not verify with this relay's log key: {exc}") from None

    def _read_file(self) -> Signed | None:
        if self.file is None:
            return None
        try:
            return self._decode(self.file.read_bytes())
        except FileNotFoundError:
            return None

    def latest(self) -> Signed | None:
        """The last signed checkpoint (the larger of the store's and the data directory's copy)."""
        stored = self._decode(self.store.meta_get(META_KEY))
        local = self._read_file()
        if local is not None and (stored is None or local.checkpoint.size > stored.checkpoint.size):
            return local
        return stored

    def _write_file(self, signed: Signed) -> None:
        if self.file is None:
            return
        current = self._read_file()
        if current is not None and current.checkpoint.size >= signed.checkpoint.size:
            return
        tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_bytes(signed.encode())
        os.replace(tmp, self.file)

    # -- signing ---------------------------------------------------------------------------------------
    def tick(self, *, force: bool = False) -> Signed | None:
        """Sign a checkpoint if the log grew (and the last is >= 1 s old, unless ``force``); the latest one."""
        with self._lock:
            try:
                return self._tick(force)
            except LogInconsistent as exc:
                if self.inconsistent != str(exc):
                    log.error("transparency log: %s; signing no further checkpoint", exc)
                self.inconsistent = str(exc)
                return None

    def _tick(self, force: bool) -> Signed | None:
        for _ in range(10):  # another node may sign between our read and our write
            raw = self.store.meta_get(META_KEY)
            last = self._decode(raw)
            local = self._read_file()
            if local is not None and (last is None or local.checkpoint.size > last.checkpoint.size):
                raise LogInconsistent(
                    f"the store's last checkpoint (size {last.checkpoint.size if last else 0}) is behind the one "
                    f"kept in the data directory (size {local.checkpoint.size}): was the store restored from an older backup?")
            # a store whose log follows its commits (Redis) extends it first
            size = self.store.log_catch_up() if isinstance(self.store, LogFollowing) else self.store.log_size()
            now = self.clock()
            if last is not None:
                if size < last.checkpoint.size:
                    raise LogInconsistent(f"the log has {size} entries, fewer than the last signed checkpoint's "
                                          f"{last.checkpoint.size}")
                if size == last.checkpoint.size or (not force and now - last.time < MIN_INTERVAL):
                    self._check(last, size)
                    self.inconsistent = None
                    self._write_file(last)
                    return last
            root = merkle.root_hash(size, self.nodes)
            if last is not None:
                self._check(last, size, root)
            checkpoint = Checkpoint(self.name, size, root)
            signed = Signed(sign_note(checkpoint.body(), self.name, self.key).encode(), checkpoint, now)
            if self.store.meta_replace(META_KEY, raw, signed.encode()):
                self.inconsistent = None
                self._write_file(signed)
                return signed
        return self._decode(self.store.meta_get(META_KEY))

    def _check(self, last: Signed, size: int, root: bytes | None = None) -> None:
        """Prove the tree of ``size`` consistent with ``last``; :class:`LogInconsistent` if it is not."""
        old = last.checkpoint
        try:
            if root is None:
                if merkle.root_hash(old.size, self.nodes) != old.root:
                    raise LogInconsistent(f"the stored tree's root at size {old.size} differs from the signed checkpoint's")
                return
            proof = merkle.consistency_proof(old.size, size, self.nodes)
        except KeyError as exc:
            raise LogInconsistent(f"the stored tree lacks node {exc} needed to prove consistency") from None
        if not merkle.verify_consistency(old.size, size, old.root, root, proof):
            raise LogInconsistent(f"the tree of size {size} is not consistent with the signed checkpoint of size {old.size}")

    def checkpoint_text(self) -> str:
        """The latest signed checkpoint, signing one first if there is none yet."""
        latest = self.tick(force=self._latest_or_503() is None) if self.inconsistent is None else self._latest_or_503()
        if latest is None:
            raise ProtocolError("service_unavailable", "The relay has not signed a checkpoint yet.")
        return latest.note

    def _latest_or_503(self) -> Signed | None:
        """:meth:`latest` for a reader: a stored checkpoint this key cannot verify is a deliberate 503, not a 500."""
        try:
            return self.latest()
        except LogInconsistent as exc:
            log.error("transparency log: %s", exc)
            raise ProtocolError("service_unavailable", "The relay's stored checkpoint does not verify with its log "
                                "key (was --log-key changed?); an operator must look.") from None

    def _tree_size(self) -> int:
        latest = self._latest_or_503()
        return latest.checkpoint.size if latest is not None else 0

    # -- reads -----------------------------------------------------------------------------------------
    def entries(self, params: dict[str, str]) -> EntriesPage:
        start = _int_param(params, "start", 0)
        limit = _int_param(params, "limit", MAX_PAGE)
        if limit < 1 or limit > MAX_PAGE:
            raise ProtocolError("invalid_request", f"limit must be between 1 and {MAX_PAGE}.")
        size = self.store.log_size()
        if start > size:
            raise ProtocolError("invalid_request", f"start {start} is beyond the log's size {size}.")
        rows = self.store.log_entries(start, min(limit, size - start))
        entries: list[EntryObject] = [
            {"index": e.index, "seq": e.seq, "hash": base64.urlsafe_b64encode(e.hash).rstrip(b"=").decode(),
             "withheld": bool(e.withheld)} for e in rows]
        for entry, e in zip(entries, rows):
            if e.withheld is None:
                entry["retained"] = False
        return {"entries": entries, "size": size}

    def inclusion(self, params: dict[str, str]) -> InclusionProof:
        seq = _int_param(params, "seq")
        latest_size = self._tree_size()
        size = _int_param(params, "size", latest_size)
        self._check_size(size, latest_size)
        index = self.store.log_index(seq)
        if index is None:
            raise ProtocolError("invalid_request", f"The log has no entry for seq {seq}.")
        if index >= size:
            raise ProtocolError("invalid_request", f"seq {seq} is at index {index}, not in a tree of size {size}; "
                                "wait for a checkpoint that covers it.")
        hashes = merkle.inclusion_proof(index, size, self.nodes)
        return {"seq": seq, "index": index, "size": size, "hashes": [_b64(h) for h in hashes]}

    def consistency(self, params: dict[str, str]) -> ConsistencyProof:
        latest_size = self._tree_size()
        first = _int_param(params, "from")
        second = _int_param(params, "to", latest_size)
        self._check_size(second, latest_size)
        if first > second:
            raise ProtocolError("invalid_request", f"from ({first}) must not be larger than to ({second}).")
        hashes = merkle.consistency_proof(first, second, self.nodes)
        return {"from": first, "to": second, "hashes": [_b64(h) for h in hashes]}

    @staticmethod
    def _check_size(size: int, latest: int) -> None:
        if size > latest:
            raise ProtocolError("invalid_request", f"size {size} is beyond the latest checkpoint's size {latest}.")

    def discovery(self, origin: str) -> dict[str, object]:
        return {"log": {"checkpoint": origin.rstrip("/") + CHECKPOINT_PATH, "origin": self.name, "vkey": self.vkey,
                        "witness": {"vkey": self.witness_vkey, "checkpoint": origin.rstrip("/") + WITNESS_PATH}}}

    @property
    def witness_vkey(self) -> str:
        """Our ``cosignature/v1`` verifier key (algorithm byte 0x04) for the peer checkpoints we cosign."""
        kid = key_id(self.name, self.public_key, ALG_COSIGNATURE_V1)
        return f"{self.name}+{kid.hex()}+{base64.b64encode(bytes([ALG_COSIGNATURE_V1]) + self.public_key).decode()}"


class Ticker:
    """Calls :meth:`TransparencyLog.tick` every ``interval`` seconds on a daemon thread."""

    def __init__(self, tlog: TransparencyLog, interval: float = 1.0) -> None:
        self.tlog = tlog
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="akrelay-log-signer", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tlog.tick()
            except StoreUnavailable as exc:  # an outage, not a bug: one line, and again next second
                log.warning("signing a checkpoint: %s", exc)
            except Exception:  # noqa: BLE001 - the signer must outlive a bug in one tick
                log.exception("signing a checkpoint failed")

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
