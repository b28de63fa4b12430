"""The vectors' ``changes`` / ``response_changes`` mutations, shared by every test layer.

Each change is ``{op: "set" | "remove", path: JSON Pointer, value?}`` and applies to a
deep copy, so a case never disturbs the fixtures it mutates.
"""

from __future__ import annotations

import copy
from typing import Any


def _tokens(path: str) -> list[str]:
    assert path.startswith("/"), path
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def apply_changes(value: Any, changes: list[dict[str, Any]]) -> Any:
    """Apply ``changes`` to a deep copy of ``value`` and return it."""
    result = copy.deepcopy(value)
    for change in changes:
        *parents, last = _tokens(change["path"])
        node = result
        for token in parents:
            node = node[int(token)] if isinstance(node, list) else node[token]
        key: Any = int(last) if isinstance(node, list) else last
        if change["op"] == "set":
            if isinstance(node, list) and key == len(node):
                node.append(copy.deepcopy(change["value"]))
            else:
                node[key] = copy.deepcopy(change["value"])
        elif change["op"] == "remove":
            del node[key]
        else:  # pragma: no cover - the vectors use only these two
            raise ValueError(f"unknown mutation {change['op']!r}")
    return result
