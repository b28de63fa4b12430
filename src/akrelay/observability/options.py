"""``akrelay serve`` option of the observability area (one ``option`` call)."""

from __future__ import annotations

from dataclasses import dataclass

from akrelay.optionkit import _bool, option, setting

option("log_json", _bool, False,
       "log one JSON object per request on stderr (request_id, method, route, status, duration_ms)", kind="flag",
       serve_only=True)


@dataclass(frozen=True, slots=True)
class ObservabilitySettings:
    """The observability area's settings (``settings.observability``)."""

    log_json: bool = setting("log_json")
