"""The protocol core is sans-I/O: it imports no other akrelay package and no I/O library."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "src" / "akrelay" / "protocol"
FORBIDDEN_PREFIXES = (
    "akrelay.store", "akrelay.service", "akrelay.http", "akrelay.cli", "akrelay.client",
    "akrelay.federation", "akrelay.search", "akrelay.kip",
    "sqlite3", "socket", "ssl", "httpx", "litestar", "granian", "redis", "tantivy",
    "asyncio", "subprocess", "threading", "os", "io", "pathlib", "time",
)


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_core_modules_exist() -> None:
    assert (CORE / "errors.py").is_file()
    assert len(list(CORE.glob("*.py"))) >= 2


def test_core_imports_no_io_and_no_outer_layer() -> None:
    offenders = []
    for path in sorted(CORE.glob("*.py")):
        for name in _imports(path):
            if any(name == p or name.startswith(p + ".") for p in FORBIDDEN_PREFIXES):
                offenders.append(f"{path.name}: {name}")
    assert offenders == []


def test_layering_check_detects_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import sqlite3\nfrom akrelay.store import base\n", encoding="utf-8")
    assert _imports(bad) == ["sqlite3", "akrelay.store"]
