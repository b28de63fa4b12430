"""The compiled-grammar cache (issue 25): what a restart loads instead of compiling the LALR tables."""

from __future__ import annotations

from pathlib import Path

from akrelay.kip import grammar_cache as grammar
from akrelay.kip.kql.grammar import grammar_text

SOURCE = "\n".join(grammar_text(name) for name in ("kip_common.lark", "kql.lark"))
QUERY = 'FIND(?c.name) WHERE { ?c {type: "KnowledgeCapsule", name: :n} } LIMIT 3'


def test_the_first_process_compiles_and_keeps_the_tables_the_next_loads_them(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    directory = tmp_path / "cache" / "akrelay"
    first = grammar.load_or_compile(SOURCE, directory)
    path = grammar.cache_file(SOURCE, directory)
    assert path.is_file() and oct(directory.stat().st_mode & 0o777) == "0o700"
    assert [p.name for p in directory.iterdir()] == [path.name]  # no temporary file left

    def no_compiling(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("compiled although the tables were kept")

    monkeypatch.setattr(grammar, "Lark", type("L", (), {"__new__": no_compiling, "load": grammar.Lark.load}))
    loaded = grammar.load_or_compile(SOURCE, directory)
    assert loaded.parse(QUERY) == first.parse(QUERY)


def test_a_damaged_file_means_compiling_again(tmp_path: Path) -> None:
    directory = tmp_path / "akrelay"
    grammar.load_or_compile(SOURCE, directory)
    path = grammar.cache_file(SOURCE, directory)
    path.write_bytes(path.read_bytes()[:100])  # truncated, as by a full disk
    parser = grammar.load_or_compile(SOURCE, directory)
    assert parser.parse(QUERY).data == "start"
    assert grammar.load_or_compile(SOURCE, directory).parse(QUERY) == parser.parse(QUERY)  # rewritten whole


def test_a_directory_others_can_write_is_neither_read_nor_written(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(0o777)
    planted = grammar.cache_file(SOURCE, directory)
    planted.write_bytes(b"not a pickle anyone should load")
    parser = grammar.load_or_compile(SOURCE, directory)
    assert parser.parse(QUERY).data == "start"
    assert planted.read_bytes() == b"not a pickle anyone should load"
    assert sorted(p.name for p in directory.iterdir()) == [planted.name]


def test_the_key_changes_with_the_grammar(tmp_path: Path) -> None:
    assert grammar.cache_file(SOURCE, tmp_path) != grammar.cache_file(SOURCE + "\n// edited", tmp_path)


def test_no_home_means_no_cache(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")
    assert grammar.cache_dir() is None
    assert grammar.load_or_compile(SOURCE).parse(QUERY).data == "start"


def test_the_kip_runtime_loads_its_parsers_through_the_cache(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from akrelay.kip import runtime
    from akrelay.kip.kql import grammar as kql_grammar

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(kql_grammar, "_make", kql_grammar.compile_source)
    kql_grammar.parser.cache_clear()
    try:
        runtime.preload()
        assert kql_grammar.parser("kql").parse(QUERY).data == "start"
        assert len(list((tmp_path / "akrelay").glob("kip-grammar-*.lark"))) == 2  # kql and meta
    finally:
        kql_grammar.parser.cache_clear()
