"""A tiny HTML builder: every value goes through :func:`h` (``html.escape``), markup is ours.

No template engine: pages are a few f-strings whose interpolated values are
escaped at the point of use, so a capsule's title can never become markup.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from typing import Iterable
from urllib.parse import quote, urlencode

#: Sent with every explorer page and asset: nothing inline, nothing from elsewhere.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
BASE = "/explorer"
NAV = (("Recent", f"{BASE}/"), ("Search", f"{BASE}/search"), ("Ask", f"{BASE}/ask"), ("Status", f"{BASE}/status"))


def h(value: object) -> str:
    """The escaped text of any value (quotes included, so it is safe in attributes too)."""
    return html.escape("" if value is None else str(value), quote=True)


def path_part(value: str) -> str:
    """``value`` as one URL path segment."""
    return quote(value, safe=":")


def capsule_url(event_id: str) -> str:
    return f"{BASE}/capsules/{path_part(event_id)}"


def agent_url(agent_id: str) -> str:
    return f"{BASE}/agents/{path_part(agent_id)}"


def search_url(**params: str) -> str:
    return f"{BASE}/search?{urlencode(params)}"


def link(url: str, text: object, cls: str | None = None) -> str:
    extra = f' class="{h(cls)}"' if cls else ""
    return f'<a href="{h(url)}"{extra}>{h(text)}</a>'


def when(ms: object) -> str:
    """A Unix-ms timestamp as UTC ISO text (the raw value when it is not one)."""
    if not isinstance(ms, (int, float, str)):
        return h(ms)
    try:
        return datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (TypeError, ValueError, OverflowError, OSError):
        return h(ms)


def short(agent_id: str, keep: int = 18) -> str:
    return agent_id if len(agent_id) <= keep + 1 else agent_id[:keep] + "…"


def items(values: Iterable[str]) -> str:
    """An unordered list of already-built HTML fragments."""
    body = "".join(f"<li>{v}</li>" for v in values)
    return f"<ul>{body}</ul>" if body else '<p class="muted">none</p>'


def definition(rows: Iterable[tuple[str, str]]) -> str:
    """A ``<dl>`` of (escaped label, already-built HTML value) rows."""
    return "<dl>" + "".join(f"<dt>{h(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def page(title: str, body: str, *, scripts: tuple[str, ...] = ()) -> str:
    """The whole document: the stylesheet and scripts are files served by the relay."""
    nav = " ".join(link(url, name) for name, url in NAV)
    tags = "".join(f'<script src="{h(BASE)}/static/{h(s)}" defer></script>' for s in scripts)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{h(title)} · akrelay</title>"
            f'<link rel="stylesheet" href="{BASE}/static/explorer.css">{tags}</head>'
            f'<body><header><a class="brand" href="{BASE}/">akrelay explorer</a><nav>{nav}</nav></header>'
            f"<main>{body}</main><footer>Read-only view of this relay · "
            f'<a href="/.well-known/agent-knowledge">discovery</a> · <a href="/docs">API</a></footer></body></html>')
