"""The import contract of akrelay's layers (docs/architecture.md), checked on the source.

Every module belongs to one layer (the longest matching prefix in ``LAYERS``);
a module may import its own layer and the layers below it, never one above.
Relative imports are resolved first, and imports inside functions count (a
lazy import is still a dependency). Separately, the module graph has no cycles,
not even through imports under ``TYPE_CHECKING`` (a cycle that only type hints
close still ties the two modules into one), and the sans-I/O layers (the protocol core and the KIP core with KQL) import no
I/O library and read no clock.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ARCHITECTURE = SRC.parent / "docs" / "architecture.md"
PACKAGE = SRC / "akrelay"

#: Lowest first. The KIP runtime (requests, files, followers) sits above the pure KIP core and KQL;
#: ``=name`` is that module only (``akrelay.kip``'s ``__init__`` re-exports the runtime's configuration).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("protocol", ("akrelay", "akrelay.protocol", "akrelay.lazy", "akrelay.jsontypes")),
    ("kip core", ("akrelay.kip",)),
    ("kql", ("akrelay.kip.kql",)),
    ("store", ("akrelay.store", "akrelay.leader")),
    # the options modules are declarations only (each imports akrelay.optionkit), read by the settings
    ("settings", ("akrelay.settings", "akrelay.optionkit", "akrelay.search.options", "akrelay.kip.options",
                  "akrelay.knowql.options", "akrelay.explorer.options", "akrelay.observability.options")),
    ("relay", ("akrelay.relay", "akrelay.client", "akrelay.boundedhttp")),
    ("areas", ("akrelay.search", "akrelay.federation", "akrelay.kip.runtime", "akrelay.kip.meta",
               "akrelay.kip.wiring", "akrelay.kip.follower", "akrelay.kip.nexus_sqlite",
               "akrelay.kip.config", "akrelay.kip.package", "akrelay.kip.grammar_cache", "=akrelay.kip")),
    ("knowql", ("akrelay.knowql",)),
    # counters the HTTP layer increments (prometheus-client only)
    ("metrics", ("akrelay.observability.metrics", "akrelay.observability.requests")),
    ("http", ("akrelay.http", "akrelay.tls")),
    # the node's components, one module each: what start() opens and stop() closes, and the routes they mount
    ("components", ("akrelay.components",)),
    # where the state is kept (SQLite or Redis): opens the log, turn store, federation state, rate buckets
    ("backend", ("akrelay.backend",)),
    # pages and documents over the components: the explorer, /metrics, /openapi.json
    ("web", ("akrelay.explorer", "akrelay.observability", "akrelay.openapi", "akrelay.web")),
    # the app that mounts every component's routes and pages: nothing it mounts may import it
    ("app", ("akrelay.http.app",)),
    ("node", ("akrelay.node",)),  # the owner: builds the relay and the components (akrelay.components)
    # the processes of `akrelay serve`: the launcher, the worker's app factory, the followers' process
    ("process", ("akrelay.process",)),
    ("cli", ("akrelay.cli", "akrelay.__main__")),
]

#: Layers that do no I/O: what they may not import, and clock calls they may not make.
SANS_IO = ("protocol", "kip core", "kql")
IO_MODULES = (
    "sqlite3", "socket", "ssl", "httpx", "litestar", "granian", "redis", "tantivy", "asyncio", "subprocess",
    "threading", "multiprocessing", "os", "io", "pathlib", "shutil", "tempfile", "time", "random", "secrets",
    "uuid", "fcntl", "signal", "select", "urllib.request",
)
CLOCK_CALLS = frozenset(("now", "utcnow", "today", "time", "time_ns", "monotonic", "perf_counter", "urandom"))

#: Upward imports that the owner rework (issue 12: one owner object) removes; each entry must still
#: exist (the test below fails once it is gone, so the list only shrinks).
PENDING: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_only(tree: ast.AST) -> set[int]:
    """Ids of the nodes under ``if TYPE_CHECKING:`` (annotations only: not run, so no cycle)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                out.update(id(n) for n in ast.walk(child))
    return out


def imports(path: Path, name: str | None = None, *, runtime_only: bool = False) -> list[tuple[str, int]]:
    """Absolute names imported by ``path`` (relative imports resolved), with line numbers.

    ``from package import submodule`` names the submodule where one exists. With
    ``runtime_only``, imports under ``if TYPE_CHECKING:`` are left out.
    """
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            subs = [f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}")]
            out.extend((sub, node.lineno) for sub in subs)
            if len(subs) < len(node.names):
                out.append((target, node.lineno))
    return out


def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` names (relative levels resolved against ``package``)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(name: str) -> bool:
    if not name.startswith("akrelay."):
        return False
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def layer_of(name: str) -> int | None:
    """Index of the layer owning module ``name`` (longest prefix), ``None`` outside akrelay."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if prefix.startswith("="):
                if name == prefix[1:]:
                    return index
                continue
            matches = name == prefix or (name.startswith(prefix + ".") and prefix != "akrelay")
            if matches and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    if best is None and (name == "akrelay" or name.startswith("akrelay.")):
        return 0 if name.count(".") == 1 and name.split(".")[1].startswith("__") else None
    return best[0] if best else None


def sources() -> list[tuple[str, Path]]:
    return sorted((module_name(p), p) for p in PACKAGE.rglob("*.py"))


def upward_imports() -> list[tuple[str, str, int]]:
    found = []
    for name, path in sources():
        own = layer_of(name)
        assert own is not None, f"{name} is in no layer: add it to LAYERS"
        for target, line in imports(path):
            other = layer_of(target)
            if other is not None and other > own:
                found.append((name, target, line))
    return found


def test_every_module_has_a_layer() -> None:
    assert [name for name, _ in sources() if layer_of(name) is None] == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    offenders = [f"{name}:{line} imports {target} ({LAYERS[layer_of(target)][0]} is above "
                 f"{LAYERS[layer_of(name)][0]})"
                 for name, target, line in upward_imports() if (name, target) not in PENDING]
    assert offenders == []


def test_pending_exceptions_are_still_needed() -> None:
    present = {(name, target) for name, target, _ in upward_imports()}
    assert [edge for edge in PENDING if edge not in present] == []


def _graph() -> dict[str, set[str]]:
    names = {name for name, _ in sources()}
    graph: dict[str, set[str]] = {}
    for name, path in sources():
        graph[name] = {t for t, _ in imports(path, runtime_only=True) if t in names and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _package_of(name: str) -> str:
    """The package a module's layer entry names (``akrelay.kip.kql``, ``akrelay.store``, …)."""
    layer = layer_of(name)
    assert layer is not None
    if "=" + name in LAYERS[layer][1]:
        return "=" + name  # a module of its own, apart from the package it opens
    return max((p for p in LAYERS[layer][1] if name == p or name.startswith(p + ".")), key=len, default=name)


def test_no_import_cycles_between_modules() -> None:
    assert _cycles(_graph()) == []


def test_no_import_cycles_even_through_type_checking_imports() -> None:
    """``store.redis`` and ``store.redis.text``, ``kip.meta`` and ``kip.runtime`` were one such pair each:
    the lower module names what it needs as a Protocol instead of importing its caller."""
    names = {name for name, _ in sources()}
    graph = {name: {t for t, _ in imports(path) if t in names and t != name} for name, path in sources()}
    assert _cycles(graph) == []


def test_no_import_cycles_between_layer_packages() -> None:
    """``kip`` and ``kip.kql`` (and any two packages) do not import each other, even through a third."""
    packages: dict[str, set[str]] = {}
    for name, targets in _graph().items():
        own = _package_of(name)
        packages.setdefault(own, set()).update(_package_of(t) for t in targets if _package_of(t) != own)
    for targets in list(packages.values()):
        for target in targets:
            packages.setdefault(target, set())
    pending = {(_package_of(a), _package_of(b)) for a, b in PENDING}
    for source, target in pending:
        packages[source].discard(target)
    assert _cycles(packages) == []


def _private_imports(path: Path, name: str) -> list[tuple[str, str, int]]:
    """``(module, private name, line)`` for each ``from akrelay.x import _y`` in ``path``."""
    out = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            out.extend((target, a.name, node.lineno) for a in node.names
                       if a.name.startswith("_") and not a.name.startswith("__") and target.startswith("akrelay"))
    return out


def test_redis_and_sqlite_code_share_no_private_names() -> None:
    """A rule both backends need lives in a module of its own (``knowql.lifecycle``, ``store.text_indexer``,
    ``store.leader_lock``): a Redis module reaching into another's private names copies a rule instead."""
    offenders = [f"{name}:{line} imports {target}.{private}"
                 for name, path in sources() for target, private, line in _private_imports(path, name)
                 if "redis" in name.rpartition(".")[2] or "redis" in target.rpartition(".")[2]]
    assert offenders == []


def test_sans_io_layers_import_no_io_and_read_no_clock() -> None:
    offenders = []
    sans_io = {index for index, (label, _) in enumerate(LAYERS) if label in SANS_IO}
    for name, path in sources():
        if layer_of(name) not in sans_io:
            continue
        for target, line in imports(path):
            if any(target == m or target.startswith(m + ".") for m in IO_MODULES):
                offenders.append(f"{name}:{line} imports {target}")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CLOCK_CALLS:
                offenders.append(f"{name}:{node.lineno} calls .{node.func.attr}()")
    assert offenders == []


def diagram_layers(doc: str) -> list[tuple[str, tuple[str, ...]]]:
    """The layers of the Mermaid block under "## The layering rule", lowest first, as ``LAYERS`` writes them.

    Each node is ``id["label: module, module"]`` ("x (module only)" stands for ``=x``), and one chain
    ``a --> b --> ...`` orders them from the top; a node left out of the chain, or a chain through an
    unknown node, is an error."""
    section = doc.split("## The layering rule", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```mermaid\n(.*?)```", section, re.DOTALL)
    assert match, "no mermaid block under '## The layering rule'"
    nodes: dict[str, tuple[str, tuple[str, ...]]] = {}
    chains: list[list[str]] = []
    for line in match.group(1).splitlines():
        line = line.strip()
        node = re.fullmatch(r'(\w+)\["([^":]+): ([^"]+)"\]', line)
        if node:
            modules = tuple("=" + m.removesuffix(" (module only)") if m.endswith(" (module only)") else m
                            for m in (part.strip() for part in node.group(3).split(",")))
            nodes[node.group(1)] = (node.group(2), modules)
        elif "-->" in line:
            chains.append([part.strip() for part in line.split("-->")])
    assert len(chains) == 1, f"one chain of layers expected, found {len(chains)}"
    (chain,) = chains
    assert sorted(chain) == sorted(nodes), f"chain {chain} and nodes {sorted(nodes)} differ"
    return [nodes[node] for node in reversed(chain)]


def test_the_architecture_diagram_is_the_import_contract() -> None:
    """docs/architecture.md's layer diagram names the same layers, in the same order, with the same modules."""
    drawn = diagram_layers(ARCHITECTURE.read_text(encoding="utf-8"))
    assert [name for name, _ in drawn] == [name for name, _ in LAYERS]
    assert {name: sorted(mods) for name, mods in drawn} == {name: sorted(mods) for name, mods in LAYERS}


# -- the checker itself can fail -------------------------------------------------------------


def test_the_diagram_check_sees_a_missing_or_moved_layer() -> None:
    doc = ARCHITECTURE.read_text(encoding="utf-8")
    drawn = diagram_layers(doc)
    moved = diagram_layers(doc.replace("backend --> components --> http", "backend --> http --> components"))
    assert [n for n, _ in moved] != [n for n, _ in drawn] and sorted(moved) == sorted(drawn)
    with pytest.raises(AssertionError, match="chain"):
        diagram_layers(doc.replace(" --> components", ""))  # a node outside the chain
    renamed = diagram_layers(doc.replace("components: akrelay.components", "components: akrelay.parts"))
    assert dict(renamed)["components"] == ("akrelay.parts",) != dict(LAYERS)["components"]


def test_relative_and_lazy_imports_are_resolved(tmp_path: Path) -> None:
    bad = PACKAGE / "kip" / "kql" / "_probe_does_not_exist.py"
    source = "from .. import runtime\nfrom ..nexus import NexusBase\n\ndef f():\n    import akrelay.http.app\n"
    probe = tmp_path / "probe.py"
    probe.write_text(source, encoding="utf-8")
    found = imports(probe, name=module_name(bad))
    assert ("akrelay.kip.runtime", 1) in found and ("akrelay.kip.nexus", 2) in found
    assert ("akrelay.http.app", 5) in found
    assert layer_of("akrelay.kip.kql._probe_does_not_exist") == 2
    assert layer_of("akrelay.kip.runtime") > layer_of("akrelay.kip.kql.evaluate")
    assert layer_of("akrelay.protocol.cursor") == 0 and layer_of("akrelay.cli.serve") == len(LAYERS) - 1


def test_type_checking_imports_count_for_layers_but_not_for_cycles(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from akrelay.process.launcher import x\n",
                     encoding="utf-8")
    assert ("akrelay.process.launcher", 3) in imports(probe, name="akrelay.protocol.probe")
    assert ("akrelay.process.launcher", 3) not in imports(probe, name="akrelay.protocol.probe", runtime_only=True)


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", ["sqlite3", "time", "os.path", "threading"])
def test_io_list_covers(module: str) -> None:
    assert any(module == m or module.startswith(m + ".") for m in IO_MODULES)
