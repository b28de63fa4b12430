"""``akrelay serve`` option of the observability area (one ``option`` call)."""

from __future__ import annotations

from akrelay.optionkit import _bool, option

option("log_json", _bool, False,
       "log one JSON object per request on stderr (request_id, method, route, status, duration_ms)", kind="flag",
       serve_only=True)
