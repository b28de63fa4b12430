"""Contexts (seed 000 §2.1): named, queryable views of the relay's knowledge.

The built-in context ``knowledge`` covers every visible accepted capsule. An
operator may declare more in a JSON file (``--knowql-contexts``)::

    {"contexts": [{"slug": "ml-papers", "name": "ML papers", "queryable": true,
                   "filter": {"tags": ["ml"], "kinds": ["result"], "actors": ["ed25519:…"],
                              "language": "en", "profile": "sha256:…"}}]}

A filter is a conjunction over the §9.3 query fields; a list means "any of".
It applies to the capsule (its publish event); an assessment belongs to the
contexts of the capsule it assesses. A scope of several contexts is their
union. Each context also has a stable UUID (given, or derived from the origin
and slug), accepted wherever a slug is.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from akrelay.jsontypes import JSON
from akrelay.knowql.errors import KnowqlError, conflict, not_found
from akrelay.protocol.envelope import Envelope

BUILTIN = "knowledge"
KIND = "search"
_SLUG = re.compile(r"[a-z][a-z0-9-]{2,63}")
_FILTER_LISTS = {"tags": "tag", "kinds": "kind", "actors": "actor"}
_FILTER_VALUES = ("language", "profile")


class ContextFileError(ValueError):
    """The operator's contexts file is unusable; the message names the entry."""


@dataclass(frozen=True, eq=False)
class Context:
    slug: str
    id: str
    name: str
    queryable: bool = True
    description: str | None = None
    #: query field -> allowed values (any of); empty: everything.
    filter: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def matches(self, envelope: Envelope) -> bool:
        """Whether a capsule's publish envelope lies in this context."""
        if not self.filter:
            return True
        event = envelope.event
        payload = event["payload"]
        for name, allowed in self.filter.items():
            if name == "tag":
                if not set(payload.get("tags", ())) & set(allowed):
                    return False
            elif name == "kind":
                if payload.get("kind") not in allowed:
                    return False
            elif name == "actor":
                if event["actor"] not in allowed:
                    return False
            elif name == "language":
                if str(payload.get("language", "")).lower() not in {a.lower() for a in allowed}:
                    return False
            elif name == "profile":
                digests = {b["profile"]["digest"] for b in payload.get("profiles", ())}
                if not digests & set(allowed):
                    return False
        return True

    def to_wire(self) -> dict[str, JSON]:
        return {"id": self.id, "slug": self.slug, "name": self.name, "kind": KIND, "queryable": self.queryable,
                "description": self.description,
                "filter": {k + ("s" if k in ("tag", "kind", "actor") else ""): list(v) for k, v in self.filter.items()}}


def context_uuid(origin: str, slug: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{origin.rstrip('/')}/contexts/{slug}"))


class ContextRegistry:
    def __init__(self, contexts: Iterable[Context]) -> None:
        self.contexts = list(contexts)
        self._by_key: dict[str, Context] = {}
        for ctx in self.contexts:
            self._by_key[ctx.slug] = ctx
            self._by_key[ctx.id.lower()] = ctx

    @classmethod
    def load(cls, origin: str, path: str | Path | None = None) -> "ContextRegistry":
        builtin = Context(BUILTIN, context_uuid(origin, BUILTIN), "All accepted knowledge on this relay",
                          description="Every visible accepted capsule and assessment.")
        extra = load_context_file(origin, path) if path else []
        if any(c.slug == BUILTIN for c in extra):
            raise ContextFileError(f"the slug {BUILTIN!r} is built in")
        return cls([builtin, *extra])

    def get(self, key: str) -> Context | None:
        return self._by_key.get(key) or self._by_key.get(key.lower())

    def resolve_scope(self, keys: Iterable[str]) -> list[Context]:
        """Contexts for a new session's scope: 404 for an unknown one, then 409 for one not queryable."""
        found = []
        for key in keys:
            ctx = self.get(key)
            if ctx is None:
                raise not_found("context_not_found", f"no context {key!r} (see GET /contexts)")
            found.append(ctx)
        kinds = {KIND for _ in found}
        if len(kinds) > 1:  # pragma: no cover - one kind today; the rule stays for when a kind is added
            raise KnowqlError(400, "mixed_scope", "a scope may not mix context kinds")
        for ctx in found:
            if not ctx.queryable:
                raise conflict("context_not_queryable", f"context {ctx.slug!r} is not queryable yet")
        return list(dict.fromkeys(found))

    def scope(self, slugs: Iterable[str]) -> list[Context]:
        """A pinned scope's contexts (a context removed from the file since drops out)."""
        return [c for s in slugs if (c := self._by_key.get(s)) is not None]

    def to_wire(self) -> list[dict[str, JSON]]:
        return [c.to_wire() for c in self.contexts]


def load_context_file(origin: str, path: str | Path) -> list[Context]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ContextFileError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ContextFileError(f"{path} is not JSON: {exc}") from None
    entries = doc.get("contexts") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise ContextFileError(f'{path}: expected {{"contexts": [...]}}')
    out: list[Context] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"{path}: contexts[{i}]"
        if not isinstance(entry, dict):
            raise ContextFileError(f"{where} must be an object")
        slug = entry.get("slug")
        if not isinstance(slug, str) or not _SLUG.fullmatch(slug):
            raise ContextFileError(f"{where}: slug must be 3-64 lowercase letters, digits or hyphens, "
                                   "starting with a letter")
        if slug in seen:
            raise ContextFileError(f"{where}: slug {slug!r} is declared twice")
        seen.add(slug)
        name = entry.get("name", slug)
        queryable = entry.get("queryable", True)
        ident = entry.get("uuid") or context_uuid(origin, slug)
        if not isinstance(name, str) or not isinstance(queryable, bool) or not isinstance(ident, str):
            raise ContextFileError(f"{where}: name and uuid must be strings, queryable a boolean")
        try:
            ident = str(uuid.UUID(ident))
        except ValueError:
            raise ContextFileError(f"{where}: uuid is not a UUID") from None
        raw = entry.get("filter", {})
        if not isinstance(raw, dict):
            raise ContextFileError(f"{where}: filter must be an object")
        flt: dict[str, tuple[str, ...]] = {}
        for key, value in raw.items():
            if key in _FILTER_LISTS:
                if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                    raise ContextFileError(f"{where}: filter.{key} must be a non-empty list of strings")
                flt[_FILTER_LISTS[key]] = tuple(value)
            elif key in _FILTER_VALUES:
                if not isinstance(value, str):
                    raise ContextFileError(f"{where}: filter.{key} must be a string")
                flt[key] = (value,)
            else:
                raise ContextFileError(f"{where}: unknown filter field {key!r} "
                                       "(tags, kinds, actors, language, profile)")
        description = entry.get("description")
        out.append(Context(slug, ident, name, queryable, description if isinstance(description, str) else None, flt))
    return out
