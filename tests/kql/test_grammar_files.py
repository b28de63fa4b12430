"""The grammars ship as package data identical to the canonical grammar/ files."""

from __future__ import annotations

import importlib.resources
import pathlib

import pytest

from akrelay.kip.kql.grammar import GRAMMAR_FILES, grammar_text, parser

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", GRAMMAR_FILES)
def test_packaged_grammar_is_identical_to_canonical(name: str) -> None:
    canonical = (ROOT / "grammar" / name).read_text(encoding="utf-8")
    assert grammar_text(name) == canonical, (
        f"src/akrelay/data/{name} differs from grammar/{name}; run: cp grammar/*.lark src/akrelay/data/"
    )


def test_grammars_are_loaded_from_the_package_not_the_checkout() -> None:
    resource = importlib.resources.files("akrelay").joinpath("data", "kql.lark")
    assert resource.is_file()
    assert pathlib.Path(str(resource)).parent.name == "data"


def test_pyproject_declares_lark_package_data() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"data/*.lark"' in text


@pytest.mark.parametrize("language", ["kql", "meta"])
def test_grammar_compiles_lalr_contextual_without_conflicts(language: str) -> None:
    lark = parser(language)
    assert lark.options.parser == "lalr"
    assert lark.options.lexer == "contextual"


@pytest.mark.slow
def test_installed_wheel_parses_without_a_source_checkout(tmp_path: pathlib.Path) -> None:
    """Build the wheel, install it into an empty directory and parse from there."""
    import subprocess
    import sys

    pytest.importorskip("wheel")
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(wheels)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    if build.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {build.stderr[-300:]}")
    wheel = next(wheels.glob("akrelay-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    probe = ("import akrelay, akrelay.kip.kql as k; "
             "assert akrelay.__file__.startswith(%r), akrelay.__file__; "
             "print(k.parse_meta('DESCRIBE PRIMER').target, k.parse_kql('FIND(?x) WHERE { ?x {} }').find[0].name)"
             % str(target))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["PRIMER", "x"]
