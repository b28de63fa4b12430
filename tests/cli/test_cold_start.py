"""What a cold start loads (issue 25): deterministic checks of ``sys.modules``, not timings.

``akrelay --help`` and the parser behind every command must import only argparse-level
modules; the serve launcher must not import what only a worker or a follower needs. The
cost of an import is what makes these slow (bench/bench_restart.py measures it); which
modules are imported is what a test can check on a loaded machine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Third-party libraries and akrelay areas that only a running component needs.
HEAVY = ("tantivy", "lark", "jsonschema", "litestar", "granian", "httpx", "redis", "cryptography", "nacl",
         "msgspec", "sqlite3", "anyio", "akrelay.store", "akrelay.relay", "akrelay.node", "akrelay.http",
         "akrelay.kip.nexus", "akrelay.kip.runtime", "akrelay.kip.kql", "akrelay.knowql.service",
         "akrelay.search.service", "akrelay.explorer.routes", "akrelay.federation", "akrelay.process.launcher",
         "akrelay.protocol.envelope", "akrelay.protocol.signer")

PROBE = """
import json, sys, contextlib, io
with contextlib.redirect_stdout(io.StringIO()):
    try:
        {call}
    except SystemExit:
        pass
print(json.dumps(sorted(sys.modules)))
"""


def loaded_after(call: str) -> list[str]:
    """The modules a fresh interpreter holds after running ``call``."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(call=call)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def heavy(modules: list[str], allowed: tuple[str, ...] = ()) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)
            and not any(m == a or m.startswith(a + ".") for a in allowed)]


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["kql", "--help"], ["search", "--help"],
                                  ["no-such-command"]])
def test_help_and_usage_errors_import_nothing_heavy(argv: list[str]) -> None:
    modules = loaded_after(f"from akrelay.cli import main; main({argv!r})")
    assert "akrelay.cli" in modules
    assert heavy(modules) == []


def test_settings_of_every_component_load_without_the_components() -> None:
    """The options of every area are declared by light ``options`` modules (the launcher reads them all)."""
    modules = loaded_after("from akrelay.settings import load_option_modules; load_option_modules()")
    assert "akrelay.search.options" in modules and "akrelay.kip.options" in modules
    assert heavy(modules) == []


def test_lazy_package_exports_still_resolve() -> None:
    """``from akrelay.kip import KipConfig`` and ``from akrelay.search import SearchService`` load on first use."""
    modules = loaded_after("from akrelay.kip import KipConfig, POLICIES; from akrelay.search import SearchService, Budget")
    assert "akrelay.kip.config" in modules and "akrelay.search.service" in modules
    import akrelay.kip

    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        akrelay.kip.nothing  # noqa: B018 - the attribute access is the test
