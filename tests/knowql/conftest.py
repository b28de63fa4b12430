import json
import threading
import time
from pathlib import Path

import jsonschema
import pytest

from akrelay.knowql.compose import ExtractiveComposer
from akrelay.knowql.models import EXTRA_COMPOSERS, ModelEntry

SCHEMAS = json.loads((Path(__file__).resolve().parent / "nexus_2026-07.schemas.json").read_text())


def validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**SCHEMAS, "$ref": f"#/$defs/{name}"})


class SlowComposer:
    """The extractive composer, after waiting for ``gate`` (at most ``limit`` seconds)."""

    def __init__(self, limit: float = 120.0) -> None:  # tests set the gate; the limit only ends a forgotten one
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.limit = limit

    def compose(self, turn, retrieval, emit):
        self.entered.set()
        self.gate.wait(min(self.limit, max(0.0, turn.deadline - time.time()) + 0.5))
        return ExtractiveComposer().compose(turn, retrieval, emit)


@pytest.fixture
def slow():
    composer = SlowComposer()
    EXTRA_COMPOSERS["test/slow"] = lambda settings: ModelEntry("test/slow", "Slow (tests)", "tests", composer)
    try:
        yield composer
    finally:
        composer.gate.set()
        EXTRA_COMPOSERS.pop("test/slow", None)
