"""``akrelay serve`` option of the web explorer (one ``option`` call)."""

from __future__ import annotations

from akrelay.optionkit import _bool, option

option("no_explorer", _bool, False, "do not serve the web explorer (/explorer/ and the / redirect)", kind="flag",
       serve_only=True)
