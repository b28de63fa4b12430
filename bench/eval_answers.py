"""Evaluate KnowQL's extractive answers (issue 22) on a labelled corpus: does the answer answer?

Loads ``bench/answers_corpus.json`` (or ``--corpus FILE``): capsules on distinct topics, each holding one
specific fact, some assessed (accepted, contested, rejected), and questions labelled with the capsule
that answers them and the fact the answer must state. It signs and submits the capsules to an
in-process relay (memory store, the real app and its KnowQL routes), asks every question with the
default extractive composer, and prints:

* ``top1``: the first citation is the expected capsule (answerable questions);
* ``fact_first_line``: one of the expected fact's forms is in the first line (answerable questions
  whose capsule is not rejected or contested);
* ``declines``: a question nothing answers gets no citation and a first line that declines;
* ``belief_honesty``: for a rejected or contested best answer, the first line says so;
* ``shape``: a numeric ``shape`` field equals the expected value;
* ``followups``: the second turn of a session cites the expected capsule first;
* ``p99``: the wall time of one synchronous ``POST /query`` turn (in process, all turns).

With ``--show`` it prints every question's first line and the misses. Exit status 1 when
``--check`` is given and a figure is below the issue's targets. Last line:
``eval_answers_top1: <percent> %``.

    python3 bench/eval_answers.py [--corpus FILE] [--show] [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from litestar.testing import TestClient  # noqa: E402

from akrelay.process.worker import create_app  # noqa: E402
from akrelay.protocol.signer import Signer, assess_event, publish_event  # noqa: E402
from akrelay.relay.config import RelayConfig  # noqa: E402
from akrelay.relay.core import Relay  # noqa: E402
from akrelay.settings import defaults  # noqa: E402
from akrelay.store.memory import MemoryStore  # noqa: E402

ORIGIN = "https://localhost:8443"
NOW = 1_790_553_600_000
LICENSE = "https://creativecommons.org/licenses/by/4.0/"
HEADERS = {"content-type": "application/json"}
TARGETS = {"top1": 90.0, "fact_first_line": 80.0, "declines": 80.0, "belief_honesty": 100.0, "shape": 80.0,
           "followups": 66.6}
_DECLINE = re.compile(r"^(nothing in scope answers|no knowledge in scope matched|the question has no searchable)",
                      re.IGNORECASE)


class World:
    def __init__(self, corpus: dict[str, Any]) -> None:
        self.signers: dict[str, Signer] = {}
        self.nonce = 0
        self.ids: dict[str, str] = {}
        relay = self.relay = Relay(MemoryStore(), RelayConfig(origin=ORIGIN), clock=lambda: NOW,
                                   cursor_secret=b"e" * 32)
        # an evaluation, not a client: no rate limit and no cap on turns in flight
        self.app = create_app(relay, defaults(write_rate=0.0, read_rate=0.0, knowql_rate=0.0))
        self.corpus = corpus

    def signer(self, name: str) -> Signer:
        if name not in self.signers:
            self.signers[name] = Signer.from_seed(name.encode().ljust(32, b"\0")[:32])
        return self.signers[name]

    def sign(self, name: str, build: Any, payload: dict[str, Any]) -> dict[str, Any]:
        self.nonce += 1
        signer = self.signer(name)
        return signer.sign(build(signer.agent_id, NOW - 1_000_000 + self.nonce, self.nonce, payload))

    def load(self, client: TestClient) -> None:
        authors = ("alice", "dave", "erin", "frank")
        pending: list[tuple[str, dict[str, Any]]] = []
        for i, c in enumerate(self.corpus["capsules"]):
            payload: dict[str, Any] = {
                "license": LICENSE, "kind": c.get("kind", "observation"), "title": c["title"],
                "statement": c["statement"], "language": "en",
                "context": {"scope": c.get("scope") or "ops", "conditions": [], "limitations": []},
                "basis": c.get("basis") or "Observed in operation."}
            if c.get("tags"):
                payload["tags"] = c["tags"]
            relations = [{"relation": r, "target": self.ids[t]} for r, t in c.get("relations", ()) if t in self.ids]
            if relations:
                payload["relations"] = relations
            env = self.sign(authors[i % len(authors)], publish_event, payload)
            self.ids[c["key"]] = env["hash"]
            pending.append(("publish", env))
            for assessor, verdict, summary in c.get("assess", ()):
                pending.append(("assess", self.sign(assessor, assess_event, {
                    "license": LICENSE, "target": env["hash"], "verdict": verdict, "summary": summary,
                    "context": {"scope": c.get("scope") or "ops", "conditions": [], "limitations": []},
                    "basis": "An assessment."})))
        for _, env in pending:
            r = client.post("/v1/knowledge/events", content=json.dumps(env), headers=HEADERS)
            if r.status_code != 200:
                raise SystemExit(f"submit failed: {r.status_code} {r.text}")
        self.app.state.node.search.engine.wait_indexed()


def first_line(doc: dict[str, Any]) -> str:
    text = "".join(part.get("text", "") for item in doc.get("output", []) for part in item.get("content", []))
    return text.split("\n", 1)[0]


def has_fact(line: str, forms: list[str]) -> bool:
    low = line.lower().replace("\u00a0", " ")
    return any(form.lower() in low for form in forms)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default=str(Path(__file__).with_name("answers_corpus.json")))
    parser.add_argument("--show", action="store_true", help="print every first line and the misses")
    parser.add_argument("--check", action="store_true", help="exit 1 when a figure misses the issue's target")
    args = parser.parse_args()
    corpus = json.loads(Path(args.corpus).read_text(encoding="utf-8"))
    world = World(corpus)
    counts = {k: [0, 0] for k in TARGETS}
    latencies: list[float] = []
    misses: list[str] = []
    by_kind: dict[str, list[int]] = {}

    def score(name: str, ok: bool, note: str) -> None:
        counts[name][1] += 1
        if ok:
            counts[name][0] += 1
        else:
            misses.append(f"  miss {name}: {note}")

    with TestClient(world.app, raise_server_exceptions=False) as client:
        world.load(client)

        def ask(body: dict[str, Any]) -> dict[str, Any]:
            started = time.perf_counter()
            r = client.post("/query", content=json.dumps(body), headers=HEADERS)
            latencies.append((time.perf_counter() - started) * 1000)
            if r.status_code != 200:
                raise SystemExit(f"turn failed: {r.status_code} {r.text}")
            return r.json()

        for question in corpus["questions"]:
            body: dict[str, Any] = {"ask": question["ask"], "scope": ["knowledge"]}
            if question.get("shape"):
                body["shape"] = question["shape"]
            doc = ask(body)
            line = first_line(doc)
            cited = [c["source"] for c in doc.get("citations", [])]
            if args.show:
                print(f"[{question['kind']}] {question['ask']}\n    {line}")
            if question["kind"] == "none":
                score("declines", not cited and bool(_DECLINE.match(line)), f"{question['ask']!r} -> {line!r}")
                continue
            expected = world.ids[question["expect"]]
            tally = by_kind.setdefault(question["kind"], [0, 0])
            tally[0] += bool(cited) and cited[0] == expected
            tally[1] += 1
            score("top1", bool(cited) and cited[0] == expected,
                  f"{question['ask']!r} -> {doc['citations'][0]['title'] if cited else None!r}")
            belief = question.get("belief")
            if belief:
                flagged = re.search(r"\b(rejected|contested)\b", line, re.IGNORECASE) is not None
                score("belief_honesty", flagged, f"{question['ask']!r} -> {line!r}")
            elif question.get("fact"):
                score("fact_first_line", has_fact(line, question["fact"]), f"{question['ask']!r} -> {line!r}")
            if question.get("shape"):
                out = doc.get("output_json") or {}
                (name,) = question["shape"]["properties"]
                got = out.get(name)
                score("shape", isinstance(got, (int, float)) and abs(got - question["value"]) < 1e-6,
                      f"{question['ask']!r} -> {out!r}")
            follow = question.get("follow")
            if follow:
                second = ask({"ask": follow["ask"], "session_id": doc["session_id"]})
                cited2 = [c["source"] for c in second.get("citations", [])]
                if args.show:
                    print(f"  -> {follow['ask']}\n    {first_line(second)}")
                score("followups", bool(cited2) and cited2[0] == world.ids[follow["expect"]],
                      f"{follow['ask']!r} -> {second['citations'][0]['title'] if cited2 else None!r}")
    world.relay.close()
    if args.show and misses:
        print("\n".join(misses))
    figures = {k: (100.0 * ok / n if n else 100.0) for k, (ok, n) in counts.items()}
    print(f"capsules: {len(corpus['capsules'])}, questions: {len(corpus['questions'])}, turns: {len(latencies)}")
    for name, (ok, n) in counts.items():
        print(f"{name}: {ok}/{n} = {figures[name]:.1f} % (target >= {TARGETS[name]:.0f} %)")
    print("top1 by kind: " + ", ".join(f"{k} {ok}/{n}" for k, (ok, n) in sorted(by_kind.items())))
    print(f"p50: {pct(latencies, 0.5):.1f} ms, p99: {pct(latencies, 0.99):.1f} ms (in process, wall time)")
    print(f"eval_answers_top1: {figures['top1']:.1f} %")
    if args.check and any(figures[k] < TARGETS[k] for k in TARGETS):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
