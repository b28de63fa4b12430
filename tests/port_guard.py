"""The suite's guard against fixed ports (tests/README.md, "Tests and flakiness").

A test that listens on a well-known port, or starts ``akrelay serve`` on its default
8443, fails on a machine where something else holds it (another suite, a relay the
developer runs). The conftest applies these checks to every test: a bind in the test
process, and an ``akrelay serve`` command given to :mod:`subprocess`.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

#: Ports a test never binds: the relay's default, Redis's, and the usual HTTP(S) ones.
WELL_KNOWN = frozenset({80, 443, 6379, 8000, 8080, 8443})

ADVICE = "pick a free port (relay_harness.free_port / redis_server.free_port) and pass it on"


def bind_problem(address: Any) -> str | None:
    """Why binding ``address`` (a socket address) is refused in a test, or ``None``."""
    if isinstance(address, tuple) and len(address) >= 2 and isinstance(address[1], int):
        if address[1] in WELL_KNOWN:
            return f"a test binds the well-known port {address[1]}: {ADVICE}"
    return None


def serve_problem(argv: Any, env: Mapping[str, str] | None) -> str | None:
    """Why running ``argv`` is refused in a test (``akrelay serve`` on its default port), or ``None``."""
    if isinstance(argv, (str, bytes, os.PathLike)) or not isinstance(argv, Sequence):
        return None
    words = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in argv]
    if not all(isinstance(w, str) for w in words):
        return None
    try:
        at = next(i for i, w in enumerate(words) if w == "serve" and i > 0
                  and (words[i - 1] == "akrelay" or words[i - 1].endswith("/akrelay")))
    except StopIteration:
        return None
    rest = words[at + 1:]
    if any(w in ("-h", "--help", "--config") or w == "--port" or w.startswith("--port=") for w in rest):
        return None
    if "AKRELAY_PORT" in (os.environ if env is None else env):
        return None
    return f"a test runs `akrelay serve` on its default port 8443: {ADVICE} (--port or AKRELAY_PORT)"
