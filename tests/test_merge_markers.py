"""No merge-conflict marker is left in the tree: docs and code are read by people and tools alike.

A conflict left in a Markdown file breaks nothing that runs, so only this test notices it
(a merge once left three in docs/).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: a line that is exactly a conflict marker (built from parts, so this file has none)
MARKER = re.compile("^(" + "<" * 7 + " .*|" + "=" * 7 + "|" + ">" * 7 + " .*)$", re.M)
SUFFIXES = {".py", ".md", ".toml", ".lark", ".ebnf", ".json", ".lua", ".cfg", ".txt", ".yml", ".yaml", ".sh", ""}
SKIP = {".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "build", "dist"}


def _files() -> list[Path]:
    out = []
    for top in ("README.md", "pyproject.toml", "src", "tests", "docs", "bench", "grammar", "schemas", "peers",
                "deploy", ".ci"):
        path = ROOT / top
        candidates = [path] if path.is_file() else path.rglob("*") if path.is_dir() else []
        for file in candidates:
            if file.is_file() and file.suffix in SUFFIXES and not SKIP & set(file.relative_to(ROOT).parts) \
                    and file.stat().st_size < 2_000_000:
                out.append(file)
    return out


def test_no_conflict_markers_in_the_tree() -> None:
    files = _files()
    assert len(files) > 100  # the walk found the tree
    found = []
    for file in files:
        text = file.read_text(errors="replace")
        for match in MARKER.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{file.relative_to(ROOT)}:{line}: {match.group(0)[:40]}")
    assert found == [], "\n".join(found)


def test_the_pattern_finds_a_marker() -> None:
    sample = "text\n" + "<" * 7 + " HEAD\nours\n" + "=" * 7 + "\ntheirs\n" + ">" * 7 + " branch\n"
    assert len(MARKER.findall(sample)) == 3
    assert MARKER.findall("a ======= b\n<<<< x\n") == []
