"""A hostile ``shape`` costs bounded work: refused when checked, or abandoned by the step budget (issue 24, 1-2)."""

from __future__ import annotations

import threading

import pytest

from akrelay.knowql import shape as shape_module
from akrelay.knowql.errors import KnowqlError
from akrelay.knowql.shape import ShapeBudgetExceeded, check_shape, problems

from .kq_harness import knowql_app


def fan_out(levels: int) -> dict:
    """A chain of $defs, each an anyOf of two $refs to the next, ending in {"not": {}}: 2^levels paths."""
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(levels)}
    defs[f"d{levels}"] = {"not": {}}
    return {"type": "object", "$defs": defs, "properties": {"answer": {"$ref": "#/$defs/d0"}}}


@pytest.mark.parametrize("levels", [18, 30])
def test_a_fanning_out_shape_is_refused_when_checked(levels: int) -> None:
    with pytest.raises(KnowqlError) as caught:
        check_shape(fan_out(levels))
    assert caught.value.status == 400 and "fan out" in caught.value.message


@pytest.mark.parametrize("levels", [18, 30])
def test_a_fanning_out_shape_answers_400_over_http(levels: int) -> None:
    with knowql_app() as kq:
        r = kq.ask({"ask": "cache", "scope": ["knowledge"], "shape": fan_out(levels), "timeout_seconds": 2})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "bad_request" and "fan out" in r.json()["error"]["message"]


def test_a_small_fan_out_is_still_served() -> None:
    check_shape(fan_out(6))  # 64 paths: cheap, and legitimate schemas do share $defs


def test_recursion_driven_by_the_instance_stops_at_the_step_budget() -> None:
    # Passes the check (the recursion is counted once) but doubles per level of the instance.
    branch = {"type": "array", "items": {"$ref": "#/$defs/a"}}
    shape = {"type": "object", "$defs": {"a": {"anyOf": [branch, dict(branch), {"not": {}}]}},
             "properties": {"v": {"$ref": "#/$defs/a"}}}
    check_shape(shape)
    value: object = "leaf"  # fails every branch, so each level tries both
    for _ in range(40):
        value = [value]
    with pytest.raises(ShapeBudgetExceeded, match="steps"):
        problems({"v": value}, shape, steps=5_000)


def test_validation_stops_at_the_deadline() -> None:
    shape = {"type": "object", "properties": {"v": {"type": "array", "items": {"type": "string"}}}}
    with pytest.raises(ShapeBudgetExceeded, match="deadline"):
        problems({"v": ["x"] * 5_000}, shape, deadline=0.0)  # long past


@pytest.mark.parametrize("shape, words", [
    ({"type": "object", "allOf": [{}] * 15_000}, "array of 15000 items"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)}}, "objects"),
    ({"type": "object", "enum": [[0] * 200] * 30}, "JSON nodes"),
])
def test_item_caps_refuse_a_large_shape_with_400(shape: dict, words: str) -> None:
    with knowql_app() as kq:
        r = kq.ask({"ask": "cache", "scope": ["knowledge"], "shape": shape})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "bad_request" and words in r.json()["error"]["message"]


def test_healthz_answers_while_a_shape_is_being_checked(monkeypatch) -> None:
    entered, gate = threading.Event(), threading.Event()
    state = {"finished": False}
    real = shape_module.check_shape

    def slow_check(shape: dict) -> None:
        entered.set()
        gate.wait(120)  # released by the test as soon as /healthz answered
        state["finished"] = True
        real(shape)

    monkeypatch.setattr(shape_module, "check_shape", slow_check)
    with knowql_app() as kq:
        results: list = []
        asker = threading.Thread(target=lambda: results.append(
            kq.ask({"ask": "cache", "scope": ["knowledge"], "shape": {"type": "object"}})))
        asker.start()
        try:
            assert entered.wait(60)
            health = kq.client.get("/healthz")
            still_checking = not state["finished"]
        finally:
            gate.set()
            asker.join(120)
        assert health.status_code == 200
        assert still_checking, "/healthz waited for the shape check (it ran on the event loop)"
        assert results and results[0].status_code == 200, results
