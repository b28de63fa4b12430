"""The LLM composer is bounded by the turn's deadline and by size (issue 24, item 5).

A fake upstream on 127.0.0.1 (a free port) sends keep-alives but no text, or an endless
answer; the composer must give up at the deadline, cap the answer, and send ``max_tokens``.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from akrelay.knowql.llm import ChatCompletionsComposer
from akrelay.knowql.models import ComposerError, TurnInput

from .test_knowql_llm import _retrieval

#: How long the fake upstream keeps a reply going; far beyond every deadline used here.
UPSTREAM_SECONDS = 60.0


class Upstream:
    """A chat-completions endpoint whose reply is ``mode``: ``keepalive``, ``endless`` or ``big``."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.bodies: list[dict[str, Any]] = []
        self.disconnected = threading.Event()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                upstream.bodies.append(body)
                stream = body.get("stream")
                self.send_response(200)
                self.send_header("content-type", "text/event-stream" if stream else "application/json")
                if not stream:
                    text = "x" * 300_000
                    payload = json.dumps({"choices": [{"message": {"content": text}}]}).encode()
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.end_headers()
                end = time.monotonic() + UPSTREAM_SECONDS
                try:
                    while time.monotonic() < end:
                        if upstream.mode == "keepalive":
                            self.wfile.write(b": keep-alive\n\n")
                            self.wfile.flush()
                            time.sleep(0.05)
                        elif upstream.mode == "trickle":  # one byte at a time, never a whole line
                            self.wfile.write(b":")
                            self.wfile.flush()
                            time.sleep(0.05)
                        else:
                            chunk = {"choices": [{"delta": {"content": "y" * 4096}}]}
                            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                except OSError:
                    upstream.disconnected.set()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream(request) -> Iterator[Upstream]:
    server = Upstream(request.param)
    try:
        yield server
    finally:
        server.close()


def _turn(seconds: float, shape: dict | None = None) -> TurnInput:
    return TurnInput("What happens to the cache?", (), None, None, shape, time.time() + seconds)


@pytest.mark.parametrize("upstream", ["keepalive", "trickle"], indirect=True)
def test_keepalives_without_text_end_at_the_turns_deadline(upstream: Upstream) -> None:
    composer = ChatCompletionsComposer(upstream.base, "m-1", None, timeout=UPSTREAM_SECONDS)
    started = time.monotonic()
    with pytest.raises(ComposerError, match="deadline"):
        composer.compose(_turn(1.0), _retrieval(), lambda delta: None)
    # The reply would go on for a minute: the composer stopped at its 1 s deadline instead.
    assert time.monotonic() - started < UPSTREAM_SECONDS / 2


@pytest.mark.parametrize("upstream", ["endless"], indirect=True)
def test_an_endless_answer_is_capped_and_max_tokens_is_sent(upstream: Upstream) -> None:
    composer = ChatCompletionsComposer(upstream.base, "m-1", None, max_tokens=77, max_chars=50_000)
    seen: list[str] = []
    with pytest.raises(ComposerError, match="longer than 50000 characters"):
        composer.compose(_turn(UPSTREAM_SECONDS), _retrieval(), seen.append)
    assert sum(map(len, seen)) <= 50_000
    assert upstream.bodies[0]["max_tokens"] == 77


@pytest.mark.parametrize("upstream", ["big"], indirect=True)
def test_a_large_shaped_reply_is_refused(upstream: Upstream) -> None:
    composer = ChatCompletionsComposer(upstream.base, "m-1", None, max_chars=10_000)
    with pytest.raises(ComposerError, match="longer than 10000 characters"):
        composer.compose(_turn(UPSTREAM_SECONDS, {"type": "object"}), _retrieval(), lambda delta: None)
    assert upstream.bodies[0]["max_tokens"] == 1024
