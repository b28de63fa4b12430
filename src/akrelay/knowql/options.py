"""``akrelay serve`` options of the KnowQL gateway (one ``option`` call each)."""

from __future__ import annotations

from dataclasses import dataclass

from akrelay.optionkit import _positive_int, _rate, _str, option, setting


def _contexts_file(text: object) -> str:
    """The contexts file's path; its content is checked by the KnowQL component (``akrelay.node.check_components``) at startup."""
    return _str(text)


option("knowql_contexts", _contexts_file, "",
       "KnowQL contexts file (JSON, see docs/knowql.md); the built-in context `knowledge` is always there",
       metavar="FILE")
option("knowql_llm_base_url", _str, "",
       "OpenAI-compatible endpoint for the optional KnowQL LLM composer, e.g. https://api.example.com/v1 "
       "(key from env AKRELAY_KNOWQL_LLM_API_KEY)", metavar="URL")
option("knowql_llm_model", _str, "", "model name sent to --knowql-llm-base-url", metavar="NAME")
option("knowql_llm_timeout", _positive_int, 60, "seconds one LLM composer request may take at most", metavar="S")
option("knowql_llm_max_tokens", _positive_int, 1024, "max_tokens sent with every LLM composer request", metavar="N")
option("knowql_llm_max_chars", _positive_int, 100_000,
       "longest LLM composer answer kept, in characters; a longer one fails the turn", metavar="N")
option("knowql_rate", _rate, 10.0,
       "KnowQL turns (POST /query) per second per client IP, shared in Redis with --store (0 disables)",
       metavar="RPS", serve_only=True)
option("knowql_burst", _positive_int, 20, "token-bucket burst for KnowQL turns per client IP", metavar="N",
       serve_only=True)
option("knowql_inflight", _positive_int, 4, "KnowQL turns one client IP may have in progress per worker (429 past it)",
       metavar="N")
option("knowql_queue", _positive_int, 32,
       "KnowQL turns a worker queues beyond its running ones (503 with Retry-After past it)", metavar="N")
option("knowql_tails", _positive_int, 8, "KnowQL event streams one client IP may hold open per worker (429 past it)",
       metavar="N")


@dataclass(frozen=True, slots=True)
class KnowqlSettings:
    """The KnowQL gateway's settings (``settings.knowql``)."""

    contexts: str = setting("knowql_contexts")
    llm_base_url: str = setting("knowql_llm_base_url")
    llm_model: str = setting("knowql_llm_model")
    llm_timeout: int = setting("knowql_llm_timeout")
    llm_max_tokens: int = setting("knowql_llm_max_tokens")
    llm_max_chars: int = setting("knowql_llm_max_chars")
    rate: float = setting("knowql_rate")
    burst: int = setting("knowql_burst")
    inflight: int = setting("knowql_inflight")
    queue: int = setting("knowql_queue")
    tails: int = setting("knowql_tails")
