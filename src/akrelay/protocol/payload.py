"""Knowledge payload rules (Agent Knowledge §4–§7, §8.1 step 3).

Two layers, kept apart so that schema validity is never mistaken for
acceptance:

* :func:`check_payload_structure` is the JSON Schema level of
  ``schemas/agent-knowledge-1.0.schema.json`` for the three payload
  definitions (closed objects, required members, types, enumerations,
  patterns, array uniqueness and the ``if/then`` kind and verdict rules),
  hand-written because it runs on every submission; ``verify_envelope`` calls
  it before hashing.
* :func:`check_payload_rules` adds the semantic checks the schema cannot
  express: parsed HTTPS URLs, canonical 32-byte digests, and profile-digest
  uniqueness.

Both raise :class:`ProtocolError` with ``invalid_event``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING, NoReturn, Sequence, cast
from urllib.parse import urlsplit

from akrelay.protocol.errors import ProtocolError
from akrelay.protocol.options import DEFAULT_OPTIONS, ValidationOptions

if TYPE_CHECKING:
    from akrelay.protocol.documents import EvidenceReference, HasEvent, Relation

PUBLISH = "knowledge.publish"
ASSESS = "knowledge.assess"
RETRACT = "knowledge.retract"
EVENT_TYPES = frozenset((PUBLISH, ASSESS, RETRACT))
KINDS = frozenset((
    "question", "hypothesis", "definition", "observation", "inference",
    "procedure", "resource", "negative_result", "synthesis", "collection",
))
#: The relation names in specification order (the KIP mapping gives each a predicate in this order).
RELATION_NAMES = ("derived_from", "addresses", "tests", "extends", "supports", "contradicts", "supersedes", "contains")
RELATIONS = frozenset(RELATION_NAMES)
VERDICTS = frozenset(("supports", "challenges", "reproduced", "not_reproduced", "applied", "inconclusive"))
#: Verdicts that report an actual run, so they must say what was observed (§6.2).
OBSERVED_VERDICTS = frozenset(("reproduced", "not_reproduced", "applied"))
EVIDENCE_ROLES = frozenset(("source", "input", "output", "environment", "validation"))

_PUBLISH_KEYS = frozenset((
    "license", "kind", "title", "statement", "language", "context", "basis",
    "evidence", "reproduction", "relations", "tags", "profiles", "extra",
))
_PUBLISH_REQUIRED = ("license", "kind", "title", "statement", "language", "context", "basis")
_ASSESS_KEYS = frozenset((
    "license", "target", "verdict", "summary", "context", "basis", "evidence", "reproduction", "profiles", "extra",
))
_ASSESS_REQUIRED = ("license", "target", "verdict", "summary", "context", "basis")
_RETRACT_KEYS = frozenset(("license", "target", "reason", "extra"))
_CONTEXT_KEYS = frozenset(("scope", "conditions", "limitations"))
_REPRODUCTION_KEYS = frozenset(("environment", "steps", "expected", "observed"))
_EVIDENCE_KEYS = frozenset(("url", "description", "digest", "media_type", "role"))
_RELATION_KEYS = frozenset(("relation", "target"))
_BINDING_KEYS = frozenset(("profile", "data"))
_REFERENCE_KEYS = frozenset(("url", "digest"))

# Python's fullmatch gives the schema's `^...$(?![\s\S])` anchoring (no trailing newline).
_HASH_RE = re.compile(r"[A-Za-z0-9_-]{43}")
_AGENT_RE = re.compile(r"did:agent:[A-Za-z0-9_-]{43}")
_LANGUAGE_RE = re.compile(r"[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*")
_TAG_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_HTTPS_RE = re.compile(r"https://[^/?#@]+(?:[/?#].*)?")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
#: 43 base64url characters carry 258 bits; the last character's low 2 bits must
#: be zero for the text to be the canonical encoding of 32 bytes.
_CANONICAL_LAST = frozenset("AEIMQUYcgkosw048")
# WHATWG forbidden host code points (plus '%', forbidden in domains) and controls.
_BAD_URL_CHAR_RE = re.compile(r"[\x00-\x20\x7f\\]")
_BAD_HOST_RE = re.compile(r"[\x00-\x20\x7f#%/:<>?@\[\\\]^|]")


def _fail(message: str) -> NoReturn:
    raise ProtocolError("invalid_event", message)


# -- shared value checks ----------------------------------------------------

def is_hash_shape(value: object) -> bool:
    """The schema's ``eventHash`` pattern: 43 base64url characters."""
    return type(value) is str and _HASH_RE.fullmatch(value) is not None


def is_canonical_id(value: object) -> bool:
    """Canonical unpadded base64url of exactly 32 bytes (event IDs and digests)."""
    return type(value) is str and len(value) == 43 and value[-1] in _CANONICAL_LAST and _HASH_RE.fullmatch(value) is not None


def is_canonical_agent_id(value: object) -> bool:
    """``did:agent:`` followed by a canonical 32-byte key encoding."""
    return type(value) is str and len(value) == 53 and value[-1] in _CANONICAL_LAST and _AGENT_RE.fullmatch(value) is not None


def is_language(value: object) -> bool:
    return type(value) is str and _LANGUAGE_RE.fullmatch(value) is not None


def is_tag(value: object) -> bool:
    return type(value) is str and _TAG_RE.fullmatch(value) is not None


def is_nonempty_text(value: object) -> bool:
    """A string with at least one Unicode scalar value (§2)."""
    if type(value) is not str or not value:
        return False
    return value.isascii() or _SURROGATE_RE.sub("", value) != ""


def https_url_problem(value: object) -> str | None:
    """Why ``value`` is not an absolute HTTPS URL with a host and no userinfo, or ``None``."""
    if type(value) is not str:
        return "URL must be a string"
    # Licence and profile URLs repeat across submissions, so short ones are
    # memoized; long ones are not, to keep the cache's memory small and bounded.
    return _cached_url_problem(value) if len(value) <= _CACHED_URL_CHARS else _url_problem(value)


_CACHED_URL_CHARS = 512


def _url_problem(value: str) -> str | None:
    """Parsed with a real URL parser (``urllib.parse``) after the schema's coarse
    pattern; the port must be a valid number and the host free of the code
    points a WHATWG parser forbids.
    """
    if _HTTPS_RE.fullmatch(value) is None:
        return "URL must be an absolute https:// URL"
    if _BAD_URL_CHAR_RE.search(value) is not None:
        return "URL contains whitespace, control characters or a backslash"
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError as exc:
        return f"URL does not parse: {exc}"
    if parts.scheme != "https":
        return "URL scheme must be https"
    netloc = parts.netloc
    if "@" in netloc or parts.username is not None or parts.password is not None:
        return "URL must not contain userinfo"
    host = parts.hostname
    if not host:
        return "URL must have a host"
    if netloc.startswith("["):
        if not re.fullmatch(r"[0-9A-Fa-f:.]+", host):
            return "URL has a malformed IPv6 literal"
    elif _BAD_HOST_RE.search(host):
        return "URL host contains a forbidden character"
    hostport = netloc.rsplit("]", 1)[-1]
    if ":" in hostport:
        digits = hostport.rsplit(":", 1)[-1]
        if digits and not (digits.isascii() and digits.isdigit()):
            return "URL port is malformed"
    if port is not None and not 0 <= port <= 65535:
        return "URL port is out of range"
    return None


_cached_url_problem = lru_cache(maxsize=4096)(_url_problem)


def _json_key(value: object) -> tuple[object, ...]:
    """A hashable key under which two values are equal exactly when they are equal JSON values."""
    if isinstance(value, dict):
        return ("o", frozenset((k, _json_key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("a", tuple(_json_key(v) for v in value))
    if value is True or value is False:
        return ("b", value)
    if value is None:
        return ("n",)
    if isinstance(value, (int, float)):
        return ("d", value)  # 1 and 1.0 are the same JSON number
    return ("s", value)


def _unique_strings(items: Sequence[object], where: str) -> None:
    if len(set(items)) != len(items):
        _fail(f"{where} must contain unique items")


# -- structure ---------------------------------------------------------------

def _text(obj: dict[str, object], key: str, where: str) -> None:
    if not is_nonempty_text(obj[key]):
        _fail(f"{where}.{key} must be a non-empty string")


def _closed(obj: object, allowed: frozenset[str], required: tuple[str, ...], where: str) -> dict[str, object]:
    if type(obj) is not dict:
        _fail(f"{where} must be an object")
    if not allowed.issuperset(obj):
        unknown = sorted(k for k in obj if k not in allowed)
        _fail(f"{where} has unknown member {unknown[0]!r}")
    if not obj.keys() >= _required_set(required):
        missing = [k for k in required if k not in obj]
        _fail(f"{where} is missing required member {missing[0]!r}")
    return obj


@lru_cache(maxsize=None)
def _required_set(required: tuple[str, ...]) -> frozenset[str]:
    return frozenset(required)


def _text_list(value: object, where: str, *, unique: bool = True, min_items: int = 0) -> list[str]:
    if type(value) is not list:
        _fail(f"{where} must be an array")
    if len(value) < min_items:
        _fail(f"{where} must contain at least {min_items} item(s)")
    for item in value:
        if not is_nonempty_text(item):
            _fail(f"{where} items must be non-empty strings")
    if unique:
        _unique_strings(value, where)
    return cast("list[str]", value)


def _context(value: object, where: str) -> None:
    ctx = _closed(value, _CONTEXT_KEYS, ("scope", "conditions", "limitations"), where)
    _text(ctx, "scope", where)
    _text_list(ctx["conditions"], where + ".conditions")
    _text_list(ctx["limitations"], where + ".limitations")


def _reproduction(value: object, where: str) -> dict[str, object]:
    rep = _closed(value, _REPRODUCTION_KEYS, ("environment", "steps", "expected"), where)
    _text(rep, "environment", where)
    _text_list(rep["steps"], where + ".steps", unique=False, min_items=1)  # ordered steps may repeat
    _text(rep, "expected", where)
    if "observed" in rep:
        _text(rep, "observed", where)
    return rep


def _evidence(value: object, where: str) -> list[EvidenceReference]:
    if type(value) is not list:
        _fail(f"{where} must be an array")
    seen = set()
    for i, item in enumerate(value):
        w = f"{where}[{i}]"
        ev = _closed(item, _EVIDENCE_KEYS, ("url", "description"), w)
        if type(ev["url"]) is not str or _HTTPS_RE.fullmatch(ev["url"]) is None:
            _fail(f"{w}.url must be an absolute https:// URL")
        _text(ev, "description", w)
        if "digest" in ev and not is_hash_shape(ev["digest"]):
            _fail(f"{w}.digest must be a 43-character base64url hash")
        if "media_type" in ev:
            _text(ev, "media_type", w)
        if "role" in ev:
            if type(ev["role"]) is not str or ev["role"] not in EVIDENCE_ROLES:
                _fail(f"{w}.role is not a known evidence role")
            if ev["role"] == "output" and "digest" not in ev:
                _fail(f"{w}: an output reference must carry a digest")
        key = frozenset(ev.items())  # all members are strings once shaped
        if key in seen:
            _fail(f"{where} must contain unique items")
        seen.add(key)
    return cast("list[EvidenceReference]", value)


def _relations(value: object, where: str) -> list[Relation]:
    if type(value) is not list:
        _fail(f"{where} must be an array")
    seen = set()
    for i, item in enumerate(value):
        w = f"{where}[{i}]"
        rel = _closed(item, _RELATION_KEYS, ("relation", "target"), w)
        if type(rel["relation"]) is not str or rel["relation"] not in RELATIONS:
            _fail(f"{w}.relation is not a known relationship")
        if not is_hash_shape(rel["target"]):
            _fail(f"{w}.target must be a 43-character base64url event ID")
        key = (rel["relation"], rel["target"])
        if key in seen:  # closed two-member objects: value uniqueness is (relation, target) uniqueness
            _fail(f"{where} must be unique by (relation, target)")
        seen.add(key)
    return cast("list[Relation]", value)


def _profiles(value: object, where: str) -> None:
    if type(value) is not list:
        _fail(f"{where} must be an array")
    digests = set()
    repeated = False
    for i, item in enumerate(value):
        w = f"{where}[{i}]"
        binding = _closed(item, _BINDING_KEYS, ("profile", "data"), w)
        ref = _closed(binding["profile"], _REFERENCE_KEYS, ("url", "digest"), w + ".profile")
        if type(ref["url"]) is not str or _HTTPS_RE.fullmatch(ref["url"]) is None:
            _fail(f"{w}.profile.url must be an absolute https:// URL")
        if not is_hash_shape(ref["digest"]):
            _fail(f"{w}.profile.digest must be a 43-character base64url hash")
        if type(binding["data"]) is not dict:
            _fail(f"{w}.data must be an object")
        if ref["digest"] in digests:
            repeated = True
        digests.add(ref["digest"])
    # Identical bindings share a digest, so value uniqueness needs the costly
    # comparison only when a digest repeats (itself a semantic error later).
    if repeated:
        try:
            keys = [_json_key(b) for b in value]
        except RecursionError:
            _fail(f"{where} data is nested too deeply to compare")
        if len(set(keys)) != len(keys):
            _fail(f"{where} must contain unique items")


def _license(payload: dict[str, object], where: str) -> None:
    url = payload["license"]
    if type(url) is not str or _HTTPS_RE.fullmatch(url) is None:
        _fail(f"{where}.license must be an absolute https:// URL")


def _extra(payload: dict[str, object], where: str) -> None:
    if "extra" in payload and type(payload["extra"]) is not dict:
        _fail(f"{where}.extra must be an object")


def _publish(p: dict[str, object]) -> None:
    w = "payload"
    _closed(p, _PUBLISH_KEYS, _PUBLISH_REQUIRED, w)
    _license(p, w)
    kind = p["kind"]
    if type(kind) is not str or kind not in KINDS:
        _fail("payload.kind is not a known contribution kind")
    _text(p, "title", w)
    _text(p, "statement", w)
    if not is_language(p["language"]):
        _fail("payload.language must match [A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*")
    _context(p["context"], "payload.context")
    _text(p, "basis", w)
    evidence = _evidence(p["evidence"], "payload.evidence") if "evidence" in p else None
    if "reproduction" in p:
        _reproduction(p["reproduction"], "payload.reproduction")
    relations = _relations(p["relations"], "payload.relations") if "relations" in p else None
    if "tags" in p:
        tags = p["tags"]
        if type(tags) is not list:
            _fail("payload.tags must be an array")
        for tag in tags:
            if not is_tag(tag):
                _fail("payload.tags items must match [a-z0-9][a-z0-9._-]{0,63}")
        _unique_strings(tags, "payload.tags")
    if "profiles" in p:
        _profiles(p["profiles"], "payload.profiles")
    _extra(p, w)
    # Kind rules (§4.1), which the schema expresses as if/then.
    if kind == "resource" and not any(e.get("role") == "output" and "digest" in e for e in evidence or ()):
        _fail("a resource must include an output evidence reference with a digest")
    has_contains = relations is not None and any(r["relation"] == "contains" for r in relations)
    if kind == "collection" and not has_contains:
        _fail("a collection must include at least one contains relationship")
    if has_contains and kind != "collection":
        _fail("only a collection may include contains relationships")


def _assess(p: dict[str, object]) -> None:
    w = "payload"
    _closed(p, _ASSESS_KEYS, _ASSESS_REQUIRED, w)
    _license(p, w)
    if not is_hash_shape(p["target"]):
        _fail("payload.target must be a 43-character base64url event ID")
    verdict = p["verdict"]
    if type(verdict) is not str or verdict not in VERDICTS:
        _fail("payload.verdict is not a known verdict")
    _text(p, "summary", w)
    _context(p["context"], "payload.context")
    _text(p, "basis", w)
    if "evidence" in p:
        _evidence(p["evidence"], "payload.evidence")
    rep = _reproduction(p["reproduction"], "payload.reproduction") if "reproduction" in p else None
    if "profiles" in p:
        _profiles(p["profiles"], "payload.profiles")
    _extra(p, w)
    if verdict in OBSERVED_VERDICTS and (rep is None or "observed" not in rep):
        _fail(f"a {verdict} assessment requires reproduction.observed")


def _retract(p: dict[str, object], options: ValidationOptions) -> None:
    w = "payload"
    required = ("target", "reason") if options.allow_legacy_retract else ("license", "target", "reason")
    _closed(p, _RETRACT_KEYS, required, w)
    if "license" in p:
        _license(p, w)
    if not is_hash_shape(p["target"]):
        _fail("payload.target must be a 43-character base64url event ID")
    _text(p, "reason", w)
    _extra(p, w)


def check_payload_structure(event_type: str, payload: object, options: ValidationOptions = DEFAULT_OPTIONS) -> None:
    """Schema-level shape of one payload; raises ``invalid_event``.

    With ``options.allow_legacy_retract`` a retraction may omit ``license``, as
    the earlier draft (``schemas/agent-knowledge-1.0-draft-sdk.schema.json``)
    defines it.
    """
    if type(payload) is not dict:
        _fail("payload must be an object")
    if event_type == PUBLISH:
        _publish(payload)
    elif event_type == ASSESS:
        _assess(payload)
    elif event_type == RETRACT:
        _retract(payload, options)
    else:
        _fail(f"unknown event type {event_type!r}")


# -- semantic rules ----------------------------------------------------------

def _url(value: str, where: str) -> None:
    problem = https_url_problem(value)
    if problem is not None:
        _fail(f"{where}: {problem}")


def _digest(value: str, where: str) -> None:
    if not is_canonical_id(value):
        _fail(f"{where} must canonically encode exactly 32 bytes")


def check_payload_rules(envelope: HasEvent, options: ValidationOptions = DEFAULT_OPTIONS) -> None:
    """Semantic payload checks of §8.1 step 3 on a structurally valid envelope.

    Parsed HTTPS URLs (license, evidence, profiles), canonical digests and
    target IDs, and profile bindings unique by ``profile.digest``. Messages are
    built only on failure: this runs on every submission.
    """
    event = envelope.event
    payload = event["payload"]
    if event["type"] == RETRACT and "license" not in payload and not options.allow_legacy_retract:
        _fail("payload is missing required member 'license' (legacy retractions are refused)")
    if "license" in payload and https_url_problem(payload["license"]) is not None:
        _url(payload["license"], "payload.license")
    if "target" in payload and not is_canonical_id(payload["target"]):
        _digest(payload["target"], "payload.target")
    for i, ev in enumerate(payload.get("evidence", ())):
        if https_url_problem(ev["url"]) is not None:
            _url(ev["url"], f"payload.evidence[{i}].url")
        if "digest" in ev and not is_canonical_id(ev["digest"]):
            _digest(ev["digest"], f"payload.evidence[{i}].digest")
    for i, rel in enumerate(payload.get("relations", ())):
        if not is_canonical_id(rel["target"]):
            _digest(rel["target"], f"payload.relations[{i}].target")
    profiles = payload.get("profiles")
    if profiles:
        digests = set()
        for i, binding in enumerate(profiles):
            ref = binding["profile"]
            if https_url_problem(ref["url"]) is not None:
                _url(ref["url"], f"payload.profiles[{i}].profile.url")
            if not is_canonical_id(ref["digest"]):
                _digest(ref["digest"], f"payload.profiles[{i}].profile.digest")
            if ref["digest"] in digests:
                _fail("payload.profiles must be unique by profile.digest")
            digests.add(ref["digest"])
