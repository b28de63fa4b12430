"""The Lua scripts the Redis backend runs, read from this package's ``*.lua`` files (package data).

A line ``--#include NAME`` (a Lua comment) is replaced by ``NAME.lua``, the functions several scripts
share; each keyword of :func:`lua` replaces that word (a constant in capitals) in the script.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_INCLUDE = re.compile(r"^--#include (\w+)\n", re.MULTILINE)


@cache
def _text(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


def lua(name: str, **constants: int) -> str:
    """The script ``name`` (``commit`` is ``commit.lua``) with its includes and ``constants`` filled in."""
    text = _INCLUDE.sub(lambda m: _text(m.group(1)), _text(name))
    for word, value in constants.items():
        text = re.sub(rf"\b{word}\b", str(value), text)
    return text
