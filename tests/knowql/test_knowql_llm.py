"""The optional OpenAI-compatible composer, against an endpoint mocked with respx."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import respx

from akrelay.knowql.llm import ChatCompletionsComposer
from akrelay.knowql.models import ComposerError, HistoryEntry, TurnInput
from akrelay.knowql.retrieval import Retrieval

from .conftest import validator
from .kq_harness import knowql_app

BASE = "https://llm.example.test/v1"
A = "A" * 43
B = "B" * 43
INVENTED = "Z" * 43


def _retrieval() -> Retrieval:
    artifacts = [
        {"id": "c1.3", "source": A, "type": "KnowledgeCapsule", "name": "Cache clears", "kind": "observation",
         "text": "Restart clears the cache.", "context": ["knowledge"], "score": 2.0, "seq": 1,
         "url": f"https://r/v1/knowledge/events/{A}",
         "belief": {"status": "accepted", "leading": "support", "supporting": 1, "rejecting": 0, "reasons": [],
                    "policy": "akrelay:corroborated", "snapshot_seq": 3}},
        {"id": "c2.3", "source": B, "type": "KnowledgeCapsule", "name": "Cache persists", "kind": "hypothesis",
         "text": "The cache persists.", "context": ["knowledge"], "score": 1.0, "seq": 2,
         "url": f"https://r/v1/knowledge/events/{B}",
         "belief": {"status": "rejected", "leading": "opposition", "supporting": 0, "rejecting": 1, "reasons": [],
                    "policy": "akrelay:corroborated", "snapshot_seq": 3}},
    ]
    return Retrieval(3, 3, "akrelay:corroborated", ["cache?"], "cache", [], artifacts)


def _turn(shape=None, seconds: float = 30.0) -> TurnInput:
    return TurnInput("What happens to the cache?", (HistoryEntry("earlier ask", "earlier answer", ()),), "Be brief.",
                     "No guesses.", shape, time.time() + seconds)


def _sse(*deltas: str, usage: dict | None = None) -> str:
    chunks = [{"choices": [{"delta": {"content": d}}]} for d in deltas]
    if usage:
        chunks.append({"choices": [], "usage": usage})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def _reply(content: str, usage: dict | None = None) -> dict:
    return {"choices": [{"message": {"role": "assistant", "content": content}}],
            "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


@respx.mock
def test_streamed_answer_keeps_only_citations_in_the_retrieved_set() -> None:
    route = respx.post(f"{BASE}/chat/completions").mock(return_value=httpx.Response(
        200, content=_sse("The cache is cleared ", f"[{A}]; it does not persist [{B}] ", f"nor [{INVENTED}].",
                          usage={"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}).encode(),
        headers={"content-type": "text/event-stream"}))
    composer = ChatCompletionsComposer(BASE, "m-1", "secret")
    deltas: list[str] = []
    result = composer.compose(_turn(), _retrieval(), deltas.append)
    assert "".join(deltas) == result.text and len(deltas) == 3
    assert [c["source"] for c in result.citations] == [A, B]
    assert result.citations[1]["belief"] == "rejected"
    assert result.usage == {"input_tokens": 120, "output_tokens": 30, "total_tokens": 150}
    sent = json.loads(route.calls[0].request.content)
    assert route.calls[0].request.headers["authorization"] == "Bearer secret"
    assert sent["model"] == "m-1" and sent["stream"] is True
    assert "Be brief." in sent["messages"][0]["content"] and "No guesses." in sent["messages"][0]["content"]
    assert sent["messages"][1:3] == [{"role": "user", "content": "earlier ask"},
                                     {"role": "assistant", "content": "earlier answer"}]
    assert A in sent["messages"][-1]["content"] and "rejected" in sent["messages"][-1]["content"]


@respx.mock
def test_shape_output_is_validated_with_one_retry() -> None:
    shape = {"type": "object", "properties": {"cleared": {"type": "boolean"}, "sources": {"type": "array"}},
             "required": ["cleared"]}
    route = respx.post(f"{BASE}/chat/completions").mock(side_effect=[
        httpx.Response(200, json=_reply('{"cleared": "yes"}')),
        httpx.Response(200, json=_reply(json.dumps({"cleared": True, "sources": [A, INVENTED]}))),
    ])
    result = ChatCompletionsComposer(BASE, "m-1", None).compose(_turn(shape), _retrieval(), lambda d: None)
    assert result.output_json == {"cleared": True, "sources": [A, INVENTED]}
    assert [c["source"] for c in result.citations] == [A]
    assert result.usage["total_tokens"] == 30 and len(route.calls) == 2
    assert "does not validate" in json.loads(route.calls[1].request.content)["messages"][-1]["content"]


@respx.mock
def test_invalid_shape_output_twice_fails() -> None:
    respx.post(f"{BASE}/chat/completions").mock(side_effect=[
        httpx.Response(200, json=_reply("not json")), httpx.Response(200, json=_reply('{"other": 1}'))])
    shape = {"type": "object", "required": ["cleared"]}
    with pytest.raises(ComposerError, match="after one retry"):
        ChatCompletionsComposer(BASE, "m-1", None).compose(_turn(shape), _retrieval(), lambda d: None)


@respx.mock
def test_timeout_and_unreachable_endpoint_fail_clearly() -> None:
    route = respx.post(f"{BASE}/chat/completions")
    route.mock(side_effect=httpx.ReadTimeout("slow"))
    with pytest.raises(ComposerError, match="did not answer within 60 s"):
        ChatCompletionsComposer(BASE, "m-1", None).compose(_turn(), _retrieval(), lambda d: None)
    route.mock(side_effect=httpx.ConnectError("refused"))
    with pytest.raises(ComposerError, match="unreachable"):
        ChatCompletionsComposer(BASE, "m-1", None).compose(_turn(), _retrieval(), lambda d: None)
    route.mock(return_value=httpx.Response(500, json={"error": "boom"}))
    with pytest.raises(ComposerError, match="HTTP 500"):
        ChatCompletionsComposer(BASE, "m-1", None).compose(_turn(), _retrieval(), lambda d: None)
    with pytest.raises(ComposerError, match="deadline"):
        ChatCompletionsComposer(BASE, "m-1", None).compose(_turn(seconds=-1), _retrieval(), lambda d: None)


def test_configured_llm_is_listed_and_answers_through_the_app(monkeypatch) -> None:
    monkeypatch.setenv("AKRELAY_KNOWQL_LLM_API_KEY", "k")
    with respx.mock(assert_all_called=False) as mock:
        with knowql_app(knowql_llm_base_url=BASE, knowql_llm_model="m-1") as kq:
            c = kq.corpus
            capsule = c.publish("alice", "Cache clears on restart", "Restart clears the cache.")
            kq.submit(capsule)
            mock.post(f"{BASE}/chat/completions").mock(return_value=httpx.Response(
                200, content=_sse("Cleared ", f"[{capsule['hash']}] [{INVENTED}]").encode(),
                headers={"content-type": "text/event-stream"}))
            catalog = kq.client.get("/models").json()
            validator("ModelCatalog").validate(catalog)
            assert catalog["tiers"]["standard"] == "openai-compatible/m-1"
            assert catalog["tiers"]["lite"] == "akrelay/extractive-1"
            doc = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "model": "standard"}).json()
            validator("Query").validate(doc)
            assert doc["status"] == "completed" and doc["model"] == "openai-compatible/m-1"
            assert [c["source"] for c in doc["citations"]] == [capsule["hash"]]
            mock.post(f"{BASE}/chat/completions").mock(side_effect=httpx.ConnectError("down"))
            failed = kq.ask({"ask": "cache restart", "scope": ["knowledge"], "model": "pro"}).json()
            assert failed["status"] == "failed" and "unreachable" in failed["error"]
            # The default stays extractive: the LLM is never required.
            assert kq.ask({"ask": "cache", "scope": ["knowledge"]}).json()["model"] == "akrelay/extractive-1"
