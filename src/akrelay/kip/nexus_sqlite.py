"""The persistent nexus backend: one SQLite file per data directory.

Why SQLite (see ``docs/architecture.md``): the store already is one, the nexus is
read by every Granian worker and written by one importer, and SQLite in WAL mode
gives exactly that: any number of readers, each at one consistent snapshot for
the length of a read transaction, beside one writer, with pages shared through
the OS page cache (``mmap``) instead of copied into each worker's heap. Every
lookup the evaluator needs is a B-tree index; keyword postings live in FTS5
(contentless, ``detail=none``), whose segment merges keep import fast.

Layout: one ``elements`` row per element (``ord`` = creation ordinal, ``id``,
``kind``, ``seq``, three lookup columns whose meaning depends on the kind, and
the element as JSON), partial indexes per kind, ``structural`` edges, Concept
``tags`` (``attributes.tags``; Assertions by author are indexed in id order, both
since version 2), one ``tx``
row per import transaction, ``counts`` per kind and Concept type at the head,
and ``meta`` (Space id, head). The importer commits each batch of records in one
SQLite transaction together with the head it reached, so the file always holds
the nexus of some prefix of the log, and a killed importer resumes from there.

The file carries ``PRAGMA application_id`` (it is ours) and ``PRAGMA
user_version`` (its format); a file of another version is refused with a clear
message, never read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator, TypeAlias, cast

import msgspec

from akrelay.kip import budget
from akrelay.kip.elements import KIND_OF, Activity, Assertion, Concept, Element, Evidence, Proposition
from akrelay.kip.errors import KipError
from akrelay.kip.nexus import (
    ELEMENT_KINDS, SEARCH_KINDS, NexusBase, Transaction, concept_tags, nfc, object_key, tokens,
)

log = logging.getLogger("akrelay.kip")

NEXUS_FILE = "kip-nexus.sqlite3"
#: ``PRAGMA application_id``: "AKNX".
APPLICATION_ID = 0x414B4E58
#: ``PRAGMA user_version`` of the layout below; bump it with any change to the layout or encoding.
FORMAT_VERSION = 2
PAGE = 512
#: a posting is counted up to this many entries to choose the one that drives an intersection
PROBE = 4096
#: SQLite page cache per connection (private memory); readers lean on the OS page cache via mmap
READER_CACHE_MB, WRITER_CACHE_MB = 16, 96

_CLASSES = (Concept, Proposition, Assertion, Evidence, Activity)
_KIND_NO = {kind: n for n, kind in enumerate(ELEMENT_KINDS)}
_DECODERS = [msgspec.json.Decoder(cls) for cls in _CLASSES]
_ENCODE = msgspec.json.Encoder().encode
#: The values bound into a lookup's SQL.
_Params: TypeAlias = tuple[str | int, ...]

_SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE elements(ord INTEGER PRIMARY KEY, id TEXT NOT NULL, kind INTEGER NOT NULL, seq INTEGER NOT NULL,
                      a TEXT, b TEXT, c TEXT, body BLOB NOT NULL);
CREATE UNIQUE INDEX el_id ON elements(id);
CREATE INDEX el_kind ON elements(kind);
CREATE UNIQUE INDEX c_key ON elements(a, b) WHERE kind = 0;
CREATE INDEX c_type ON elements(a) WHERE kind = 0;
CREATE INDEX c_name ON elements(a, c) WHERE kind = 0;
CREATE UNIQUE INDEX p_tuple ON elements(a, b, c) WHERE kind = 1;
CREATE INDEX p_subject ON elements(a) WHERE kind = 1;
CREATE INDEX p_predicate ON elements(b) WHERE kind = 1;
CREATE INDEX p_object ON elements(c) WHERE kind = 1;
CREATE INDEX a_proposition ON elements(a) WHERE kind = 2;
CREATE INDEX a_author ON elements(b, id) WHERE kind = 2;
CREATE INDEX a_event ON elements(c) WHERE kind = 2;
CREATE UNIQUE INDEX e_key ON elements(a) WHERE kind = 3;
CREATE TABLE structural(field TEXT NOT NULL, target TEXT NOT NULL, source INTEGER NOT NULL,
                        PRIMARY KEY(field, target, source)) WITHOUT ROWID;
CREATE INDEX structural_field ON structural(field, source);
CREATE TABLE tags(tag TEXT NOT NULL, ord INTEGER NOT NULL, PRIMARY KEY(tag, ord)) WITHOUT ROWID;
CREATE TABLE tx(seq INTEGER PRIMARY KEY, tx_id TEXT NOT NULL, committed_at TEXT NOT NULL, event_id TEXT NOT NULL,
                event_type TEXT NOT NULL, status TEXT NOT NULL, ord_limit INTEGER NOT NULL);
CREATE TABLE counts(name TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
""" + "".join(f"CREATE VIRTUAL TABLE fts_{k} USING fts5(t, content='', tokenize='ascii', detail=none);\n"
              for k in SEARCH_KINDS)


class NexusFileError(RuntimeError):
    """The nexus file cannot be used as it is (foreign, another format version, another Space, corrupt)."""

    def __init__(self, message: str, *, rebuildable: bool) -> None:
        super().__init__(message)
        #: whether the importer may discard the file and rebuild it from the log
        self.rebuildable = rebuildable


def nexus_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / NEXUS_FILE


#: prefix of a hex-encoded term: non-ASCII, so no plain (ASCII) term can start with it
_HEX = "\u00b7"


def _term(term: str) -> str:
    """A keyword term as exactly one FTS5 ``ascii`` token.

    Terms are already case-folded. One of ASCII letters and digits is its own token;
    any other (``_`` splits, and the tokenizer folds ASCII case inside non-ASCII text)
    is written as ``·`` + its UTF-8 hex, which no plain term can equal.
    """
    if term.isascii() and term.isalnum():
        return term
    return _HEX + term.encode("utf-8").hex()


def _unterm(token: str) -> str:
    return bytes.fromhex(token[1:]).decode("utf-8") if token.startswith(_HEX) else token


def _lookup_columns(element: Element) -> tuple[str | None, str | None, str | None]:
    if isinstance(element, Concept):
        return element.type, element.key, nfc(element.name)
    if isinstance(element, Proposition):
        return element.subject, element.predicate, object_key(element.object)
    if isinstance(element, Assertion):
        return element.proposition, element.asserted_by, element.import_id
    if isinstance(element, Evidence):
        return element.client_key, None, None
    return None, None, None


def _connect(path: Path, *, timeout: float) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=timeout)
    return conn


def _inspect(conn: sqlite3.Connection, path: Path, space_id: str | None) -> bool:
    """Validate an open file; ``False`` if it is empty (no schema yet). Raises :class:`NexusFileError`."""
    try:
        app = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        raise NexusFileError(f"the KIP nexus {path} is unreadable ({exc}); it is rebuilt from the log",
                             rebuildable=True) from exc
    if app == 0 and version == 0 and tables == 0:
        return False
    if app != APPLICATION_ID:
        raise NexusFileError(f"{path} is not an akrelay KIP nexus (application_id {app:#x}); move it away or run "
                             "`akrelay reindex --kip`", rebuildable=False)
    if 1 <= version < FORMAT_VERSION:
        # ours, of an older layout (version 2 added the tag index): derived data, so the importer
        # moves it aside and rebuilds it from the log rather than read it with this layout
        raise NexusFileError(f"the KIP nexus {path} has the older format version {version} (this akrelay reads "
                             f"{FORMAT_VERSION}); it is rebuilt from the log", rebuildable=True)
    if version != FORMAT_VERSION:
        raise NexusFileError(f"the KIP nexus {path} has format version {version}, and this akrelay reads version "
                             f"{FORMAT_VERSION} only; run `akrelay reindex --kip` to rebuild it from the log",
                             rebuildable=False)
    row = conn.execute("SELECT value FROM meta WHERE key = 'space_id'").fetchone()
    if space_id is not None and (row is None or row[0] != space_id):
        raise NexusFileError(f"the KIP nexus {path} belongs to Space {row[0] if row else None!r}, not {space_id!r}",
                             rebuildable=True)
    return True


def stored_space(path: str | os.PathLike[str]) -> str | None:
    """The Space a nexus file belongs to, read-only; ``None`` if there is no readable nexus there."""
    if not Path(path).is_file():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return None
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'space_id'").fetchone()
        return row[0] if row else None
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def _minus(items: Iterator[int], removed: Iterator[int]) -> Iterator[int]:
    """``items`` without ``removed``; both ascending (a merge, so neither is held in memory)."""
    current = next(removed, None)
    for item in items:
        while current is not None and current < item:
            current = next(removed, None)
        if item != current:
            yield item


def create_file(path: Path, space_id: str) -> None:
    """Write an empty nexus of the current format at ``path`` (atomically: a temporary file, then rename)."""
    tmp = path.with_name(path.name + f".{os.getpid()}.new")
    for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        leftover.unlink(missing_ok=True)
    conn = _connect(tmp, timeout=5)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript("BEGIN;" + _SCHEMA + "COMMIT;")
        conn.execute("INSERT INTO meta VALUES ('space_id', ?), ('head', 0)", (space_id,))
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {FORMAT_VERSION}")
    finally:
        conn.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.replace(tmp, path)


def discard_file(path: Path, reason: str) -> None:
    """Move an unusable nexus aside (kept for inspection, one generation) before a rebuild."""
    if path.exists():
        log.warning("KIP nexus %s: %s; rebuilding it from the acceptance log", path, reason)
        os.replace(path, path.with_name(path.name + ".discarded"))
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


class SqliteNexus(NexusBase):
    """The nexus in one SQLite file; ``writer=True`` for the one importer, else a reader.

    A reader reopens the file when it was replaced (a rebuild renames a new file into
    place). Inside :meth:`reading` it holds one read transaction, so every lookup of a
    request sees the same head, and keeps the elements it decoded (one object per id
    per request, bounded), which is the only memory that grows with a query.
    """

    CACHE_MAX = 20_000

    def __init__(self, path: str | os.PathLike[str], space_id: str, *, writer: bool = False,
                 cache_mb: int | None = None) -> None:
        self.path = Path(path)
        self.space_id = space_id
        self.writer = writer
        self.withheld = None
        # the importer inserts into every index: a larger cache keeps their hot pages (import rate)
        self._cache_mb = cache_mb if cache_mb is not None else (WRITER_CACHE_MB if writer else READER_CACHE_MB)
        self._conn: sqlite3.Connection | None = None
        self._inode: tuple[int, int] | None = None
        self._lock = threading.RLock()
        self._read_depth = 0
        self._snap_head = 0
        self._cache: dict[str, Element] | None = None
        self._batch_depth = 0
        self._w_head = 0
        self._next_ord = 0
        self._pending_terms: dict[str, list[tuple[int, str]]] = {}
        #: index rows of the batch, inserted by one executemany each at its end (import rate)
        self._pending_edges: list[tuple[str, str, int]] = []
        self._pending_tags: list[tuple[str, int]] = []
        self._count_delta: Counter[str] = Counter()
        if writer:
            self._open_writer()

    # ---- connection -------------------------------------------------------------------

    def _open_writer(self) -> None:
        if not self.path.exists():
            create_file(self.path, self.space_id)
        conn = _connect(self.path, timeout=30)
        try:
            if not _inspect(conn, self.path, None):
                conn.close()
                create_file(self.path, self.space_id)
                conn = _connect(self.path, timeout=30)
                _inspect(conn, self.path, None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")   # derived data: a power cut loses a suffix, never consistency
            conn.execute(f"PRAGMA cache_size=-{self._cache_mb * 1024}")
            conn.execute("PRAGMA wal_autocheckpoint=8192")  # fewer, larger checkpoints (32 MB of WAL)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._inode = self._stat()
        stored = conn.execute("SELECT value FROM meta WHERE key = 'space_id'").fetchone()
        if stored is None or stored[0] != self.space_id:
            self.reset(f"it belongs to Space {stored[0] if stored else None!r}, not {self.space_id!r}")
        self._load_writer_state()

    def reset(self, reason: str) -> None:
        """Empty the nexus in place, in one transaction (readers see the old state or the empty one,
        never a mix; the file is not replaced under their open connections); import starts again."""
        log.warning("KIP nexus %s: %s; rebuilding it from the acceptance log", self.path, reason)
        conn = self._conn
        assert conn is not None and not self._batch_depth
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table in ("elements", "structural", "tags", "tx", "counts"):
                conn.execute(f"DELETE FROM {table}")
            for kind in SEARCH_KINDS:
                conn.execute(f"INSERT INTO fts_{kind}(fts_{kind}) VALUES ('delete-all')")
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('space_id', ?), ('head', 0)", (self.space_id,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self._load_writer_state()

    def _load_writer_state(self) -> None:
        conn = self._conn
        assert conn is not None
        self._w_head = int(conn.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()[0])
        self._next_ord = int(conn.execute("SELECT coalesce(max(ord) + 1, 0) FROM elements").fetchone()[0])
        self._pending_terms = {}
        self._pending_edges, self._pending_tags = [], []
        self._count_delta = Counter()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def _reader(self) -> sqlite3.Connection:
        """The read connection, (re)opened when the file is new or was replaced."""
        if self.writer or (self._read_depth and self._conn is not None):
            assert self._conn is not None
            return self._conn  # inside a read transaction the snapshot is fixed: no file check
        current = self._stat()
        if self._conn is not None and current == self._inode:
            return self._conn
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if current is None:
            raise KipError("InternalError", f"the KIP nexus {self.path} does not exist yet: the importer has not "
                           "started", hint="retry shortly")
        conn = _connect(self.path, timeout=5)
        try:
            if not _inspect(conn, self.path, self.space_id):
                raise KipError("InternalError", f"the KIP nexus {self.path} is being created", hint="retry shortly")
            conn.execute("PRAGMA query_only=ON")
            conn.execute(f"PRAGMA cache_size=-{self._cache_mb * 1024}")
            conn.execute("PRAGMA mmap_size=17179869184")  # pages are shared page cache, not worker heap
        except NexusFileError as exc:
            conn.close()
            raise KipError("InternalError", str(exc)) from exc
        except BaseException:
            conn.close()
            raise
        self._conn, self._inode = conn, current
        return conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                if self._conn.in_transaction:
                    self._conn.rollback()
                self._conn.close()
                self._conn = None

    # ---- scopes -------------------------------------------------------------------------

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        with self._lock:
            if self._read_depth or self._batch_depth:
                self._read_depth += 1
                try:
                    yield
                finally:
                    self._read_depth -= 1
                return
            conn = self._reader()
            conn.execute("BEGIN")
            try:
                self._snap_head = int(conn.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()[0])
                self._cache = {}
                self._read_depth = 1
                yield
            finally:
                self._read_depth = 0
                self._cache = None
                conn.execute("COMMIT")

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        if not self.writer:
            raise RuntimeError("this nexus is opened for reading")
        with self._lock:
            if self._batch_depth:
                self._batch_depth += 1
                try:
                    yield
                finally:
                    self._batch_depth -= 1
                return
            conn = self._conn
            assert conn is not None
            conn.execute("BEGIN IMMEDIATE")
            self._batch_depth = 1
            try:
                yield
                self._flush()
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                self._load_writer_state()
                raise
            finally:
                self._batch_depth = 0

    def _flush(self) -> None:
        conn = self._conn
        assert conn is not None
        conn.executemany("INSERT INTO structural VALUES (?, ?, ?)", self._pending_edges)
        conn.executemany("INSERT INTO tags VALUES (?, ?)", self._pending_tags)
        self._pending_edges, self._pending_tags = [], []
        for kind, rows in self._pending_terms.items():
            conn.executemany(f"INSERT INTO fts_{kind}(rowid, t) VALUES (?, ?)", rows)
        self._pending_terms = {}
        if self._count_delta:
            conn.executemany("INSERT INTO counts VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET n = n + excluded.n",
                             list(self._count_delta.items()))
            self._count_delta = Counter()
        conn.execute("UPDATE meta SET value = ? WHERE key = 'head'", (self._w_head,))

    # ---- decoding -----------------------------------------------------------------------

    def _seq(self, seq: int | None) -> int:
        return self.head if seq is None else seq

    def _decode(self, eid: str, kind: int, body: bytes) -> Element:
        cache = self._cache
        if cache is not None:
            found = cache.get(eid)
            if found is not None:
                return found
        element = cast(Element, _DECODERS[kind].decode(body))
        if cache is not None and len(cache) < self.CACHE_MAX:
            cache[eid] = element
        return element

    def _one(self, sql: str, params: _Params, seq: int | None) -> Element | None:
        with self._lock:
            row = self._reader().execute(sql, params).fetchone()
            if row is None or row[2] > self._seq(seq):
                return None
            return self._decode(row[0], row[1], row[3])

    # _all and _paged: each caller's ``where`` selects one kind (Concepts, Propositions, ...), the type
    # it returns; Element would need a cast per lookup, and a checked narrowing a test per element
    def _all(self, where: str, params: _Params, seq: int | None,
             index: str = "") -> list[Any]:  # Any: the kind the caller's where selects
        with self._lock:
            rows = self._reader().execute(
                f"SELECT id, kind, body FROM elements {index} WHERE {where} AND seq <= ? ORDER BY ord",
                (*params, self._seq(seq))).fetchall()
            return [self._decode(r[0], r[1], r[2]) for r in rows]

    def _paged(self, where: str, params: _Params, seq: int | None, index: str = "", *,
               order: str = "ord") -> Iterator[Any]:  # Any: the kind the caller's where selects
        """A long lookup in ``order`` (``ord``: creation order; ``id``: element id), one bounded
        page (one complete statement) at a time. Pages by id start at 16 rows and grow: their
        consumer (a KQL page, see ``kql.evaluate``) usually stops in the first."""
        limit = self._seq(seq)
        after: int | str = -1 if order == "ord" else ""
        size = PAGE if order == "ord" else 16
        while True:
            with self._lock:
                rows = self._reader().execute(
                    f"SELECT {order}, id, kind, body FROM elements {index} WHERE {where} AND seq <= ? "
                    f"AND {order} > ? ORDER BY {order} LIMIT {size}", (*params, limit, after)).fetchall()
                page = [self._decode(r[1], r[2], r[3]) for r in rows]
            yield from page
            if len(rows) < size:
                return
            after, size = rows[-1][0], min(PAGE, size * 4)

    # ---- reads --------------------------------------------------------------------------

    @property
    def head(self) -> int:
        if self.writer and not self._read_depth:
            return self._w_head
        if self._read_depth:
            return self._snap_head
        with self._lock:
            return int(self._reader().execute("SELECT value FROM meta WHERE key = 'head'").fetchone()[0])

    def get(self, element_id: str, seq: int | None = None) -> Element | None:
        cache = self._cache
        if cache is not None:
            found = cache.get(element_id)
            if found is not None:
                return found if found.created_seq <= self._seq(seq) else None
        return self._one("SELECT id, kind, seq, body FROM elements WHERE id = ?", (element_id,), seq)

    def concept(self, type_name: str, key: str, seq: int | None = None) -> Concept | None:
        return cast("Concept | None", self._one("SELECT id, kind, seq, body FROM elements WHERE kind = 0 AND a = ? AND b = ?",
                                                (type_name, key), seq))

    def concepts_named(self, type_name: str, name: str, seq: int | None = None) -> list[Concept]:
        return self._all("kind = 0 AND a = ? AND c = ?", (type_name, nfc(name)), seq, "INDEXED BY c_name")

    def proposition(self, subject: str, predicate: str, obj: object, seq: int | None = None) -> Proposition | None:
        return cast("Proposition | None", self._one(
            "SELECT id, kind, seq, body FROM elements WHERE kind = 1 AND a = ? AND b = ? AND c = ?",
            (subject, predicate, object_key(obj)), seq))

    def propositions_about(self, concept_id: str, seq: int | None = None) -> list[Proposition]:
        return self._all("kind = 1 AND a = ?", (concept_id,), seq, "INDEXED BY p_subject")

    def propositions_to(self, object_id: str, seq: int | None = None) -> list[Proposition]:
        return self._all("kind = 1 AND c = ?", ("r:" + object_id,), seq, "INDEXED BY p_object")

    def propositions_with(self, predicate: str, seq: int | None = None) -> Iterator[Proposition]:
        return self._paged("kind = 1 AND b = ?", (predicate,), seq, "INDEXED BY p_predicate")

    def assertions_on(self, proposition_id: str, seq: int | None = None) -> list[Assertion]:
        return self._all("kind = 2 AND a = ?", (proposition_id,), seq, "INDEXED BY a_proposition")

    def assertions_by(self, agent_id: str, seq: int | None = None) -> Iterator[Assertion]:
        return self._paged("kind = 2 AND b = ?", (agent_id,), seq, "INDEXED BY a_author", order="id")

    def assertions_from_event(self, event_id: str) -> list[Assertion]:
        return self._all("kind = 2 AND c = ?", (event_id,), None, "INDEXED BY a_event")

    def evidence_by_key(self, client_key: str, seq: int | None = None) -> Evidence | None:
        return cast("Evidence | None",
                    self._one("SELECT id, kind, seq, body FROM elements WHERE kind = 3 AND a = ?", (client_key,), seq))

    def concepts_of_type(self, type_name: str, seq: int | None = None) -> Iterator[Concept]:
        return self._paged("kind = 0 AND a = ?", (type_name,), seq, "INDEXED BY c_type")

    def of_kind(self, kind: str, seq: int | None = None) -> Iterator[Element]:
        return self._paged("kind = ?", (_KIND_NO[kind],), seq, "INDEXED BY el_kind")

    def structural_sources(self, field: str, target: str | None, seq: int | None = None) -> Iterator[Concept]:
        if target is None:
            return self._paged("ord IN (SELECT source FROM structural WHERE field = ?)", (field,), seq)
        return iter(self._all("ord IN (SELECT source FROM structural WHERE field = ? AND target = ?)",
                              (field, target), seq))

    def concepts_tagged(self, tags: Iterable[str], seq: int | None = None, *,
                        structural: tuple[str, str] | None = None) -> Iterator[Concept]:
        """One statement over the index tables only: the smallest posting (counted up to
        ``PROBE``) drives, every other constraint is a primary-key probe per candidate, and only
        the intersection's rows are read and decoded."""
        postings: list[tuple[str, str, str, tuple[str, ...]]] = [
            ("tags", "ord", "tag = ?", (t,)) for t in dict.fromkeys(nfc(t) for t in tags)]
        if structural is not None:
            postings.append(("structural", "source", "field = ? AND target = ?", tuple(structural)))
        if not postings:
            raise ValueError("concepts_tagged needs a tag or an edge")
        with self._lock:
            conn = self._reader()
            sizes = [conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {where} LIMIT {PROBE})",
                                  params).fetchone()[0] for table, _, where, params in postings]
        if min(sizes) == 0:
            return iter(())
        driver, *others = (postings[i] for i in sorted(range(len(postings)), key=sizes.__getitem__))
        table, column, where, params = driver
        probes = "".join(f" AND EXISTS (SELECT 1 FROM {t} WHERE {w} AND {c} = d.{column})" for t, c, w, _ in others)
        # NOT INDEXED: rows are fetched by rowid from the intersection, never by walking el_kind
        return self._paged(f"ord IN (SELECT d.{column} FROM {table} d WHERE {where}{probes})",
                           (*params, *(p for *_, ps in others for p in ps)), seq, "NOT INDEXED")

    def _tx(self, row: tuple[int, str, str, str, str, str] | None) -> Transaction | None:
        return Transaction(*row) if row is not None else None

    def transaction_at(self, seq: int) -> Transaction | None:
        with self._lock:
            return self._tx(self._reader().execute(
                "SELECT seq, tx_id, committed_at, event_id, event_type, status FROM tx WHERE seq <= ? "
                "ORDER BY seq DESC LIMIT 1", (seq,)).fetchone())

    def transactions(self) -> list[Transaction]:
        with self._lock:
            return [Transaction(*r) for r in self._reader().execute(
                "SELECT seq, tx_id, committed_at, event_id, event_type, status FROM tx ORDER BY seq")]

    def seq_at_time(self, stamp: str, head: int) -> int:
        with self._lock:
            row = self._reader().execute("SELECT max(seq) FROM tx WHERE seq <= ? AND committed_at <= ?",
                                         (head, stamp)).fetchone()
        return int(row[0] or 0)

    def _ordinal_limit(self, seq: int) -> int:
        with self._lock:
            row = self._reader().execute("SELECT ord_limit FROM tx WHERE seq <= ? ORDER BY seq DESC LIMIT 1",
                                         (seq,)).fetchone()
        return int(row[0]) if row else 0

    def counts(self, seq: int | None = None) -> dict[str, int]:
        with self._lock:
            conn = self._reader()
            if seq is None or seq == self.head:
                found = dict(conn.execute("SELECT name, n FROM counts WHERE name LIKE 'kind:%'").fetchall())
                return {k: int(found.get("kind:" + k, 0)) for k in ELEMENT_KINDS}
            rows = dict(conn.execute("SELECT kind, count(*) FROM elements WHERE seq <= ? GROUP BY kind",
                                     (seq,)).fetchall())
        return {k: int(rows.get(n, 0)) for n, k in enumerate(ELEMENT_KINDS)}

    def type_count(self, type_name: str, seq: int | None = None) -> int:
        with self._lock:
            conn = self._reader()
            if seq is None or seq == self.head:
                row = conn.execute("SELECT n FROM counts WHERE name = ?", ("type:" + type_name,)).fetchone()
                return int(row[0]) if row else 0
            return int(conn.execute("SELECT count(*) FROM elements INDEXED BY c_type WHERE kind = 0 AND a = ? "
                                    "AND seq <= ?", (type_name, seq)).fetchone()[0])

    def term_matches(self, kind: str, terms: Iterable[str], seq: int) -> Counter[int]:
        if kind not in SEARCH_KINDS:
            raise KeyError(kind)
        cutoff = self._ordinal_limit(seq)
        counter: Counter[int] = Counter()
        with self._lock:
            conn = self._reader()
            tick = budget.current().tick
            for term in terms:
                tick()
                rows = conn.execute(f"SELECT rowid FROM fts_{kind} WHERE fts_{kind} MATCH ? AND rowid < ?",
                                    (f'"{_term(term)}"', cutoff)).fetchall()
                counter.update(r[0] for r in rows)
        return counter

    def term_buckets(self, kind: str, terms: Iterable[str], seq: int) -> Iterator[tuple[int, Iterable[int]]]:
        """The all-terms bucket streams from one FTS5 ``AND`` and, for two terms, the other
        bucket from an ``OR`` minus that ``AND``, both in rowid order, a page at a time: a page
        of hits never reads every posting of a common word."""
        if kind not in SEARCH_KINDS:
            raise KeyError(kind)
        ordered = sorted(terms)
        phrases = [f'"{_term(t)}"' for t in ordered]
        cutoff = self._ordinal_limit(seq)
        every = " AND ".join(phrases)
        yield len(ordered), self._fts_stream(kind, every, cutoff)
        if len(ordered) == 2:
            yield 1, _minus(self._fts_stream(kind, " OR ".join(phrases), cutoff), self._fts_stream(kind, every, cutoff))
        elif len(ordered) > 2:
            rest: dict[int, list[int]] = {}
            for ordinal, matched in self.term_matches(kind, ordered, seq).items():
                if matched < len(ordered):
                    rest.setdefault(matched, []).append(ordinal)
            for matched in sorted(rest, reverse=True):
                yield matched, sorted(rest[matched])

    def _fts_stream(self, kind: str, match: str, cutoff: int) -> Iterator[int]:
        """Rowids matching ``match`` below ``cutoff``, ascending, one complete statement per page."""
        after = -1
        while True:
            with self._lock:
                rows = self._reader().execute(
                    f"SELECT rowid FROM fts_{kind} WHERE fts_{kind} MATCH ? AND rowid > ? AND rowid < ? "
                    f"ORDER BY rowid LIMIT {PAGE}", (match, after, cutoff)).fetchall()
            yield from (r[0] for r in rows)
            if len(rows) < PAGE:
                return
            after = rows[-1][0]

    def at_ordinal(self, ordinal: int) -> Element:
        with self._lock:
            row = self._reader().execute("SELECT id, kind, body FROM elements WHERE ord = ?", (ordinal,)).fetchone()
            return self._decode(row[0], row[1], row[2])

    def all_elements(self) -> Iterator[Element]:
        return self._paged("1", (), None)

    def postings(self, kind: str) -> dict[str, list[int]]:
        with self._lock:
            # fts5vocab needs a (temporary) table, which a query-only reader may not create
            conn = self._reader() if self.writer else _connect(self.path, timeout=5)
            try:
                return self._postings(conn, kind)
            finally:
                if conn is not self._conn:
                    conn.close()

    @staticmethod
    def _postings(conn: sqlite3.Connection, kind: str) -> dict[str, list[int]]:
        conn.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.vocab_{kind} USING fts5vocab(main, fts_{kind}, "
                     "'instance')")
        out: dict[str, list[int]] = {}
        for term, doc in conn.execute(f"SELECT term, doc FROM temp.vocab_{kind} ORDER BY term, doc"):
            out.setdefault(_unterm(term), []).append(doc)
        return out

    # ---- writes (the one importer) ------------------------------------------------------

    def add(self, element: Element, text: str | None = None) -> Element:
        if not self._batch_depth:
            raise RuntimeError("SqliteNexus.add outside a batch")
        conn = self._conn
        assert conn is not None
        ordinal = self._next_ord
        kind = KIND_OF[type(element)]
        a, b, c = _lookup_columns(element)
        try:
            conn.execute("INSERT INTO elements VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (ordinal, element.id, _KIND_NO[kind], element.created_seq, a, b, c, _ENCODE(element)))
        except sqlite3.IntegrityError as exc:
            raise RuntimeError(f"element id {element.id} reused") from exc
        self._next_ord = ordinal + 1
        self._count_delta["kind:" + kind] += 1
        if isinstance(element, Concept):
            self._count_delta["type:" + element.type] += 1
            self._pending_edges.extend((f, t, ordinal) for f, t in element.structural.items())
            self._pending_tags.extend((t, ordinal) for t in concept_tags(element))
        if text and kind in SEARCH_KINDS:
            terms = tokens(text)
            if terms:
                self._pending_terms.setdefault(kind, []).append((ordinal, " ".join(_term(t) for t in terms)))
        return element

    def add_transition(self, assertion: Assertion, seq: int, status: str, at: str) -> None:
        if not self._batch_depth:
            raise RuntimeError("SqliteNexus.add_transition outside a batch")
        assert self._conn is not None
        assertion.transitions.append((seq, status, at))
        self._conn.execute("UPDATE elements SET body = ? WHERE id = ?", (_ENCODE(assertion), assertion.id))

    def commit(self, tx: Transaction) -> None:
        if not self._batch_depth:
            raise RuntimeError("SqliteNexus.commit outside a batch")
        assert self._conn is not None
        self._conn.execute("INSERT INTO tx VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (tx.seq, tx.tx_id, tx.committed_at, tx.event_id, tx.event_type, tx.status, self._next_ord))
        self._w_head = tx.seq


def open_writer(path: str | os.PathLike[str], space_id: str, *, checkpoint: int | None = None) -> SqliteNexus:
    """The importer's nexus at ``path``: created when missing, rebuilt (empty) when unusable.

    A file of another format version or not ours is refused (:class:`NexusFileError`),
    never overwritten silently. One of another Space, or ahead of the store
    (``checkpoint``: the log was replaced) is emptied in place and re-imported; an
    unreadable (corrupt) one is moved aside and created afresh.
    """
    path = Path(path)
    try:
        nexus = SqliteNexus(path, space_id, writer=True)
    except NexusFileError as exc:
        if not exc.rebuildable:
            raise
        discard_file(path, str(exc))
        return SqliteNexus(path, space_id, writer=True)
    except sqlite3.DatabaseError as exc:
        discard_file(path, f"unreadable ({exc})")
        return SqliteNexus(path, space_id, writer=True)
    if checkpoint is not None and nexus.head > checkpoint:
        nexus.reset(f"its head {nexus.head} is ahead of the acceptance log ({checkpoint})")
    return nexus
