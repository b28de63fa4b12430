"""``akrelay serve`` option of the web explorer (one ``option`` call)."""

from __future__ import annotations

from dataclasses import dataclass

from akrelay.optionkit import _bool, option, setting

option("no_explorer", _bool, False, "do not serve the web explorer (/explorer/ and the / redirect)", kind="flag",
       serve_only=True)


@dataclass(frozen=True, slots=True)
class ExplorerSettings:
    """The web explorer's settings (``settings.explorer``)."""

    disabled: bool = setting("no_explorer")
