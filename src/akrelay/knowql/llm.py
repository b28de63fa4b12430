"""The optional OpenAI-compatible chat-completions composer (configured by options)."""

from __future__ import annotations

from typing import Any


def llm_entry(settings: Any) -> Any:
    return None
