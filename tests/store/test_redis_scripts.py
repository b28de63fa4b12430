"""The Redis backend's Lua scripts are package data: found from the source tree and from an installed wheel."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from akrelay.store.redis import scripts
from akrelay.store.redis.scripts import lua

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "akrelay" / "store" / "redis"
LUA = sorted(p.name for p in PACKAGE.glob("*.lua"))


def _loaded_names() -> set[str]:
    """Every ``lua("name")`` the package's modules call."""
    names = set()
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lua" and node.args:
                names.add(ast.literal_eval(node.args[0]))
    return names


def test_every_loaded_script_and_include_is_a_file() -> None:
    names = _loaded_names()
    assert {"commit", "query", "verify", "recon_apply"} <= names
    for name in names:
        text = lua(name, BLOCK=1)
        assert text.startswith("#!lua"), name
        assert "--#include" not in text, name  # every include was found and expanded
    assert {f"{n}.lua" for n in names} | {"put.lua", "filters.lua"} == set(LUA)  # no file left unused


def test_includes_and_constants_are_filled_in() -> None:
    commit = lua("commit", BLOCK=4096)
    assert "local function put(" in commit and "math.floor(seq / 4096)" in commit
    assert "BLOCK" not in commit
    assert "BLOCK" in scripts._text("put")  # the file keeps the name; only the loaded text has the value


def test_an_unknown_script_is_an_error() -> None:
    with pytest.raises(FileNotFoundError):
        lua("no_such_script")


@pytest.mark.slow
def test_the_wheel_ships_the_lua_files_and_an_installed_package_finds_them(tmp_path: Path) -> None:
    """An installed akrelay (not the source tree) loads every script: the files are in the wheel."""
    # built from a copy without the editable install's egg-info, whose file list would add the files by itself
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(tree)], check=True, capture_output=True, timeout=600)
    (wheel,) = out.glob("akrelay-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {Path(n).name for n in archive.namelist() if n.startswith("akrelay/store/redis/")}
        archive.extractall(tmp_path / "site")
    assert set(LUA) <= shipped
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); "
             "from akrelay.store.redis import scripts; "
             "assert scripts.__file__.startswith(sys.argv[1]), scripts.__file__; "
             "print(len(scripts.lua('commit', BLOCK=1)) > 0 and len(scripts.lua('recon_apply')) > 0)")
    # -S: no site-packages, so the editable install of the source tree cannot answer instead
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-S", "-c", probe, str(tmp_path / "site")], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
