"""The Tantivy index: schema, opening (with automatic rebuild) and the indexed position.

One document per acceptance record, keyed by ``seq``. The position the index
has caught up to is itself a document, written in the same commit as the
records it covers, so the index and its position can never disagree after a
crash (a sidecar file could). Only the elected indexer opens a writer
(:mod:`akrelay.search.indexer`); every other process opens the same directory
read-only and reloads.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Iterable

from tantivy import Document, FieldType, Index, IndexWriter, Query, Schema, SchemaBuilder, Searcher

from akrelay.protocol.query import index_terms
from akrelay.search.analysis import GRAM_ANALYZER, RANKING_ID, indexed_text, register_analyzers
from akrelay.store.base import Record, term_key

log = logging.getLogger("akrelay.search")

#: Subdirectory of the data directory holding every search artifact.
SEARCH_DIR = "search"
_POSITION_KIND = "position"
_RECORD_KIND = "record"


class IndexUnavailable(Exception):
    """The index cannot be opened (missing, being rebuilt or corrupt)."""


def build_schema() -> Schema:
    sb = SchemaBuilder()
    sb.add_text_field("grams", tokenizer_name=GRAM_ANALYZER, index_option="freq")
    sb.add_text_field("facts", tokenizer_name="raw", index_option="basic")
    sb.add_text_field("kind", tokenizer_name="raw", index_option="basic")
    sb.add_text_field("id", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_integer_field("seq", indexed=True, fast=True)
    sb.add_integer_field("created_at", indexed=True, fast=True)
    sb.add_integer_field("position", fast=True)
    return sb.build()


SCHEMA = build_schema()


def index_dir(data_dir: str | Path) -> Path:
    """Where the index for the current configuration lives; a new config gets a new directory."""
    return Path(data_dir) / SEARCH_DIR / RANKING_ID


def record_document(record: Record) -> Document:
    envelope = record.envelope
    doc = Document()
    doc.add_text("kind", _RECORD_KIND)
    doc.add_text("id", envelope.id)
    doc.add_integer("seq", record.seq)
    doc.add_integer("created_at", envelope.created_at)
    doc.add_text("grams", indexed_text(envelope))
    for term in index_terms(envelope):
        doc.add_text("facts", term_key(term))
    return doc


def _position_document(position: int) -> Document:
    doc = Document()
    doc.add_text("kind", _POSITION_KIND)
    doc.add_integer("seq", -1)
    doc.add_integer("position", position)
    return doc


def read_position(searcher: Searcher) -> int:
    """The log position a searcher's snapshot covers (0 for an empty index)."""
    hits = searcher.search(Query.term_query(SCHEMA, "kind", _POSITION_KIND), 1, count=False).hits
    if not hits:
        return 0
    value = searcher.fast_field_values("position", [hits[0][1]])[0]
    return int(value or 0)


def _open_checked(path: Path) -> Index:
    """Open an existing index and prove it is usable; any defect raises."""
    if not Index.exists(str(path)) or not Index.is_compatible(str(path)):
        raise IndexUnavailable(f"no compatible index at {path}")
    index = Index.open(str(path))
    register_analyzers(index)
    index.reload()
    read_position(index.searcher())
    return index


class SearchIndex:
    """An opened index: a writer (the elected indexer) or a reader."""

    def __init__(self, index: Index, path: Path | None, writable: bool, *, heap_bytes: int = 64_000_000,
                 threads: int = 1) -> None:
        self.index = index
        self.path = path
        self.writer = _writer(index, heap_bytes, threads) if writable else None

    # -- opening ---------------------------------------------------------------
    @classmethod
    def in_memory(cls, **writer_options: int) -> "SearchIndex":
        index = Index(SCHEMA)
        register_analyzers(index)
        return cls(index, None, True, **writer_options)

    @classmethod
    def open_writer(cls, path: Path, **writer_options: int) -> "SearchIndex":
        """Open for writing, rebuilding from scratch if the index is missing or corrupt.

        Only the process holding the indexer lock may call this. A rebuilt index
        starts at position 0, so the follower re-reads the whole log.
        """
        path.mkdir(parents=True, exist_ok=True)
        _remove_stale_configurations(path)
        try:
            index = _open_checked(path)
        except Exception as exc:  # noqa: BLE001 - any defect means "rebuild"
            if path.exists() and any(path.iterdir()):
                log.warning("search index at %s is unusable (%s); rebuilding from the store", path, exc)
        else:
            return cls(index, path, True, **writer_options)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True, exist_ok=True)
        index = Index(SCHEMA, str(path), reuse=False)
        register_analyzers(index)
        search_index = cls(index, path, True, **writer_options)
        search_index.commit(0)  # an empty index that says where it starts
        return search_index

    @classmethod
    def open_reader(cls, path: Path) -> "SearchIndex":
        """Open read-only; :class:`IndexUnavailable` until the indexer has created it."""
        try:
            return cls(_open_checked(path), path, False)
        except IndexUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001
            raise IndexUnavailable(f"search index at {path} cannot be opened: {exc}") from None

    # -- writing -----------------------------------------------------------------
    def add(self, records: Iterable[Record]) -> int:
        assert self.writer is not None, "read-only index"
        count = 0
        for record in records:
            self.writer.add_document(record_document(record))
            count += 1
        return count

    def commit(self, position: int) -> None:
        """Publish added documents together with the position they bring the index to."""
        assert self.writer is not None, "read-only index"
        self.writer.delete_documents_by_term("kind", _POSITION_KIND)
        self.writer.add_document(_position_document(position))
        self.writer.commit()
        self.index.reload()

    def discard_after(self, position: int) -> None:
        """Delete record documents with ``seq > position`` (published by the next commit)."""
        assert self.writer is not None, "read-only index"
        self.writer.delete_documents_by_query(
            Query.range_query(SCHEMA, "seq", FieldType.Integer, position, None, include_lower=False)
        )

    def clear(self) -> None:
        """Drop every document (``akrelay reindex`` on a live index)."""
        assert self.writer is not None, "read-only index"
        self.writer.delete_all_documents()
        self.commit(0)

    # -- reading -----------------------------------------------------------------
    def reload(self) -> None:
        self.index.reload()

    def searcher(self) -> Searcher:
        return self.index.searcher()

    def position(self) -> int:
        return read_position(self.searcher())

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.wait_merging_threads()
            except Exception:  # noqa: BLE001 - closing must not raise
                pass
            self.writer = None


def _writer(index: Index, heap_bytes: int, threads: int, *, attempts: int = 50) -> IndexWriter:
    """Tantivy's own writer lock may briefly outlive a writer dropped in this process; wait for it.

    A busy lock is never mistaken for corruption: the index is not rebuilt.
    """
    for attempt in range(attempts):
        try:
            return index.writer(heap_bytes, threads)
        except ValueError as exc:
            if "LockBusy" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def _remove_stale_configurations(path: Path) -> None:
    """Indexes built for another ranking configuration are never read again."""
    parent = path.parent
    for other in parent.iterdir():
        if other.is_dir() and other.name != path.name and other.name.startswith("akrelay-lexical-"):
            shutil.rmtree(other, ignore_errors=True)
