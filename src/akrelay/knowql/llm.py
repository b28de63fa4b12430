"""The optional composer for any OpenAI-compatible chat-completions endpoint.

Configured by ``--knowql-llm-base-url`` and ``--knowql-llm-model``; the key is
read from the environment (``AKRELAY_KNOWQL_LLM_API_KEY``), never from a
setting that could be logged. It is never required: without the options the
catalog holds only the extractive composer.

The model receives the retrieved capsules and passages with their event IDs
and belief statuses and is asked to cite IDs in square brackets; only IDs that
lie in the turn's retrieved set become citations (an invented one is dropped).
Free-form answers stream as deltas; with a ``shape`` the reply must be JSON
that validates, with one retry; a second failure fails the turn.

Every request is bounded from outside the read: a watchdog shuts the socket at
the turn's deadline, so an upstream that sends keep-alives but no text cannot
hold a turn thread past it. Replies are read raw (``Accept-Encoding:
identity``), a line and an answer at a time under caps, so no upstream can
make a worker store or buffer more than ``--knowql-llm-max-chars``; and every
request asks for at most ``--knowql-llm-max-tokens`` tokens.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

import httpx

from akrelay.jsontypes import JSONObject
from akrelay.knowql.compose import Composition, citation
from akrelay.knowql.models import ComposerError, ModelEntry, TurnInput
from akrelay.knowql.retrieval import Retrieval
from akrelay.knowql.shape import problems

if TYPE_CHECKING:
    from akrelay.settings import Settings

API_KEY_ENV = "AKRELAY_KNOWQL_LLM_API_KEY"
PROVIDER = "openai-compatible"
#: Event IDs are 43 base64url characters (a SHA-256 digest).
_CITED = re.compile(r"\[([A-Za-z0-9_-]{43})\]")
_ID = re.compile(r"(?<![A-Za-z0-9_-])([A-Za-z0-9_-]{43})(?![A-Za-z0-9_-])")
MAX_ITEMS = 12
MAX_ITEM_CHARS = 1200
#: Defaults of ``--knowql-llm-max-tokens`` and ``--knowql-llm-max-chars``.
MAX_TOKENS = 1024
MAX_ANSWER_CHARS = 100_000
#: Longest stream line read (one SSE ``data:`` chunk); a longer one fails the turn.
MAX_LINE_BYTES = 1 << 16

SYSTEM = (
    "You answer questions using only the knowledge items provided. Each item has an event ID and a belief "
    "status computed by the relay (accepted, contested, uncertain, insufficient, rejected). State accepted "
    "items as findings; say how contested items are disputed; call uncertain or insufficient items "
    "unconfirmed; never state a rejected item as fact. Cite every statement with the event ID of its item "
    "in square brackets, e.g. [ID]. If nothing answers the question, say so."
)


def llm_entry(settings: Settings | None, *, transport: httpx.BaseTransport | None = None) -> ModelEntry | None:
    if settings is None:
        return None
    base, model = settings.knowql.llm_base_url, settings.knowql.llm_model
    if not base or not model:
        return None
    composer = ChatCompletionsComposer(base, model, os.environ.get(API_KEY_ENV),
                                       timeout=float(settings.knowql.llm_timeout),
                                       max_tokens=int(settings.knowql.llm_max_tokens),
                                       max_chars=int(settings.knowql.llm_max_chars),
                                       transport=transport)
    return ModelEntry(composer.id, f"{model} (OpenAI-compatible)", PROVIDER, composer)


def _sources(retrieval: Retrieval) -> dict[str, JSONObject]:
    """Citable event IDs of the retrieved set, each with its citation object."""
    out: dict[str, JSONObject] = {}
    for artifact in retrieval.artifacts:
        out[artifact["source"]] = citation(artifact)
    for chunk in retrieval.chunks:
        out.setdefault(chunk["source"], {"source": chunk["source"], "kind": chunk["kind"], "title": chunk["title"],
                                         "url": chunk["url"], "context": list(chunk["context"])})
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
                 max_tokens: int = MAX_TOKENS, max_chars: int = MAX_ANSWER_CHARS,
                 transport: httpx.BaseTransport | None = None, clock: Callable[[], float] = time.time) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.id = f"{PROVIDER}/{model}"
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.max_chars = max_chars
        self.clock = clock
        # identity: the caps count the bytes the upstream sends, not what a gzip body inflates to
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
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

    def _call(self, body: Mapping[str, object], turn: TurnInput) -> httpx.Response:
        """The streamed 200 response to ``body`` (the caller reads it under a :class:`_Watchdog`)."""
        body = {**body, "max_tokens": self.max_tokens}
        try:
            request = self._http.build_request("POST", self.url, json=body, timeout=self._timeout(turn))
            response = self._http.send(request, stream=True)
        except httpx.TimeoutException:
            raise ComposerError(f"the model endpoint did not answer within {self._timeout_text(turn)}") from None
        except httpx.HTTPError as exc:
            raise ComposerError(f"the model endpoint is unreachable: {type(exc).__name__}") from None
        if response.status_code != 200:
            response.close()
            raise ComposerError(f"the model endpoint answered HTTP {response.status_code}")
        coding = response.headers.get("content-encoding", "identity").strip().lower()
        if coding not in ("", "identity"):
            response.close()
            raise ComposerError(f"the model endpoint used a content coding it was not asked for ({coding[:32]!r})")
        return response

    def _lines(self, response: httpx.Response, watchdog: "_Watchdog") -> Iterator[str]:
        """The response's lines, each at most :data:`MAX_LINE_BYTES`, until the deadline."""
        buffer = b""
        for chunk in response.iter_raw():
            watchdog.check()
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r").decode("utf-8", "replace")
            if len(buffer) > MAX_LINE_BYTES:
                raise ComposerError(f"the model endpoint sent a line longer than {MAX_LINE_BYTES} bytes")
        watchdog.check()
        if buffer:
            yield buffer.decode("utf-8", "replace")

    def _body(self, response: httpx.Response, watchdog: "_Watchdog") -> bytes:
        """A whole non-streamed reply, at most the answer cap (plus room for the JSON around it)."""
        limit = 4 * self.max_chars + MAX_LINE_BYTES
        parts, size = [], 0
        for chunk in response.iter_raw():
            watchdog.check()
            size += len(chunk)
            if size > limit:
                raise ComposerError(f"the model's answer is longer than {self.max_chars} characters")
            parts.append(chunk)
        watchdog.check()
        return b"".join(parts)

    def _timeout_text(self, turn: TurnInput) -> str:
        return f"{self.timeout:g} s" if turn.deadline - self.clock() > 0 else "the turn's deadline"

    def _stream(self, messages: list[dict[str, str]], emit: Callable[[str], None],
                turn: TurnInput) -> tuple[str, dict[str, int]]:
        body = {"model": self.model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}}
        response = self._call(body, turn)
        parts: list[str] = []
        size = 0
        usage: dict[str, int] = {}
        with self._guarded(response, turn, "stream") as watchdog:
            for line in self._lines(response, watchdog):
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
                        size += len(delta)
                        if size > self.max_chars:
                            raise ComposerError(f"the model's answer is longer than {self.max_chars} characters")
                        parts.append(delta)
                        emit(delta)
        return "".join(parts), usage

    @contextmanager
    def _guarded(self, response: httpx.Response, turn: TurnInput, what: str) -> Iterator[_Watchdog]:
        """Read ``response`` under the turn's watchdog; a stall or a broken read is the composer's error."""
        watchdog = _Watchdog(response, turn.deadline, self.clock)
        try:
            yield watchdog
        except httpx.TimeoutException:
            raise ComposerError(f"the model endpoint stalled beyond {self._timeout_text(turn)}") from None
        except httpx.HTTPError as exc:
            watchdog.check()
            raise ComposerError(f"the model endpoint's {what} broke: {type(exc).__name__}") from None
        finally:
            watchdog.stop()
            response.close()

    def _shaped(self, messages: list[dict[str, str]], turn: TurnInput,
                sources: dict[str, JSONObject]) -> Composition:
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
            response = self._call(body, turn)
            with self._guarded(response, turn, "reply") as watchdog:
                raw = self._body(response, watchdog)
            try:
                reply = json.loads(raw)
                text = reply["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise ComposerError("the model endpoint's reply has no message content") from None
            if isinstance(text, str) and len(text) > self.max_chars:
                raise ComposerError(f"the model's answer is longer than {self.max_chars} characters")
            for key, count in _usage(reply.get("usage")).items():
                total[key] += count
            try:
                value = json.loads(text) if isinstance(text, str) else None
            except ValueError:
                value = None
            found = ["the reply is not a JSON object"] if not isinstance(value, dict) else problems(value, turn.shape,
                                                                                             deadline=turn.deadline)
            if not found:
                return Composition("", [], self._cited(text, sources, _ID), output_json=value, usage=total, model=self.id)
            ask = ask + [{"role": "assistant", "content": str(text)},
                         {"role": "user", "content": "That reply does not validate: " + "; ".join(found) +
                          ". Reply again with JSON only."}]
        raise ComposerError("the model's output does not conform to the shape after one retry: " + "; ".join(found))

    @staticmethod
    def _cited(text: str, sources: dict[str, JSONObject], pattern: re.Pattern[str] = _CITED) -> list[JSONObject]:
        """Citations for the IDs the model cited that lie in the retrieved set, in order of first use."""
        out = []
        for event_id in dict.fromkeys(pattern.findall(text)):
            if event_id in sources:
                out.append(sources[event_id])
        return out


class _Watchdog:
    """Shuts the response's socket at ``deadline``: a read blocked on a silent or trickling upstream wakes."""

    def __init__(self, response: httpx.Response, deadline: float, clock: Callable[[], float]) -> None:
        self.deadline, self.clock, self.fired = deadline, clock, False
        self._response = response
        self._timer = threading.Timer(max(0.0, deadline - clock()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        stream = self._response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in another thread; close() would not
            else:
                self._response.close()
        except (OSError, RuntimeError):  # already closed
            pass

    def check(self) -> None:
        """:class:`ComposerError` once the deadline has passed (between reads)."""
        if self.fired or self.clock() >= self.deadline:
            raise ComposerError("the model endpoint did not finish by the turn's deadline")

    def stop(self) -> None:
        self._timer.cancel()


def _usage(raw: object) -> dict[str, int]:
    if not isinstance(raw, dict):
        return {}
    def number(name: str) -> int:
        value = raw.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
    inp, out = number("prompt_tokens"), number("completion_tokens")
    return {"input_tokens": inp, "output_tokens": out, "total_tokens": number("total_tokens") or inp + out}
