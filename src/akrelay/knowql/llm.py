"""The optional composer for any OpenAI-compatible chat-completions endpoint.

Configured by ``--knowql-llm-base-url`` and ``--knowql-llm-model``; the key is
read from the environment (``AKRELAY_KNOWQL_LLM_API_KEY``), never from a
setting that could be logged. It is never required: without the options the
catalog holds only the extractive composer.

The model receives the retrieved capsules and passages with their event IDs
and belief statuses and is asked to cite IDs in square brackets; only IDs that
lie in the turn's retrieved set become citations (an invented one is dropped).
Free-form answers stream as deltas; with a ``shape`` the reply must be JSON
that validates, with one retry; a second failure fails the turn. Every request
is bounded by the turn's remaining deadline.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Callable

import httpx

from akrelay.knowql.compose import Composition, citation
from akrelay.knowql.models import ComposerError, ModelEntry, TurnInput
from akrelay.knowql.retrieval import Retrieval
from akrelay.knowql.shape import problems

API_KEY_ENV = "AKRELAY_KNOWQL_LLM_API_KEY"
PROVIDER = "openai-compatible"
#: Event IDs are 43 base64url characters (a SHA-256 digest).
_CITED = re.compile(r"\[([A-Za-z0-9_-]{43})\]")
_ID = re.compile(r"(?<![A-Za-z0-9_-])([A-Za-z0-9_-]{43})(?![A-Za-z0-9_-])")
MAX_ITEMS = 12
MAX_ITEM_CHARS = 1200

SYSTEM = (
    "You answer questions using only the knowledge items provided. Each item has an event ID and a belief "
    "status computed by the relay (accepted, contested, uncertain, insufficient, rejected). State accepted "
    "items as findings; say how contested items are disputed; call uncertain or insufficient items "
    "unconfirmed; never state a rejected item as fact. Cite every statement with the event ID of its item "
    "in square brackets, e.g. [ID]. If nothing answers the question, say so."
)


def llm_entry(settings: Any, *, transport: httpx.BaseTransport | None = None) -> ModelEntry | None:
    base = getattr(settings, "knowql_llm_base_url", "") if settings is not None else ""
    model = getattr(settings, "knowql_llm_model", "") if settings is not None else ""
    if not base or not model:
        return None
    composer = ChatCompletionsComposer(base, model, os.environ.get(API_KEY_ENV),
                                       timeout=float(getattr(settings, "knowql_llm_timeout", 60)),
                                       transport=transport)
    return ModelEntry(composer.id, f"{model} (OpenAI-compatible)", PROVIDER, composer)


def _sources(retrieval: Retrieval) -> dict[str, dict[str, Any]]:
    """Citable event IDs of the retrieved set, each with its citation object."""
    out: dict[str, dict[str, Any]] = {}
    for artifact in retrieval.artifacts:
        out[artifact["source"]] = citation(artifact)
    for chunk in retrieval.chunks:
        out.setdefault(chunk["source"], {"source": chunk["source"], "kind": chunk["kind"], "title": chunk["title"],
                                         "url": chunk["url"], "context": chunk["context"]})
    return out


def _knowledge_block(retrieval: Retrieval) -> str:
    if not retrieval.artifacts:
        return "No knowledge item matched the question."
    lines = []
    beliefs = {a["source"]: a["belief"] for a in retrieval.artifacts}
    for artifact in retrieval.artifacts[:MAX_ITEMS]:
        b = artifact["belief"]
        lines.append(f"[{artifact['source']}] capsule ({b['status']}; {b['supporting']} supporting / "
                     f"{b['rejecting']} rejecting assessments) {artifact['name']}: "
                     f"{artifact['text'][:MAX_ITEM_CHARS]}")
    for chunk in retrieval.chunks:
        if chunk["kind"] == "assessment" and chunk["capsule"] in beliefs:
            lines.append(f"[{chunk['source']}] assessment ({chunk.get('verdict')}) of [{chunk['capsule']}]: "
                         f"{chunk['text'][:MAX_ITEM_CHARS]}")
    return "\n".join(lines)


def messages_for(turn: TurnInput, retrieval: Retrieval) -> list[dict[str, str]]:
    system = SYSTEM
    if turn.system_prompt:
        system += "\n\nOperator instructions:\n" + turn.system_prompt
    if turn.guardrails:
        system += "\n\nGuardrails (always obey):\n" + turn.guardrails
    messages = [{"role": "system", "content": system}]
    for entry in turn.history[-6:]:
        messages.append({"role": "user", "content": entry.ask})
        messages.append({"role": "assistant", "content": entry.answer})
    messages.append({"role": "user", "content": f"Knowledge items:\n{_knowledge_block(retrieval)}\n\n"
                                                f"Question: {turn.ask}"})
    return messages


class ChatCompletionsComposer:
    def __init__(self, base_url: str, model: str, api_key: str | None, *, timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None, clock: Callable[[], float] = time.time) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.id = f"{PROVIDER}/{model}"
        self.timeout = timeout
        self.clock = clock
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(headers=headers, transport=transport, follow_redirects=False)

    def compose(self, turn: TurnInput, retrieval: Retrieval, emit: Callable[[str], None]) -> Composition:
        messages = messages_for(turn, retrieval)
        sources = _sources(retrieval)
        if turn.shape is None:
            text, usage = self._stream(messages, emit, turn)
            return Composition(text, [], self._cited(text, sources), usage=usage, model=self.id)
        return self._shaped(messages, turn, sources)

    # ---- requests ---------------------------------------------------------------------------

    def _timeout(self, turn: TurnInput) -> float:
        remaining = turn.deadline - self.clock()
        if remaining <= 0:
            raise ComposerError("the turn's deadline passed before the model was asked")
        return min(self.timeout, remaining)

    def _call(self, body: dict[str, Any], turn: TurnInput, stream: bool) -> Any:
        try:
            request = self._http.build_request("POST", self.url, json=body, timeout=self._timeout(turn))
            response = self._http.send(request, stream=stream)
        except httpx.TimeoutException:
            raise ComposerError(f"the model endpoint did not answer within {self._timeout_text(turn)}") from None
        except httpx.HTTPError as exc:
            raise ComposerError(f"the model endpoint is unreachable: {type(exc).__name__}") from None
        if response.status_code != 200:
            response.close()
            raise ComposerError(f"the model endpoint answered HTTP {response.status_code}")
        return response

    def _timeout_text(self, turn: TurnInput) -> str:
        return f"{self.timeout:g} s" if turn.deadline - self.clock() > 0 else "the turn's deadline"

    def _stream(self, messages: list[dict[str, str]], emit: Callable[[str], None],
                turn: TurnInput) -> tuple[str, dict[str, int]]:
        body = {"model": self.model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}}
        response = self._call(body, turn, stream=True)
        parts: list[str] = []
        usage: dict[str, int] = {}
        try:
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise ComposerError("the model endpoint sent a malformed stream chunk") from None
                usage = _usage(chunk.get("usage")) or usage
                for choice in chunk.get("choices") or []:
                    delta = ((choice or {}).get("delta") or {}).get("content")
                    if isinstance(delta, str) and delta:
                        parts.append(delta)
                        emit(delta)
        except httpx.TimeoutException:
            raise ComposerError(f"the model endpoint stalled beyond {self._timeout_text(turn)}") from None
        except httpx.HTTPError as exc:
            raise ComposerError(f"the model endpoint's stream broke: {type(exc).__name__}") from None
        finally:
            response.close()
        return "".join(parts), usage

    def _shaped(self, messages: list[dict[str, str]], turn: TurnInput,
                sources: dict[str, dict[str, Any]]) -> Composition:
        assert turn.shape is not None
        ask = messages[:-1] + [{"role": "user", "content": messages[-1]["content"] +
                                "\n\nReply with one JSON object that validates against this JSON Schema, "
                                "and nothing else:\n" + json.dumps(turn.shape)}]
        total = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        found: list[str] = []
        for _attempt in range(2):
            body = {"model": self.model, "messages": ask, "stream": False,
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "shape", "schema": turn.shape, "strict": False}}}
            response = self._call(body, turn, stream=False)
            try:
                reply = response.json()
                text = reply["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise ComposerError("the model endpoint's reply has no message content") from None
            for key, value in _usage(reply.get("usage")).items():
                total[key] += value
            try:
                value = json.loads(text) if isinstance(text, str) else None
            except ValueError:
                value = None
            found = ["the reply is not a JSON object"] if not isinstance(value, dict) else problems(value, turn.shape)
            if not found:
                return Composition("", [], self._cited(text, sources, _ID), output_json=value, usage=total, model=self.id)
            ask = ask + [{"role": "assistant", "content": str(text)},
                         {"role": "user", "content": "That reply does not validate: " + "; ".join(found) +
                          ". Reply again with JSON only."}]
        raise ComposerError("the model's output does not conform to the shape after one retry: " + "; ".join(found))

    @staticmethod
    def _cited(text: str, sources: dict[str, dict[str, Any]], pattern: re.Pattern[str] = _CITED) -> list[dict[str, Any]]:
        """Citations for the IDs the model cited that lie in the retrieved set, in order of first use."""
        out = []
        for event_id in dict.fromkeys(pattern.findall(text)):
            if event_id in sources:
                out.append(sources[event_id])
        return out


def _usage(raw: Any) -> dict[str, int]:
    if not isinstance(raw, dict):
        return {}
    def number(name: str) -> int:
        value = raw.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
    inp, out = number("prompt_tokens"), number("completion_tokens")
    return {"input_tokens": inp, "output_tokens": out, "total_tokens": number("total_tokens") or inp + out}
