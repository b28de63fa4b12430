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
