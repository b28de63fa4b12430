"""The Query Document (seed 000 §3, seed 003): strict parsing into :class:`QueryDocument`.

Checks run in a fixed order so that a status is deterministic (JSON, then
each field's type and bounds, then cross-field rules); resolution (404) and
state (409) come later, in :mod:`akrelay.knowql.engine`. ``null`` is the same
as an absent member. Unknown members are ignored (forward compatible); the
names seed 000 §3.8 reserves are ignored too and reported as warnings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from akrelay.jsontypes import JSONObject
from akrelay.knowql.documents import Pinned
from akrelay.knowql.errors import bad_request

MAX_ASK_CHARS = 4000
MAX_SCOPE = 10
MAX_ID_CHARS = 200
MAX_PROMPT_CHARS = 16_384
MAX_LIST = 32
MAX_MODELS = 8
MAX_SHAPE_BYTES = 65_536
MAX_SHAPE_DEPTH = 32
MAX_VARS_BYTES = 16_384
TIMEOUT_CAP = 900
MAX_STEPS = 100
RETRIEVED_CAP = 100
RETRIEVED_CHARS_CAP = 100_000
THINKING_LEVELS = ("minimal", "low", "medium", "high")
#: Seed 000 §3.8: reserved, not part of 0.1.0; accepted and ignored.
RESERVED = ("where", "ground", "budget", "explain", "as_of", "since", "window", "link", "resolve", "trace",
            "await", "apply")
#: The retrieval-only flags in seed 000 §8.3 precedence order.
RETRIEVAL_FLAGS = ("chunks_only", "artifacts_only", "retrieval_only", "pointers_only")


@dataclass(frozen=True)
class QueryDocument:
    ask: str
    scope: tuple[str, ...] | None = None
    session_id: str | None = None
    previous_query_id: str | None = None
    workflow: str | None = None
    system_prompt: str | None = None
    guardrails: str | None = None
    vars: JSONObject | None = None
    shape: JSONObject | None = None
    model: str | None = None
    models: tuple[str, ...] | None = None
    tools: tuple[str, ...] | None = None
    stream: bool = False
    background: bool = False
    timeout_seconds: int = TIMEOUT_CAP
    max_steps: int | None = None
    thinking_level: str | None = None
    compose: bool | None = None
    retrieval_only: bool = False
    pointers_only: bool = False
    chunks_only: bool = False
    artifacts_only: bool = False
    max_retrieved: int | None = None
    max_retrieved_chars: int | None = None
    comparison_group: str | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def continues(self) -> bool:
        return self.session_id is not None or self.previous_query_id is not None

    def retrieval_mode(self) -> tuple[str, str] | None:
        """Seed 000 §8.3: ``(mode, kind)`` when synthesis is skipped, else ``None``.

        ``kind`` is ``chunks``, ``artifacts`` or ``both``; ``mode`` names the
        winning flag (``retrieval_only`` also for ``compose: false``).
        """
        if self.chunks_only:
            return "chunks_only", "chunks"
        if self.artifacts_only:
            return "artifacts_only", "artifacts"
        if self.retrieval_only:
            return "retrieval_only", "both"
        if self.pointers_only:
            return "pointers_only", "both"
        if self.compose is False:
            return "retrieval_only", "both"
        return None

    def pinned(self) -> Pinned:
        """What a new session pins (seed 000 §2.3; ``models`` wins over ``model``)."""
        models = list(self.models) if self.models is not None else [self.model] if self.model is not None else []
        return {"scope": list(self.scope or ()), "system_prompt": self.system_prompt, "guardrails": self.guardrails,
                "models": models, "tools": list(self.tools or ()), "vars": dict(self.vars or {}),
                "workflow": self.workflow}


def _string(doc: Mapping[str, object], name: str, max_chars: int, *, empty: bool = False) -> str | None:
    value = doc.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"{name} must be a string")
    if not empty and not value.strip():
        raise bad_request(f"{name} must not be empty")
    if len(value) > max_chars:
        raise bad_request(f"{name} is longer than {max_chars} characters")
    _check_text(name, value)
    return value


def _check_text(name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{name} contains an unpaired surrogate") from None


def _bool(doc: Mapping[str, object], name: str) -> bool | None:
    value = doc.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be a boolean")
    return value


def _int(doc: Mapping[str, object], name: str, cap: int | None) -> int | None:
    """A positive JSON integer; values above ``cap`` are lowered to it."""
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be an integer")
    if value < 1:
        raise bad_request(f"{name} must be at least 1")
    return min(value, cap) if cap is not None else value


def _strings(doc: Mapping[str, object], name: str, max_items: int, *, min_items: int = 0) -> tuple[str, ...] | None:
    value = doc.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request(f"{name} must be an array of strings")
    if not min_items <= len(value) <= max_items:
        raise bad_request(f"{name} must have {min_items} to {max_items} items")
    for item in value:
        if not isinstance(item, str) or not item or len(item) > MAX_ID_CHARS:
            raise bad_request(f"every {name} item must be a non-empty string of at most {MAX_ID_CHARS} characters")
        _check_text(name, item)
    return tuple(dict.fromkeys(value))


def _depth(value: object, limit: int) -> int:
    """Nesting depth of a JSON value, iteratively (a deep shape must not blow the stack)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return depth
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def _encoded_size(name: str, value: object) -> int:
    """UTF-8 size of a JSON value; 400 if it holds an unpaired surrogate (it could not be stored)."""
    try:
        return len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
    except UnicodeEncodeError:
        raise bad_request(f"{name} contains an unpaired surrogate") from None
    except (RecursionError, ValueError):
        raise bad_request(f"{name} is nested too deeply") from None


def _shape(doc: Mapping[str, object]) -> JSONObject | None:
    value = doc.get("shape")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("shape must be a JSON Schema object (KnowQL 0.1.0 has no shorthand)")
    if _encoded_size("shape", value) > MAX_SHAPE_BYTES:
        raise bad_request(f"shape is larger than {MAX_SHAPE_BYTES} bytes")
    if _depth(value, MAX_SHAPE_DEPTH) > MAX_SHAPE_DEPTH:
        raise bad_request(f"shape is nested deeper than {MAX_SHAPE_DEPTH} levels")
    from akrelay.knowql.shape import check_shape

    check_shape(value)
    return value


def _vars(doc: Mapping[str, object]) -> JSONObject | None:
    value = doc.get("vars")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("vars must be an object")
    if _encoded_size("vars", value) > MAX_VARS_BYTES:
        raise bad_request(f"vars is larger than {MAX_VARS_BYTES} bytes")
    policy = value.get("policy")
    if policy is not None:
        from akrelay.kip.projection import POLICIES

        if not isinstance(policy, str) or policy not in POLICIES:
            raise bad_request(f"vars.policy must be one of {', '.join(sorted(POLICIES))}")
    return value


def parse_document(value: object) -> QueryDocument:
    """A decoded JSON value -> :class:`QueryDocument`, or :class:`KnowqlError` 400."""
    if not isinstance(value, dict):
        raise bad_request("the Query Document must be a JSON object")
    if value.get("ask") is None:
        raise bad_request("ask is required")
    ask = _string(value, "ask", MAX_ASK_CHARS)
    assert ask is not None
    scope = _strings(value, "scope", MAX_SCOPE, min_items=1)
    session_id = _string(value, "session_id", MAX_ID_CHARS)
    previous = _string(value, "previous_query_id", MAX_ID_CHARS)
    workflow = _string(value, "workflow", 64)
    system_prompt = _string(value, "system_prompt", MAX_PROMPT_CHARS, empty=True)
    guardrails = _string(value, "guardrails", MAX_PROMPT_CHARS, empty=True)
    vars_ = _vars(value)
    shape = _shape(value)
    model = _string(value, "model", MAX_ID_CHARS)
    models = _strings(value, "models", MAX_MODELS, min_items=1)
    tools = _strings(value, "tools", MAX_LIST)
    stream = _bool(value, "stream") or False
    background = _bool(value, "background") or False
    timeout = _int(value, "timeout_seconds", TIMEOUT_CAP)
    max_steps = _int(value, "max_steps", MAX_STEPS)
    thinking = _string(value, "thinking_level", 16)
    if thinking is not None and thinking not in THINKING_LEVELS:
        raise bad_request(f"thinking_level must be one of {', '.join(THINKING_LEVELS)}")
    compose = _bool(value, "compose")
    flags = {name: _bool(value, name) or False for name in RETRIEVAL_FLAGS}
    max_retrieved = _int(value, "max_retrieved", RETRIEVED_CAP)
    max_chars = _int(value, "max_retrieved_chars", RETRIEVED_CHARS_CAP)
    group = _string(value, "comparison_group", MAX_ID_CHARS)
    if stream and background:
        raise bad_request("stream and background are mutually exclusive")
    if not (session_id or previous) and scope is None:
        raise bad_request("scope is required to start a session (1 to 10 contexts)")
    warnings = [f"{name} is reserved for a later KnowQL version and was ignored" for name in RESERVED if name in value]
    return QueryDocument(
        ask=ask, scope=scope, session_id=session_id, previous_query_id=previous, workflow=workflow,
        system_prompt=system_prompt, guardrails=guardrails, vars=vars_, shape=shape, model=model, models=models,
        tools=tools, stream=stream, background=background, timeout_seconds=timeout or TIMEOUT_CAP,
        max_steps=max_steps, thinking_level=thinking, compose=compose, max_retrieved=max_retrieved,
        max_retrieved_chars=max_chars, comparison_group=group, warnings=tuple(warnings), **flags)
