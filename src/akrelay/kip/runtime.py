"""The read-only KIP runtime (§70–§87): request envelope in, response envelope out.

One runtime per relay. It never writes: KML is recognised by its statement
keyword and refused with ``ReadonlyViolation`` whatever the ``language`` label
says (§73.1, §76, §88.3). Every operation of a request reads the one snapshot
taken when the request starts, so ``results[].context.snapshot_seq`` agree.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Callable, Required, TypeAlias, TypedDict, cast

import jsonschema

from akrelay.jsontypes import JSONMapping, JSONObject, JSONValue
from akrelay.kip import budget, meta
from akrelay.kip.config import KipConfig
from akrelay.kip.errors import KipError
from akrelay.kip.kql import classify, parse_meta
from akrelay.kip.kql.evaluate import execute_kql
from akrelay.kip.kql.grammar import parser
from akrelay.kip.nexus import Nexus, NexusBase
from akrelay.kip.package import AK_PACKAGE_REF, SchemaEnvironment, load_package
from akrelay.kip.paging import CursorCodec
from akrelay.kip.projection import POLICIES, Projection, project

#: Request members §71 defines; the schema closes the object.
MAX_OPERATIONS = meta.LIMITS["max_operations_per_request"]
KNOWN_CAPABILITIES = set(meta.SUPPORTED_CAPABILITIES) | set(meta.ENGINE_CAPABILITIES) | set(meta.UNSUPPORTED_CAPABILITIES)
#: Deepest JSON nesting a request may have. Parameter values are compared, sorted
#: and bound into cursors by recursive code; this bound keeps them far from
#: Python's recursion limit (a parameter value may nest about 60 levels).
MAX_REQUEST_DEPTH = meta.LIMITS["max_request_depth"]
#: The KIP request schema (copied into akrelay/data), read once by :func:`preload`.
REQUEST_SCHEMA = Path(__file__).resolve().parents[1] / "data" / "kip-request.schema.json"

#: A response envelope, or one of its parts: a JSON object whose values are read-only views
#: (error details, META results and counts are placed in it as they are, not copied).
Response: TypeAlias = dict[str, JSONValue]


# The request envelope as data/kip-request.schema.json admits it (read by key once validated).
class KipOperation(TypedDict, total=False):
    op_id: str
    language: str                  # "KQL" | "KML" | "META"; the parsed command is authoritative
    command: str                   # exactly one of command and ast
    ast: JSONObject
    parameters: JSONObject
    idempotency_key: str
    options: JSONObject
    extensions: JSONObject


class KipExecution(TypedDict, total=False):
    mode: str                      # "independent" | "sequence" | "atomic" (the schema requires it)
    on_error: str                  # "stop" | "continue"
    isolation: str
    idempotency_key: str
    extensions: JSONObject


class KipSpaceSelector(TypedDict, total=False):
    id: str
    uri: str


class KipReadBinding(TypedDict, total=False):
    snapshot_token: str
    extensions: JSONObject


class KipPreconditions(TypedDict, total=False):
    space_seq: int
    schema_environment_version: int
    extensions: JSONObject


class KipRequest(TypedDict, total=False):
    kip: Required[str]
    request_id: str
    space: KipSpaceSelector
    compatibility_profile: str
    execution: KipExecution
    read: KipReadBinding
    ingest: JSONObject
    preconditions: KipPreconditions
    operations: Required[list[KipOperation]]
    parameters: JSONObject
    context: JSONObject
    requires: JSONObject           # capability name -> required (false: not required)
    options: JSONObject
    extensions: JSONObject


class KipRuntime:
    """In-process KIP reads over one nexus: ``execute(request)``, ``meta(command)``, ``project(...)``."""

    def __init__(self, config: KipConfig | None = None, nexus: NexusBase | None = None, *,
                 cursor_secret: bytes | None = None, environment: SchemaEnvironment | None = None,
                 budget_ms: int | None = budget.DEFAULT_BUDGET_MS,
                 clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        self.config = config or KipConfig()
        self.environment = environment if environment is not None else load_environment(self.config)
        #: CPU milliseconds each request may use (``None``: unlimited); see ``akrelay.kip.budget``.
        self.budget_ms = budget_ms
        #: Wall-clock milliseconds (cursor expiry); the KQL evaluator reads no clock of its own.
        self.now_ms = clock_ms
        if AK_PACKAGE_REF not in {p.ref for p in self.environment.packages}:
            raise ValueError(f"the operator configuration must install {AK_PACKAGE_REF}: the import mapping uses it")
        if self.config.default_policy not in POLICIES:
            raise ValueError(f"unknown default epistemic policy {self.config.default_policy!r}")
        self.nexus = nexus if nexus is not None else Nexus(self.config.space_id)
        if self.nexus.space_id != self.config.space_id:
            raise ValueError("the nexus belongs to another Space")
        self.cursors = CursorCodec(cursor_secret or os.urandom(32))
        #: held for each read: one request at a time per runtime, at one nexus snapshot
        self.lock = ReadScope(self.nexus)
        preload()  # compile the grammars now, not inside the first request's budget

    # ---- Python API ---------------------------------------------------------------------

    def meta(self, command: str, parameters: JSONMapping | None = None) -> Response:
        """Run one META command at the head; returns its result or raises ``KipError``."""
        with self.lock:
            result, _ = meta.execute(self, parse_meta(command), parameters or {}, self.nexus.head)
        return result

    def project_capsule(self, capsule_id: str, *, policy: str | None = None, as_of: int | None = None,
                        purpose: str | None = None, risk: str | None = None) -> Projection:
        """The projection of ``(C, ak_holds, true)`` for a capsule's publish event hash."""
        with self.lock:
            seq = self.nexus.check_seq(as_of)
            prop = self.nexus.holds(capsule_id, seq)
            if prop is None:
                raise KipError("NotFoundOrNotVisible", f"no capsule {capsule_id!r} at space_seq {seq}")
            return self.project(prop.id, policy=policy, as_of=seq, purpose=purpose, risk=risk)

    def project(self, proposition_id: str, *, policy: str | None = None, as_of: int | None = None,
                purpose: str | None = None, risk: str | None = None) -> Projection:
        with self.lock:
            return project(self.nexus, proposition_id, trust=self.config.trust, policy_name=policy,
                           default_policy=self.config.default_policy, as_of=as_of,
                           schema_environment_version=self.environment.version, purpose=purpose, risk=risk)

    def element(self, element_id: str, as_of: int | None = None) -> JSONObject:
        """The element view of one id at ``as_of``."""
        with self.lock:
            seq = self.nexus.check_seq(as_of)
            element = self.nexus.get(element_id, seq)
            if element is None:
                raise KipError("NotFoundOrNotVisible", f"no element {element_id!r} at space_seq {seq}")
            return self.nexus.view(element, seq)

    def kql_available(self) -> bool:
        return True

    # ---- helpers for META -------------------------------------------------------------

    def type_count(self, type_name: str, seq: int) -> int:
        return self.nexus.type_count(type_name, seq)

    def symbol_view(self, name: str, ref: str, sym: JSONObject) -> Response:
        definition = {k: v for k, v in sym.items() if k not in ("kind", "description")}
        return {"name": name, "ref": ref, "lineage": ref.split("@")[0] + "/" + name, "kind": sym["kind"],
                "description": sym.get("description"), "definition": definition}

    def snapshot_at_time(self, at_ms: int, head: int) -> int:
        from akrelay.kip.timefmt import kip_timestamp
        return self.nexus.seq_at_time(kip_timestamp(at_ms), head)

    # ---- the wire runtime -------------------------------------------------------------

    def execute(self, request: object) -> tuple[int, Response]:
        """A request envelope -> ``(http status, response envelope)``."""
        request_id = request.get("request_id") if isinstance(request, dict) else None
        if not isinstance(request_id, str) or not 1 <= len(request_id) <= 256:
            request_id = None  # only a well-formed id is echoed
        try:
            checked = self._check_envelope(request)
        except KipError as exc:
            return 400, self.failure(request_id, exc)
        execution: KipExecution = checked.get("execution") or {}
        mode = execution.get("mode", "independent")
        on_error = execution.get("on_error", "stop")
        shared = checked.get("parameters") or {}
        try:
            self.lock.__enter__()
        except KipError as exc:  # the nexus itself cannot be read now (being created, or refused)
            return 503, self.failure(request_id, exc)
        try:
            with budget.scope(budget.Budget(self.budget_ms, time.thread_time)) as spent:
                seq = self.nexus.head
                results: list[Response] = []
                stop = False
                for op in checked["operations"]:
                    entry: Response = {}
                    if "op_id" in op:
                        entry["op_id"] = op["op_id"]
                    if stop:
                        entry["status"] = "skipped"
                        results.append(entry)
                        continue
                    params = {**shared, **(op.get("parameters") or {})}
                    try:
                        spent.check()
                        result, extra = self._operation(op, params, seq)
                        entry["status"] = "succeeded"
                        if isinstance(result, dict) and "next_cursor" in result:
                            result = dict(result)
                            entry["next_cursor"] = result.pop("next_cursor")
                        entry["result"] = result
                        entry["context"] = {"space_id": self.nexus.space_id, "snapshot_seq": seq,
                                            "schema_environment_version": self.environment.version, **extra}
                    except (KipError, RecursionError) as exc:
                        if isinstance(exc, RecursionError):  # a safety net: parse-time bounds keep depth low
                            exc = KipError("ResourceExhausted", "the operation nests deeper than this runtime allows",
                                           details={"limit": "recursion"})
                        entry["status"] = "failed"
                        entry["error"] = exc.to_wire()
                        entry["context"] = {"space_id": self.nexus.space_id, "snapshot_seq": seq}
                        if mode == "sequence" and on_error == "stop":
                            stop = True
                    results.append(entry)
        finally:
            self.lock.__exit__(None, None, None)
        ok = sum(1 for r in results if r["status"] == "succeeded")
        status = "succeeded" if ok == len(results) else "failed" if ok == 0 else "partial"
        response: Response = {"kip": "2.0"}
        if request_id:
            response["request_id"] = request_id
        response.update({
            "status": status,
            "execution": {"mode": mode, **({"on_error": on_error} if mode == "sequence" else {})},
            "results": results,
            "context": {"space_id": self.nexus.space_id, "schema_environment_version": self.environment.version},
            "snapshot": {"space_id": self.nexus.space_id, "snapshot_seq": seq},
            "receipt": None,
            "warnings": [],
        })
        return 200, response

    def failure(self, request_id: str | None, exc: KipError) -> Response:
        """The response envelope of a request refused as a whole (no operation ran)."""
        response: Response = {"kip": "2.0"}
        if request_id:
            response["request_id"] = request_id
        response.update({"status": "failed", "results": [],
                         "context": {"space_id": self.nexus.space_id}, "snapshot": None, "receipt": None,
                         "warnings": [], "error": exc.to_wire()})
        return response

    def _check_envelope(self, request: object) -> KipRequest:
        """``request`` as the validated KIP request object; ``KipError`` when it is not one."""
        if not isinstance(request, dict):
            raise KipError("InvalidRequestEnvelope", "the request must be a JSON object")
        kip = request.get("kip")
        if kip is None:
            raise KipError("InvalidRequestEnvelope", 'the request must carry "kip": "2.0"')
        if kip != "2.0":
            raise KipError("UnsupportedProtocolVersion", f"KIP {kip!r} is not supported; this runtime speaks 2.0",
                           details={"supported": ["2.0"]})
        if _deeper_than(request, MAX_REQUEST_DEPTH):
            raise KipError("ResourceExhausted", f"the request nests JSON deeper than {MAX_REQUEST_DEPTH} levels",
                           details={"limit": "max_request_depth", "max": MAX_REQUEST_DEPTH})
        problems = _schema_problems(request)
        if problems:
            raise KipError("InvalidRequestEnvelope", problems[0], details={"problems": problems[:10]})
        checked = cast(KipRequest, request)  # what the schema admits (one cast per request)
        ops = checked["operations"]
        if len(ops) > MAX_OPERATIONS:
            raise KipError("ResultLimitExceeded", f"at most {MAX_OPERATIONS} operations per request",
                           details={"max": MAX_OPERATIONS})
        op_ids = [op["op_id"] for op in ops if "op_id" in op]
        if len(op_ids) != len(set(op_ids)):
            raise KipError("InvalidRequestEnvelope", "op_id values must be unique within the request")
        space = checked.get("space")
        if space is not None and space.get("id", self.nexus.space_id) != self.nexus.space_id:
            raise KipError("NotFoundOrNotVisible", "no such MemorySpace is visible here")
        if space is not None and "uri" in space and space["uri"].rstrip("/").lower() != self.config.origin.rstrip("/").lower():
            raise KipError("NotFoundOrNotVisible", "no such MemorySpace is visible here")
        mode = (checked.get("execution") or {}).get("mode")
        if mode == "atomic":
            raise KipError("UnsupportedCapability", "atomic execution (atomic_batch) is not supported by this "
                           "read-only runtime", details={"capability": "atomic_batch"})
        isolation = (checked.get("execution") or {}).get("isolation")
        if isolation is not None and isolation != "snapshot":
            raise KipError("UnsupportedIsolation", f"isolation {isolation!r} is not offered; reads use one snapshot",
                           details={"supported": ["snapshot"]})
        if "ingest" in checked:
            raise KipError("InvalidRequestEnvelope", "an ingestion context needs a write transaction; this runtime "
                           "is read-only (§71.1, §76)")
        if "read" in checked and "snapshot_token" in checked["read"]:
            raise KipError("UnsupportedCapability", "snapshot tokens are not issued; use AS OF SEQ",
                           details={"capability": "snapshot_token"})
        pre = checked.get("preconditions") or {}
        if "space_seq" in pre and pre["space_seq"] != self.nexus.head:
            raise KipError("PreconditionFailed", f"space_seq is {self.nexus.head}, not {pre['space_seq']}",
                           details={"space_seq": self.nexus.head})
        if "schema_environment_version" in pre and pre["schema_environment_version"] != self.environment.version:
            raise KipError("PreconditionFailed", "the Schema Environment version differs",
                           details={"schema_environment_version": self.environment.version})
        for name, wanted in (checked.get("requires") or {}).items():
            if wanted is False:
                continue
            if name not in KNOWN_CAPABILITIES or name in meta.UNSUPPORTED_CAPABILITIES:
                raise KipError("UnsupportedCapability", f"required capability {name!r} is not supported",
                               details={"capability": name})
        return checked

    def _operation(self, op: KipOperation, params: JSONMapping, seq: int) -> tuple[Response, Response]:
        if "ast" in op:
            raise KipError("UnsupportedCapability", "structured AST operations are not accepted; send command text",
                           details={"capability": "ast"})
        command = op["command"]
        language = classify(command)
        label = op.get("language")
        if language == "KML":
            raise KipError("ReadonlyViolation", "this is a read-only KIP runtime: KML is refused",
                           details={"language": "KML"}, hint="use META (or KQL) reads")
        if label == "KML" or (label is not None and language is not None and label != language):
            raise KipError("LanguageMismatch", f"the command is {language or 'not recognised'}, labelled {label}",
                           details={"declared": label, "parsed": language})
        if language == "META":
            return meta.execute(self, parse_meta(command), params, seq)
        if language == "KQL":
            # KQL types its cells as bound values; render() has made each a JSON view by now
            return cast("tuple[Response, Response]", execute_kql(self, command, params, seq))
        raise KipError("InvalidSyntax", "the command does not start with a KQL, KML or META keyword",
                       details={"line": 1, "column": 1})


class ReadScope:
    """The runtime lock: a re-entrant lock that also holds one nexus read snapshot.

    Every operation of a request (META, KQL, projections) runs inside it, so all of
    them see the same committed state even while an importer in another process
    commits (``NexusBase.reading``).
    """

    def __init__(self, nexus: NexusBase) -> None:
        self._lock = threading.RLock()
        self._nexus = nexus
        self._scopes: list[contextlib.AbstractContextManager[object]] = []

    @property
    def mutex(self) -> threading.RLock:
        """The bare lock, for an in-process importer: it excludes readers without opening a snapshot."""
        return self._lock

    def __enter__(self) -> "ReadScope":
        self._lock.acquire()
        try:
            scope = self._nexus.reading()
            scope.__enter__()
        except BaseException:
            self._lock.release()
            raise
        self._scopes.append(scope)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        try:
            self._scopes.pop().__exit__(exc_type, exc, traceback)
        finally:
            self._lock.release()


def load_environment(config: KipConfig) -> SchemaEnvironment:
    """The Schema Environment of the packages ``config`` installs (read from their files now)."""
    return SchemaEnvironment([load_package(p) for p in config.package_paths])


@functools.cache
def request_validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(REQUEST_SCHEMA.read_text(encoding="utf-8")))


def preload() -> None:
    """Read every file a KIP request needs from the installed package, once, now.

    The route calls it at app start, so a package reinstalled (or a file made
    unreadable) under a running relay cannot fail requests later.
    """
    from akrelay.kip import grammar_cache
    from akrelay.kip.kql import grammar

    request_validator()
    grammar.use_loader(grammar_cache.load_or_compile)  # tables compiled by an earlier start (issue 25)
    parser("kql")
    parser("meta")


def _deeper_than(value: object, limit: int) -> bool:
    """Whether JSON ``value`` nests more than ``limit`` arrays/objects deep (no recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in item)
    return False


def _schema_problems(request: object) -> list[str]:
    """Static request-shape problems against the KIP request schema."""
    errors = sorted(request_validator().iter_errors(request), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors]
