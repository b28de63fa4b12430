"""Query strings as the relay reads them, for every page and endpoint (the app, the explorer, the log).

A module of its own, below the app that assembles the components: a component or
a page that imported :mod:`akrelay.http.app` for this would import its own owner.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from akrelay.protocol.errors import ProtocolError

#: Query strings with more pairs than this are refused before reaching the core.
MAX_QUERY_PAIRS = 64


def query_pairs(raw: bytes) -> list[tuple[str, str]]:
    """Decode a query string as application/x-www-form-urlencoded, keeping order and repeats."""
    try:
        text = raw.decode("ascii")
        return parse_qsl(text, keep_blank_values=True, strict_parsing=False,
                         encoding="utf-8", errors="strict", max_num_fields=MAX_QUERY_PAIRS)
    except UnicodeDecodeError:
        raise ProtocolError("invalid_request", "The query string is not valid percent-encoded UTF-8.") from None
    except ValueError:
        raise ProtocolError("invalid_request", f"The query string has more than {MAX_QUERY_PAIRS} parameters.") from None
