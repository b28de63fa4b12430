"""The option machinery, below the settings and every area's ``options`` module.

``akrelay.settings`` resolves options; each area declares its own with
:func:`option` in its ``options`` module, which imports only this module, so
that the settings can import those modules without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

ENV_PREFIX = "AKRELAY_"


def _positive_int(text: Any) -> int:
    value = _int(text)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def _int(text: Any) -> int:
    if isinstance(text, bool):
        raise ValueError("must be an integer")
    if isinstance(text, int):
        return text
    if not isinstance(text, str) or not text.strip().isdigit():
        raise ValueError("must be a decimal integer")
    return int(text.strip())


def _rate(text: Any) -> float:
    if isinstance(text, bool):
        raise ValueError("must be a number")
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be a finite number >= 0 (0 disables the limit)")
    return value


def _seconds(text: Any) -> float:
    if isinstance(text, bool):
        raise ValueError("must be a number of seconds")
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError("must be a positive, finite number of seconds")
    return value


def _port(text: Any) -> int:
    value = _int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be a TCP port (0-65535)")
    return value


def _str(text: Any) -> str:
    if not isinstance(text, str):
        raise ValueError("must be a string")
    return text


def _bool(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    if isinstance(text, str) and text.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(text, str) and text.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be a boolean (true/false)")


@dataclass(frozen=True)
class Option:
    """One setting: its name, parser, default and help text.

    ``kind`` is ``"value"`` (one value), ``"flag"`` (boolean switch) or
    ``"list"`` (zero or more values; whitespace-separated in the environment).
    ``serve_only`` marks what only the HTTP server reads (listener, TLS, rates),
    so that ``akrelay sync`` does not offer it.
    """

    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    kind: str = "value"
    metavar: str | None = None
    serve_only: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


#: Every serve option, in help order. Extend with :func:`option`.
OPTIONS: dict[str, Option] = {}

def option(name: str, parse: Callable[[Any], Any], default: Any, help: str, *,
           kind: str = "value", metavar: str | None = None, serve_only: bool = False) -> Option:
    """Declare a serve option (a one-line change for any area)."""
    if kind not in ("value", "flag", "list"):
        raise ValueError(f"unknown option kind {kind!r}")
    opt = Option(name, parse, default, help, kind, metavar, serve_only)
    OPTIONS[name] = opt
    return opt
