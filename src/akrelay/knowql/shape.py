"""``shape`` (seed 000 §7): JSON Schema 2020-12 checking, validation and the deterministic binder.

A completed turn's ``output_json`` always validates against its shape; when
no conforming value can be produced the turn fails (§7.2(3)). The binder
fills an object shape from a fixed vocabulary of property names (answer,
citations, results, status, count, found, …) and never invents a value: a
required property it cannot bind fails the turn with a message naming it.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Protocol, Sequence, TypeVar

import jsonschema
from jsonschema import Draft202012Validator, ValidationError, validators

from akrelay.jsontypes import JSON, JSONObject
from akrelay.kip.kql.regex import RE2_ERROR, RE2Pattern, re2_compile, re2_options
from akrelay.knowql.errors import bad_request

if TYPE_CHECKING:  # annotations only: the binder loads extract when it first binds, not when a request is parsed
    from akrelay.knowql.answer_types import Fact
    from akrelay.knowql.extract import Question

_T = TypeVar("_T")

# ---- patterns in linear time ------------------------------------------------------------------
# jsonschema matches ``pattern`` and ``patternProperties`` with Python's backtracking ``re``,
# which holds the GIL: one hostile shape (``^(?:[\s\S]|[\s\S])*Z$``) would freeze the whole
# worker. Shapes are matched with RE2 instead, as KQL's REGEX is; a pattern RE2 cannot
# compile (backreferences, lookaround) is refused with a 400 when the shape is checked.

_RE2_OPTIONS = re2_options(2 << 20)


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> RE2Pattern:
    return re2_compile(pattern, _RE2_OPTIONS)


def _search(pattern: str, text: str) -> bool:
    return _compiled(pattern).search(text) is not None


class _Descends(Protocol):
    """What the keyword functions use of jsonschema's validator: checking a member against a subschema."""

    def descend(self, instance: object, schema: JSON, path: str | int | None = None,
                schema_path: str | int | None = None) -> Iterator[ValidationError]: ...


# The keyword functions below are called by jsonschema with its validator, the keyword's value (from a
# shape check_shape accepted), the value under check (any JSON) and the subschema that holds the keyword.
# The draft 2020-12 type checker's "string" and "object" are str and dict: isinstance is its is_type.
def _pattern(validator: _Descends, patrn: str, instance: object, schema: JSONObject) -> Iterator[ValidationError]:
    if isinstance(instance, str) and not _search(patrn, instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator: _Descends, pattern_properties: JSONObject, instance: object,
                        schema: JSONObject) -> Iterator[ValidationError]:
    if not isinstance(instance, dict):
        return
    for patrn, subschema in pattern_properties.items():
        for key, value in instance.items():
            if _search(patrn, key):
                yield from validator.descend(value, subschema, path=key, schema_path=patrn)


def _additional_properties(validator: _Descends, additional: JSON, instance: object,
                           schema: JSONObject) -> Iterator[ValidationError]:
    if not isinstance(instance, dict):
        return
    properties, pattern_properties = schema.get("properties"), schema.get("patternProperties")
    known = properties if isinstance(properties, dict) else {}  # objects in a shape check_shape accepted
    patterns = pattern_properties if isinstance(pattern_properties, dict) else {}
    extras = sorted(k for k in instance if k not in known and not any(_search(p, k) for p in patterns))
    if isinstance(additional, dict):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        yield ValidationError(f"additional properties are not allowed ({', '.join(map(repr, extras))} unexpected)")


# ---- bounded work ------------------------------------------------------------------------------
# A shape is attacker-chosen: ``$ref``s that fan out (each ``anyOf`` of two refs to the next) make
# validation exponential, and a long keyword array makes even the schema check slow. The check
# refuses what cannot be evaluated cheaply (node and array caps, a ``$ref`` expansion bound), and
# every validation still runs under a step budget and the turn's deadline, so no thread runs on
# past a turn's end and no error tree grows without bound.

#: Most JSON nodes (objects, arrays and scalars) in one shape.
MAX_SHAPE_NODES = 4096
#: Most objects (subschemas) in one shape: the 2020-12 metaschema check costs ~1.5 ms each.
MAX_SHAPE_OBJECTS = 128
#: Most items in any one array of a shape (``allOf``, ``enum``, ``required``, ``prefixItems``…).
MAX_SHAPE_ARRAY = 256
#: Most subschemas a shape may stand for once its ``$ref``s are expanded (recursion counted once).
MAX_SHAPE_EXPANSION = 20_000
#: Most keyword evaluations one validation may make (each ~50 µs and ~2 KB of error tree in the worst
#: case: about 1 s and 40 MB); a deadline is checked every :data:`_CHECK_EVERY`.
MAX_VALIDATION_STEPS = 20_000
_CHECK_EVERY = 512


class ShapeFailure(Exception):
    """No value conforming to the shape could be produced; the turn fails with this message."""


class ShapeBudgetExceeded(ShapeFailure):
    """Validation ran out of steps or past the turn's deadline; it is abandoned, not finished."""


class _Budget(threading.local):
    steps = 0
    limit = 0            # 0: no validation under way in this thread (no bound applies)
    deadline: float | None = None
    clock: Callable[[], float] = time.time


_budget = _Budget()


#: A jsonschema keyword function: its value's type depends on the keyword; errors yielded, or None.
_Keyword = Callable[..., Iterable[ValidationError] | None]


def _counted(keyword: _Keyword) -> Callable[[_Descends, object, object, JSONObject], Iterator[ValidationError]]:
    def run(validator: _Descends, value: object, instance: object, schema: JSONObject) -> Iterator[ValidationError]:
        budget = _budget
        if budget.limit:
            budget.steps += 1
            if budget.steps > budget.limit:
                raise ShapeBudgetExceeded(f"checking the output against the shape took more than {budget.limit} "
                                          "steps (simplify the shape: fewer $ref branches)")
            if budget.deadline is not None and budget.steps % _CHECK_EVERY == 0 and budget.clock() >= budget.deadline:
                raise ShapeBudgetExceeded("the turn's deadline passed while checking the output against the shape")
        errors = keyword(validator, value, instance, schema)
        if errors is not None:
            yield from errors

    return run


# validators.extend is untyped in types-jsonschema
ShapeValidator: type[Draft202012Validator] = validators.extend(Draft202012Validator, {  # type: ignore[no-untyped-call]
    name: _counted(fn) for name, fn in {
        **Draft202012Validator.VALIDATORS,
        "pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties,
    }.items()
})


def _members(value: object) -> Iterator[tuple[str, object]]:
    """Every ``(name, value)`` member of every object in a schema, iteratively (shapes are bounded in depth)."""
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                yield key, inner
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)


def _patterns(value: object) -> list[str]:
    """Every regular expression a schema holds (``pattern`` values, ``patternProperties`` keys)."""
    found: list[str] = []
    for key, inner in _members(value):
        if key == "pattern" and isinstance(inner, str):
            found.append(inner)
        elif key == "patternProperties" and isinstance(inner, dict):
            found.extend(k for k in inner if isinstance(k, str))
    return found


def _census(shape: object) -> None:
    """400 past the node, object or array-item caps, before any costly check."""
    nodes = objects = 0
    stack: list[object] = [shape]
    while stack:
        item = stack.pop()
        nodes += 1
        if nodes > MAX_SHAPE_NODES:
            raise bad_request(f"shape has more than {MAX_SHAPE_NODES} JSON nodes")
        if isinstance(item, dict):
            objects += 1
            if objects > MAX_SHAPE_OBJECTS:
                raise bad_request(f"shape has more than {MAX_SHAPE_OBJECTS} objects (subschemas)")
            stack.extend(item.values())
        elif isinstance(item, list):
            if len(item) > MAX_SHAPE_ARRAY:
                raise bad_request(f"shape has an array of {len(item)} items (at most {MAX_SHAPE_ARRAY})")
            stack.extend(item)


def _target(shape: JSONObject, ref: str) -> object:
    """The subschema a local ``#/json/pointer`` ref names; None for anchors and unresolvable refs."""
    if ref == "#":
        return shape
    if not ref.startswith("#/"):
        return None
    node: object = shape
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _expansion(shape: JSONObject) -> int:
    """How many subschemas ``shape`` stands for with every ``$ref`` expanded (memoized; a cycle counts once).

    This is what a validation may visit per instance value: a chain of ``anyOf``s of two refs
    to the next doubles it at every level. Stops counting past :data:`MAX_SHAPE_EXPANSION`.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: object) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:  # recursion: bounded by the instance's depth, counted once
            return 1
        active.add(key)
        total = 1
        children: list[object] = []
        if isinstance(node, dict):
            children = list(node.values())
            for name in ("$ref", "$dynamicRef"):
                ref = node.get(name)
                if isinstance(ref, str):
                    target = _target(shape, ref)
                    if target is not None:
                        children.append(target)
        elif isinstance(node, list):
            children = node
        for child in children:
            if isinstance(child, (dict, list)):
                total += size(child)
                if total > MAX_SHAPE_EXPANSION:
                    break
        active.discard(key)
        sizes[key] = total
        return total

    return size(shape)


def check_shape(shape: JSONObject) -> None:
    """400 unless ``shape`` is a valid Draft 2020-12 schema, small enough to evaluate, whose ``$ref``s stay inside it.

    Bounded: the node, object and array caps and the ``$ref`` fan-out bound run first (linear
    walks), so the costly metaschema check (~1.5 ms an object) only sees shapes within them.
    """
    _census(shape)
    if _expansion(shape) > MAX_SHAPE_EXPANSION:
        raise bad_request(f"shape's $refs fan out to more than {MAX_SHAPE_EXPANSION} subschemas "
                          "(each branch repeating the next costs twice as much to check)")
    try:
        Draft202012Validator.check_schema(shape)
    except jsonschema.SchemaError as exc:
        raise bad_request(f"shape is not a valid JSON Schema (2020-12): {exc.message}") from None
    except (RecursionError, ValueError, TypeError) as exc:
        raise bad_request(f"shape is not a valid JSON Schema (2020-12): {exc}") from None
    root = _types(shape)
    if root and "object" not in root:
        # The Query document types output_json as an object (or null).
        raise bad_request("shape must describe a JSON object (its type must include \"object\")")
    for ref in _refs(shape):
        if not ref.startswith("#"):
            raise bad_request("shape may only use local $ref values (starting with #)")
    for patrn in _patterns(shape):
        try:
            _compiled(patrn)
        except RE2_ERROR as exc:
            raise bad_request(f"shape pattern {patrn[:64]!r} is not supported (RE2 syntax, no backreferences or "
                              f"lookaround): {exc}") from None


def _refs(value: object) -> list[str]:
    return [inner for key, inner in _members(value) if key in ("$ref", "$dynamicRef") and isinstance(inner, str)]


def problems(value: object, shape: JSONObject, *, deadline: float | None = None,
             steps: int = MAX_VALIDATION_STEPS) -> list[str]:
    """Validation problems of ``value`` against ``shape`` (empty: it conforms).

    :class:`ShapeBudgetExceeded` past ``steps`` keyword evaluations or ``deadline`` (a ``time.time()`` value).
    """
    budget = _budget
    outer = (budget.steps, budget.limit, budget.deadline)
    budget.steps, budget.limit, budget.deadline = 0, steps, deadline
    try:
        validator = ShapeValidator(shape, format_checker=Draft202012Validator.FORMAT_CHECKER)
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    except ShapeBudgetExceeded:
        raise
    # jsonschema raises this private class for unresolvable $refs; there is no public name for it.
    except (jsonschema.exceptions.RefResolutionError, jsonschema.exceptions._WrappedReferencingError,  # type: ignore[attr-defined] # noqa: SLF001
            RecursionError, ValueError, TypeError, KeyError, RE2_ERROR) as exc:
        return [f"the shape cannot be evaluated: {exc}"]
    finally:
        budget.steps, budget.limit, budget.deadline = outer
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors[:5]]


def require_conforming(value: _T, shape: JSONObject, *, deadline: float | None = None) -> _T:
    found = problems(value, shape, deadline=deadline)
    if found:
        raise ShapeFailure("the output does not conform to the shape: " + "; ".join(found))
    return value


# ---- the deterministic binder ---------------------------------------------------------------

_ANSWER = {"answer", "summary", "text", "response", "result_text", "output"}
_CITATIONS = {"citations", "sources", "references", "refs"}
_RESULTS = {"results", "items", "capsules", "matches", "knowledge", "artifacts", "findings"}
_STATUS = {"status", "belief", "belief_status"}
_COUNT = {"count", "total", "hits", "num_results", "result_count"}
_FOUND = {"found", "has_results", "answered", "matched"}


def _norm(name: str) -> str:
    """``hasResults`` / ``has-results`` / ``HAS_RESULTS`` -> ``has_results``."""
    name = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _types(schema: object) -> set[str]:
    if not isinstance(schema, dict):
        return set()
    t = schema.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return set()


def _fixed(schema: JSON) -> tuple[bool, JSON]:
    """A value the schema itself dictates: ``const``, a one-member ``enum`` or ``default``."""
    if not isinstance(schema, dict):
        return False, None
    if "const" in schema:
        return True, schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and len(enum) == 1:
        return True, enum[0]
    if "default" in schema:
        return True, schema["default"]
    return False, None


def _project_item(item: JSONObject, schema: JSON) -> JSON:
    """An artifact/citation projected onto an item schema's property names."""
    if "string" in _types(schema) and "object" not in _types(schema):
        return item.get("source") or item.get("title") or ""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return dict(item)
    out: JSONObject = {}
    for name in props:
        key = _norm(name)
        aliases = {"id": ("source", "id"), "title": ("title", "name"), "name": ("name", "title"),
                   "statement": ("text", "statement"), "text": ("text", "statement"), "kind": ("kind",),
                   "status": ("status",), "belief": ("status",), "score": ("score",), "source": ("source",),
                   "url": ("url",), "event_id": ("source",), "hash": ("source",)}.get(key, (key,))
        for alias in aliases:
            if item.get(alias) is not None:
                out[name] = item[alias]
                break
    return out


#: Answering sentences tried per property: each try validates a candidate against the property's subschema.
MAX_FACT_TRIES = 8


def _fits(value: object, schema: object) -> bool:
    return not isinstance(schema, dict) or not problems(value, schema)


def _from_facts(name: str, schema: JSON, facts: Sequence[Fact], question: Question | None) -> tuple[JSON, Fact] | None:
    """A value for property ``name`` read from the answering sentences, and its fact; None if none is found.

    Numbers come with the right unit (the property's own, as in ``timeout_ms`` or "in seconds", else the
    ask's) and are converted into it; a boolean is the yes/no answer; a string enum is the member the
    sentence names; another string is the lead fact. Nothing is invented: no supporting sentence, no value.
    """
    from akrelay.knowql import extract

    if not isinstance(schema, dict):
        return None
    types = _types(schema)
    described = schema.get("description")
    description = described if isinstance(described, str) else ""
    if types & {"number", "integer"}:
        unit_class, unit = extract.unit_of_name(name, description + " " + str(schema.get("title") or ""))
        if unit_class is None and question is not None:
            unit_class, unit = question.unit_class, question.unit
        wanted = extract.Question("quantity", unit_class, unit, ())
        for fact in facts[:MAX_FACT_TRIES]:
            quantity = fact.quantity or extract.answer_quantity(fact.sentence, wanted) if fact.sentence else None
            if unit_class is not None and quantity is not None and quantity.unit_class != unit_class:
                quantity = extract.answer_quantity(fact.sentence, wanted)
            if quantity is None or (unit_class is not None and quantity.unit_class != unit_class):
                continue
            value = extract.convert(quantity, unit) if unit is not None else quantity.value
            if value is None:
                continue
            if "number" not in types:
                if abs(value - round(value)) > 1e-9:
                    continue
                value = int(round(value))
            elif value == int(value):
                value = int(value)
            if _fits(value, schema):
                return value, fact
        return None
    if "boolean" in types:
        for fact in facts[:1]:
            if fact.yes is not None and _fits(fact.yes, schema):
                return fact.yes, fact
        return None
    if "string" in types:  # an untyped property is not given a sentence it did not ask for
        enum = schema.get("enum")
        for fact in facts[:3]:
            if not fact.sentence:
                continue
            if isinstance(enum, list):
                low = fact.sentence.lower()
                hits = sorted((m.start(), member) for member in enum if isinstance(member, str) and member
                              for m in [re.search(r"(?<!\w)" + re.escape(member.lower()) + r"(?!\w)", low)] if m)
                if hits and _fits(hits[0][1], schema):
                    return hits[0][1], fact
                continue
            text = fact.quantity.text if fact.quantity is not None else fact.sentence
            if _fits(text, schema):
                return text, fact
            break
    return None


def bind(shape: JSONObject, answer: str, items: Sequence[JSONObject], citations: Sequence[JSONObject], *,
         facts: Sequence[Fact] = (), question: Question | None = None,
         provenance: dict[str, JSONObject] | None = None) -> JSONObject:
    """A value for ``shape`` from the extractive answer, or :class:`ShapeFailure`.

    ``items`` are the composed artifacts (``source``, ``title``, ``text``,
    ``status``, ``score``, ``url``…), best first. ``facts`` are the answering
    sentences (:class:`akrelay.knowql.answer_types.Fact`, the lead's first): a
    property outside the fixed vocabulary is filled from them, and
    ``provenance`` records, per filled property, the citation of its sentence.
    """
    props = shape.get("properties") or {}
    required = shape.get("required")
    out: JSONObject = {}
    for name, schema in props.items() if isinstance(props, dict) else ():
        fixed, value = _fixed(schema)
        if fixed:
            out[name] = value
            continue
        key = _norm(name)
        types = _types(schema)
        if key in _ANSWER and (not types or "string" in types):
            out[name] = answer
        elif key in _CITATIONS:
            item_schema = schema.get("items", {}) if isinstance(schema, dict) else {}
            out[name] = [_project_item(c, item_schema) for c in citations]
        elif key in _RESULTS:
            item_schema = schema.get("items", {}) if isinstance(schema, dict) else {}
            out[name] = [_project_item(i, item_schema) for i in items]
        elif key in _STATUS and items and (not types or "string" in types):
            out[name] = items[0].get("status")
        elif key in _COUNT and (not types or types & {"integer", "number"}) and not (
                question is not None and question.kind == "count" and facts and facts[0].quantity is not None):
            out[name] = len(items)
        elif key in _FOUND and (not types or "boolean" in types):
            out[name] = bool(items)
        else:
            bound = _from_facts(name, schema, facts, question)
            if bound is not None:
                value, fact = bound
                out[name] = value
                if provenance is not None:
                    provenance[name] = {"citation": fact.citation, "source": fact.source,
                                        "sentence": fact.sentence or fact.note, "belief": fact.status}
            elif "null" in types:
                out[name] = None
    wanted = required if isinstance(required, list) else []  # an array in any shape check_shape accepts
    missing = [name for name in wanted if isinstance(name, str) and name not in out]
    if missing:
        raise ShapeFailure(f"cannot derive required {', '.join(repr(m) for m in missing)} "
                           "without a synthesis model (the extractive composer binds answer, citations, "
                           "results, status, count and found)")
    return require_conforming(out, shape)
