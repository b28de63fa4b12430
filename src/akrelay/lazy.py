"""Package re-exports loaded on first access (PEP 562), so that importing a package costs nothing.

``akrelay.kip`` and ``akrelay.search`` re-export their API, but the CLI and the settings read
small modules of theirs and must not pay for the rest (``akrelay --help``, the launcher).
"""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_exports(package: str, namespace: dict[str, object], exports: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps a name to the submodule defining it."""

    # A module ``__getattr__`` hands back whatever the submodule defines: mypy types each exported name
    # from the package's own imports under TYPE_CHECKING, and any other name read through it is an object.
    def attribute(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value  # the next access is a plain global
        return value

    return attribute
