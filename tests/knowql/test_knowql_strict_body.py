"""``POST /query`` parses its body by the strict JSON rules of every other endpoint (I-JSON).

UTF-16, a byte order mark, duplicate member names (which would let two parsers
read two different questions), NaN and out-of-range integers are a 400
``bad_request`` in the KnowQL error format, naming the defect.
"""

from __future__ import annotations

import pytest

from tests.knowql.kq_harness import knowql_app

GOOD = '{"ask": "what fills the disk?", "scope": ["knowledge"], "retrieval_only": true}'


@pytest.fixture(scope="module")
def kq(tmp_path_factory):
    with knowql_app(tmp_path_factory.mktemp("kq")) as kq:
        yield kq


@pytest.mark.parametrize(("body", "defect"), [
    (GOOD.encode("utf-16"), "not valid UTF-8"),
    (GOOD.encode("utf-16-le"), "invalid JSON"),  # NUL bytes are UTF-8; the text is no JSON
    (b"\xef\xbb\xbf" + GOOD.encode(), "byte order mark"),
    (b'{"ask": "first", "ask": "second", "scope": ["knowledge"], "retrieval_only": true}', "duplicate"),
    (b'{"ask": "x", "scope": ["knowledge"], "retrieval_only": true, "vars": {"n": NaN}}', "invalid JSON"),
    (b'{"ask": "x", "scope": ["knowledge"], "retrieval_only": true, "max_output_tokens": 9007199254740993}',
     "invalid JSON"),
    (b'{"ask": "\\ud800", "scope": ["knowledge"], "retrieval_only": true}', "surrogate"),
])
def test_a_body_that_is_not_strict_json_is_bad_request(kq, body, defect) -> None:
    r = kq.ask(body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "bad_request"
    assert error["message"].startswith("the body is not strict JSON: ") and defect in error["message"]


def test_a_strict_body_is_answered(kq) -> None:
    r = kq.ask(GOOD.encode())
    assert r.status_code == 200 and r.json()["status"] == "completed"
