"""Issue 11, the KIP endpoint: nesting bounds, REGEX cost, the CPU budget — in process and via ``akrelay kql``.

Every input here used to end in a ``RecursionError`` (a 500 with thousands of
traceback lines over HTTP), a regular expression that froze the worker, or a
query that ran for minutes; each must now be one KIP error.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import pytest

from akrelay.cli import main
from akrelay.kip import budget
from akrelay.kip.kql import evaluate as E
from akrelay.kip.kql import query as Q
from akrelay.kip.kql.grammar import MAX_NESTING
from akrelay.kip.runtime import MAX_REQUEST_DEPTH

from .fixtures import Log, request

CAPSULE = '?c {type: "KnowledgeCapsule"}'
#: Each shape from issue 11 at the size that overflowed, as a function of its size.
SHAPES = {
    "optional": (200, lambda k: f"FIND(?c) WHERE {{ {CAPSULE} " + "OPTIONAL { " * k + CAPSULE + " }" * k + " }"),
    "not": (300, lambda k: f"FIND(?c) WHERE {{ {CAPSULE} " + "NOT { " * k + '?c {name: "zz"}' + " }" * k + " }"),
    "union": (300, lambda k: f"FIND(?c) WHERE {{ {CAPSULE} " + "UNION { " * k + CAPSULE + " }" * k + " }"),
    "object_literal": (200, lambda k: f"FIND(?c) WHERE {{ {CAPSULE} FILTER(" + "{a: " * k + "1" + "}" * k + " != null) }"),
    "array_literal": (300, lambda k: f"FIND(?c) WHERE {{ {CAPSULE} FILTER(" + "[" * k + "1" + "]" * k + " != null) }"),
    "find_and_order": (300, lambda k: "FIND(" + "[" * k + "?c.name" + "]" * k + f") WHERE {{ {CAPSULE} }} ORDER BY "
                       + "[" * k + "?c.name" + "]" * k),
    "and_chain": (400, lambda k: f"FIND(?c) WHERE {{ {CAPSULE} FILTER(" + " && ".join(["true"] * k) + ") }"),
    "or_chain": (400, lambda k: f"FIND(?c) WHERE {{ {CAPSULE} FILTER(" + " || ".join(["false"] * k) + ") }"),
    "calls": (300, lambda k: f"FIND(?c) WHERE {{ {CAPSULE} FILTER(" + "IS_NULL(" * k + "?c.name" + ")" * k + " != null) }"),
    "negations": (300, lambda k: f"FIND(?c) WHERE {{ {CAPSULE} FILTER(" + "!(" * k + "true" + ")" * k + " != null) }"),
}


@pytest.fixture(scope="module")
def log() -> Log:
    log = Log()
    for i in range(8):
        log.publish("alice", f"Capsule {i}", tags=["t"])
    return log


@pytest.fixture
def rt(log):
    return log.runtime()


def _op(rt, command: str, language: str = "KQL", **params) -> dict:
    response = request(rt, {"language": language, "command": command, "parameters": params})
    assert response["_http_status"] == 200, response
    return response["results"][0]


def _error(rt, command: str, language: str = "KQL", **params) -> dict:
    result = _op(rt, command, language, **params)
    assert result["status"] == "failed", result
    return result["error"]


# ------------------------------------------------------------------------ nesting


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_deep_nesting_is_resource_exhausted_at_parse_time(rt, shape: str) -> None:
    size, build = SHAPES[shape]
    error = _error(rt, build(size))
    assert error["code"] == "ResourceExhausted" and error["category"] == "resource"
    assert error["details"]["limit"] == "max_nesting_depth" and error["details"]["max"] == MAX_NESTING
    if shape not in ("and_chain", "or_chain", "negations"):  # a chain of `true` has no token to point at
        assert error["details"]["line"] == 1 and error["details"]["column"] > 1


def _deepest_accepted(rt, build) -> int:
    lo, hi = 1, 300
    while lo < hi:  # bounded binary search for the largest size under the bound
        mid = (lo + hi + 1) // 2
        if _op(rt, build(mid)).get("error", {}).get("code") == "ResourceExhausted":
            hi = mid - 1
        else:
            lo = mid
    return lo


def _with_stack_used(frames: int, fn):
    """Call ``fn`` with ``frames`` Python frames already on the stack."""
    return fn() if frames == 0 else _with_stack_used(frames - 1, fn)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_deepest_accepted_command_runs_with_stack_to_spare(rt, shape: str) -> None:
    """At the bound, parsing, checks, evaluation and rendering all fit with 300 frames already used."""
    _, build = SHAPES[shape]
    size = _deepest_accepted(rt, build)
    assert size >= 50  # the bound still admits any realistic query
    Q._parse_checked.cache_clear()
    E._prepared.cache_clear()
    result = _with_stack_used(300, lambda: _op(rt, build(size)))
    assert result["status"] == "succeeded", result


def test_meta_nesting_is_bounded_too(rt) -> None:
    deep = "DESCRIBE ACCESS WITH " + "{a: " * 300 + "1" + "}" * 300
    assert _error(rt, deep, "META")["code"] == "ResourceExhausted"


def test_deep_parameter_values_are_refused_before_evaluation(rt) -> None:
    deep: list = []
    for _ in range(600):
        deep = [deep]
    for command in (f"FIND(?c) WHERE {{ {CAPSULE} FILTER(?c.name != :p) }}",
                    'FIND(?c) WHERE { ?c {type: "KnowledgeCapsule", name: :p} }'):
        response = request(rt, {"language": "KQL", "command": command, "parameters": {"p": deep}})
        assert response["_http_status"] == 400
        assert response["error"]["code"] == "ResourceExhausted"
        assert response["error"]["details"] == {"limit": "max_request_depth", "max": MAX_REQUEST_DEPTH}
        assert response["error"]["retry"] == {"class": "requires_different_input"}
    shallow: list = []
    for _ in range(MAX_REQUEST_DEPTH - 5):
        shallow = [shallow]
    assert _op(rt, f"FIND(?c) WHERE {{ {CAPSULE} FILTER(?c.name != :p) }}", p=shallow)["status"] == "succeeded"


# -------------------------------------------------------------------------- REGEX


def test_hostile_patterns_match_in_linear_time() -> None:
    """The issue's patterns, in a child process so that a backtracking engine fails by timeout, not by hanging."""
    code = textwrap.dedent("""
        from akrelay.kip.kql.regex import regex_match
        assert not regex_match("a" * 200, "^(a|a){1,27}c")
        assert not regex_match("a" * 401, "a*a*a*c")
        assert not regex_match("a" * 60, "(a|a)*c")
        assert not regex_match("a" * 60000, "(a+)+b")
        assert regex_match("a" * 60 + "c", "(a|a)*c")
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize(("pattern", "code"), [
    (r"(a)\1", "InvalidSyntax"),          # backreference
    ("(?=a)", "InvalidSyntax"),           # lookahead
    ("(?<=a)b", "InvalidSyntax"),         # lookbehind
    ("(?>a)", "InvalidSyntax"),           # atomic group
    ("a++", "InvalidSyntax"),             # possessive repeat
    ("a{1001}", "InvalidSyntax"),         # counted repetition beyond 1000
    ("[", "InvalidSyntax"),
    ("a" * 513, "InvalidSyntax"),         # pattern length
    (r"(\pL{50}){4}", "ResourceExhausted"),  # compiles beyond the program budget
])
def test_patterns_outside_the_dialect_are_refused(rt, pattern: str, code: str) -> None:
    error = _error(rt, f"FIND(?c) WHERE {{ {CAPSULE} FILTER(REGEX(?c.name, :re)) }}", re=pattern)
    assert error["code"] == code
    assert "docs/kql.md" in error.get("hint", "") or code == "InvalidSyntax"


def test_regex_dialect_semantics(rt) -> None:
    def names(pattern: str) -> list:
        result = _op(rt, f"FIND(?c.name) WHERE {{ {CAPSULE} FILTER(REGEX(?c.name, :re)) }} ORDER BY ?c.name", re=pattern)
        return [row[0] for row in result["result"]["rows"]]

    assert names("[0-1]$") == ["Capsule 0", "Capsule 1"]   # unanchored search, $ at the end
    assert names("(?i)^capsule 7") == ["Capsule 7"]       # inline case folding
    assert names("(a|a)*psule 3") == ["Capsule 3"]        # no backtracking blow-up, same answers
    assert names(r"\pL+ 5") == ["Capsule 5"]              # Unicode classes
    subject = "a" * 65537
    error = _error(rt, f"FIND(?c) WHERE {{ {CAPSULE} FILTER(REGEX(:s, \"a\")) }}", s=subject)
    assert error["code"] == "ResourceExhausted"


# ------------------------------------------------------------------------- budget


def _nested_not(depth: int) -> str:
    """A NOT whose inner blocks each stay tiny while their product is 8^depth (issue 11's shape)."""
    inner = "FILTER(false)"
    for i in range(depth):
        inner = f'?v{i} {{type: "KnowledgeCapsule"}} ' + (f"NOT {{ {inner} }}" if i else inner)
    return f"FIND(?c) WHERE {{ {CAPSULE} NOT {{ {inner} }} }}"


def test_budget_stops_a_nested_not_inside_its_inner_loops(rt) -> None:
    rt.budget_ms = 100
    response = request(rt, {"op_id": "heavy", "language": "KQL", "command": _nested_not(6)},
                       {"op_id": "after", "language": "META", "command": "DESCRIBE PROTOCOL"},
                       execution={"mode": "independent"})
    heavy, after = response["results"]
    assert heavy["status"] == "failed" and heavy["error"]["code"] == "ExecutionTimeout"
    assert heavy["error"]["category"] == "resource"
    assert heavy["error"]["details"] == {"budget_ms": 100, "clock": "thread_cpu"}
    assert after["status"] == "failed" and after["error"]["code"] == "ExecutionTimeout"  # the request's budget is spent
    rt.budget_ms = 100  # a new request gets a new budget
    assert _op(rt, "DESCRIBE PROTOCOL", "META")["status"] == "succeeded"
    assert _op(rt, _nested_not(2))["status"] == "succeeded"


def test_long_regex_subjects_check_the_budget_before_each_match(rt) -> None:
    """A match on a long subject can cost ~20 ms (a thrashing DFA), far more than a tick: the budget
    is checked before each one, so 8 rows of such matches stop after the first."""
    command = f"FIND(?c) WHERE {{ {CAPSULE} FILTER(REGEX(:s, :re)) }}"
    pattern = "(a|b)*a(a|b){20}c$"
    assert _op(rt, command, s="ac" * 3, re=pattern)["status"] == "succeeded"  # parsed and cached
    rt.budget_ms = 5
    subject = "".join(random.Random(1).choice("ab") for _ in range(60000)) + "c"
    assert _error(rt, command, s=subject, re=pattern)["code"] == "ExecutionTimeout"


def test_parsing_is_charged_to_the_budget(rt) -> None:
    """Parsing cannot be interrupted, but a long command's parse time counts before anything runs."""
    rt.budget_ms = 5
    names = ", ".join(f'"name {i}"' for i in range(6000))
    error = _error(rt, f"FIND(?c) WHERE {{ {CAPSULE} FILTER(IN(?c.name, [{names}])) }}")
    assert error["code"] == "ExecutionTimeout"


def test_budget_is_declared_and_can_be_switched_off(rt) -> None:
    rt.budget_ms = 250
    limits = _op(rt, "DESCRIBE CAPABILITIES", "META")["result"]["limits"]
    assert limits["cpu_budget_ms"] == 250 and limits["max_nesting_depth"] == MAX_NESTING
    rt.budget_ms = None
    assert _op(rt, _nested_not(3))["status"] == "succeeded"


def test_budget_ticks_are_amortised_and_stay_spent() -> None:
    now = [0.0]
    spent = budget.Budget(10, clock=lambda: now[0])
    for _ in range(budget.STRIDE * 3):
        spent.tick()  # the clock has not moved: no error
    now[0] = 0.011
    with pytest.raises(Exception) as info:
        for _ in range(budget.STRIDE):
            spent.tick()
    assert getattr(info.value, "code", None) == "ExecutionTimeout"
    with pytest.raises(Exception):
        spent.tick()  # the very next tick fails again
    assert budget.current() is budget.UNLIMITED


# ----------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def data_dir(log, tmp_path_factory):
    return log.relay_data(tmp_path_factory.mktemp("kql-hardening"))


def _cli(data_dir, capsys, *args: str) -> tuple[int, str]:
    from .fixtures import ORIGIN

    code = main([*args, "--data", str(data_dir), "--origin", ORIGIN])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.err


@pytest.mark.parametrize("shape", ["optional", "not", "object_literal", "array_literal", "and_chain"])
def test_cli_kql_answers_deep_commands_with_the_kip_error(data_dir, capsys, shape: str) -> None:
    size, build = SHAPES[shape]
    code, err = _cli(data_dir, capsys, "kql", build(size))
    assert code == 1 and "akrelay kql: ResourceExhausted" in err and "nests deeper" in err


def test_cli_kql_budget_and_regex(data_dir, capsys) -> None:
    code, err = _cli(data_dir, capsys, "kql", _nested_not(6), "--budget-ms", "100")
    assert code == 1 and "ExecutionTimeout" in err
    code, _ = _cli(data_dir, capsys, "kql", f'FIND(?c) WHERE {{ {CAPSULE} FILTER(REGEX(:s, "^(a|a){{1,27}}c")) }}',
                   "--param", "s=" + "a" * 200)
    assert code == 0
    code, err = _cli(data_dir, capsys, "kip", "DESCRIBE ACCESS WITH " + "{a: " * 300 + "1" + "}" * 300)
    assert code == 1


def test_cli_params_are_strict_ijson(data_dir, capsys) -> None:
    with pytest.raises(SystemExit, match="duplicate member"):
        main(["kql", f"FIND(?c) WHERE {{ {CAPSULE} }}", "--param", 'p={"a": 1, "a": 2}', "--data", str(data_dir)])
    with pytest.raises(SystemExit, match="nesting too deep"):
        main(["kql", f"FIND(?c) WHERE {{ {CAPSULE} }}", "--param", "p=" + "[" * 5000 + "]" * 5000,
              "--data", str(data_dir)])
