"""Case generation for the SDK differential test (kept apart so a scratch run can reuse it).

Every case is raw request bytes plus a label naming how it was made. Mutations
follow the vectors: the schema_cases and identity_cases changes, applied both
as the vectors do (not re-signed) and re-signed so that hash and signature stay
valid and only the payload rules decide; plus generated mutations of the same
kinds (field sets/removals, tampered hashes, signatures and actors, strict-JSON
defects in the text).
"""

from __future__ import annotations

import copy
import random
from typing import Any, Iterator

from identity_support import FIXTURES, KNOWLEDGE, SIGNERS, apply_changes, fixture_envelope, fixture_signer, to_bytes

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
DIGEST = "JC3JB0-_nifwwWoPybM5fRubk5jbuqkHqFvU5bsd8xo"


def _trailing(text: str) -> str:
    """Same decoded bytes, non-zero trailing bits: a non-canonical spelling."""
    return text[:-1] + ALPHABET[ALPHABET.index(text[-1]) | 1]


def _signer_for(event: dict[str, Any]):
    for signer in SIGNERS.values():
        if signer.agent_id == event.get("actor"):
            return signer
    return None


# (label, function(envelope) -> envelope | None); None = not applicable to this fixture.
def _event_mutations():
    def setter(*path, value):
        def apply(env):
            node = env["event"]
            for key in path[:-1]:
                if key not in node:
                    return None
                node = node[key]
            node[path[-1]] = copy.deepcopy(value)
            return env
        return apply

    def remover(*path):
        def apply(env):
            node = env["event"]
            for key in path[:-1]:
                node = node.get(key, {})
            if path[-1] not in node:
                return None
            del node[path[-1]]
            return env
        return apply

    def payload_if(key, fn):
        def apply(env):
            return fn(env) if key in env["event"]["payload"] else None
        return apply

    def first_list_item(key, field, value):
        def apply(env):
            items = env["event"]["payload"].get(key)
            if not items:
                return None
            items[0][field] = copy.deepcopy(value)
            return env
        return apply

    def duplicate_first(key):
        def apply(env):
            items = env["event"]["payload"].get(key)
            if not items:
                return None
            items.append(copy.deepcopy(items[0]))
            return env
        return apply

    yield from [
        ("nonce zero", setter("nonce", value=0)),
        ("nonce negative", setter("nonce", value=-5)),
        ("nonce bool", setter("nonce", value=True)),
        ("nonce string", setter("nonce", value="5")),
        ("nonce fraction", setter("nonce", value=2.5)),
        ("nonce integral double", setter("nonce", value=7.0)),
        ("created_at negative", setter("created_at", value=-1)),
        ("created_at max", setter("created_at", value=2**53 - 1)),
        ("protocol other", setter("protocol", value="agent-knowledge/2.0")),
        ("type unknown", setter("type", value="knowledge.vote")),
        ("event extra field", setter("room_id", value="r")),
        ("event missing payload", remover("payload")),
        ("payload not object", setter("payload", value=[])),
        ("payload unknown member", setter("payload", "truth", value=True)),
        ("license http", payload_if("license", setter("payload", "license", value="http://example.com/l"))),
        ("license userinfo", payload_if("license", setter("payload", "license", value="https://u:p@example.com/l"))),
        ("license bad port", payload_if("license", setter("payload", "license", value="https://example.com:99999/l"))),
        ("license relative", payload_if("license", setter("payload", "license", value="/licenses/by"))),
        ("license no host", payload_if("license", setter("payload", "license", value="https:///x"))),
        ("license removed", remover("payload", "license")),
        ("kind unknown", payload_if("kind", setter("payload", "kind", value="fact"))),
        ("title empty", payload_if("title", setter("payload", "title", value=""))),
        ("title not string", payload_if("title", setter("payload", "title", value=5))),
        ("language bad", payload_if("language", setter("payload", "language", value="en_US"))),
        ("language und", payload_if("language", setter("payload", "language", value="und"))),
        ("tags duplicate", payload_if("kind", setter("payload", "tags", value=["a", "a"]))),
        ("tags uppercase", payload_if("kind", setter("payload", "tags", value=["Cache"]))),
        ("tags empty list", payload_if("kind", setter("payload", "tags", value=[]))),
        ("context extra", payload_if("context", setter("payload", "context", "verified", value=True))),
        ("context dup conditions", payload_if("context", setter("payload", "context", "conditions", value=["x", "x"]))),
        ("steps repeat", payload_if("reproduction", setter("payload", "reproduction", "steps", value=["a", "a"]))),
        ("steps empty", payload_if("reproduction", setter("payload", "reproduction", "steps", value=[]))),
        ("evidence url http", first_list_item("evidence", "url", "http://example.com/e")),
        ("evidence url userinfo", first_list_item("evidence", "url", "https://a@example.com/e")),
        ("evidence digest trailing bits", first_list_item("evidence", "digest", _trailing(DIGEST))),
        ("evidence digest short", first_list_item("evidence", "digest", DIGEST[:-1])),
        ("evidence role bad", first_list_item("evidence", "role", "artifact")),
        ("evidence duplicate", duplicate_first("evidence")),
        ("relation target trailing bits", first_list_item("relations", "target", _trailing(DIGEST))),
        ("relation unknown", first_list_item("relations", "relation", "endorses")),
        ("relation contains", first_list_item("relations", "relation", "contains")),
        ("relation duplicate", duplicate_first("relations")),
        ("profile duplicate", duplicate_first("profiles")),
        ("profiles empty", payload_if("profiles", setter("payload", "profiles", value=[]))),
        ("extra not object", setter("payload", "extra", value=[1])),
        ("extra with numbers", setter("payload", "extra", value={"r": 0.5, "t": 1e-7, "big": 2**53 - 1})),
        ("extra astral keys", setter("payload", "extra", value={"\ue000": 1, "\U0001f600": 2})),
        ("verdict unknown", payload_if("verdict", setter("payload", "verdict", value="true"))),
        ("verdict reproduced", payload_if("verdict", setter("payload", "verdict", value="reproduced"))),
        ("target trailing bits", payload_if("target", lambda env: setter("payload", "target", value=_trailing(env["event"]["payload"]["target"]))(env))),
        ("reason empty", payload_if("reason", setter("payload", "reason", value=""))),
    ]


EVENT_MUTATIONS = list(_event_mutations())


def _envelope_mutations(env: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any] | bytes]]:
    yield "hash tampered", {**env, "hash": ("A" if env["hash"][0] != "A" else "B") + env["hash"][1:]}
    yield "hash trailing bits", {**env, "hash": _trailing(env["hash"])}
    yield "hash short", {**env, "hash": env["hash"][:-1]}
    yield "signature zeros", {**env, "signature": "A" * 86}
    yield "signature trailing bits", {**env, "signature": _trailing(env["signature"])}
    yield "signature flipped", {**env, "signature": env["signature"][:10] + ("A" if env["signature"][10] != "A" else "B") + env["signature"][11:]}
    yield "envelope extra field", {**env, "seq": 1}
    yield "envelope missing signature", {k: v for k, v in env.items() if k != "signature"}
    actor = env["event"]["actor"]
    other = {**env, "event": {**env["event"], "actor": _trailing(actor)}}
    yield "actor trailing bits", other
    rehashed = copy.deepcopy(other)
    rehashed["hash"] = _event_id(rehashed["event"])
    yield "actor trailing bits (hash recomputed)", rehashed
    yield "actor other key", {**env, "event": {**env["event"], "actor": "did:agent:6kpsY-KcUgq-9VB7Ey7F-ZVHdq6-vnuSQh7qaRRG0iw"}}
    raw = to_bytes(env)
    yield "text duplicate member", raw.replace(b'"nonce":', b'"nonce": 1, "nonce":', 1)
    yield "text NaN", raw.replace(b'"payload": {', b'"payload": {"x": NaN, ', 1)
    yield "text big integer", raw.replace(b'"payload": {', b'"payload": {"x": 9007199254740993, ', 1)
    yield "text lone surrogate", raw.replace(b'"payload": {', b'"payload": {"x": "\\ud800", ', 1)
    yield "text trailing garbage", raw + b" x"
    yield "text BOM", b"\xef\xbb\xbf" + raw
    yield "text utf-16", raw.decode("utf-8").encode("utf-16")
    yield "text invalid utf-8", raw.replace(b'"payload": {', b'"payload": {"x": "\xff", ', 1)


def _event_id(event: dict[str, Any]) -> str:
    from akrelay.protocol.envelope import event_hash

    return event_hash(event)


def generate(seed: int = 2026, per_mutation: int = 10, combinations: int = 500) -> list[tuple[str, bytes]]:
    """Labelled raw cases: valid fixtures, vector mutations and generated mutations."""
    rng = random.Random(seed)
    cases: list[tuple[str, bytes]] = []
    names = sorted(FIXTURES)
    for name in names:
        env = fixture_envelope(name)
        cases.append((f"fixture {name}", to_bytes(env)))
        for label, mutated in _envelope_mutations(env):
            cases.append((f"{label} [{name}]", mutated if isinstance(mutated, bytes) else to_bytes(mutated)))
    for label, mutate in EVENT_MUTATIONS:
        for name in rng.sample(names, per_mutation):
            mutated = mutate(fixture_envelope(name))
            if mutated is None:
                continue
            cases.append((f"{label} (unsigned) [{name}]", to_bytes(mutated)))
            signer = _signer_for(mutated["event"]) if isinstance(mutated.get("event"), dict) else None
            if signer is not None:
                cases.append((f"{label} (re-signed) [{name}]", to_bytes(signer.sign(mutated["event"]))))
    for group in ("schema_cases", "identity_cases"):
        for case in KNOWLEDGE[group]:
            if "raw_json" in case:
                cases.append((f"{group}: {case['name']}", case["raw_json"].encode("utf-8")))
                continue
            if case.get("definition", "signedEnvelope") != "signedEnvelope" or "fixture" not in case:
                continue
            mutated = apply_changes(fixture_envelope(case["fixture"]), case.get("changes", []))
            cases.append((f"{group}: {case['name']} (as in the vectors)", to_bytes(mutated)))
            if isinstance(mutated.get("event"), dict) and case.get("changes"):
                signer = fixture_signer(case["fixture"])
                cases.append((f"{group}: {case['name']} (re-signed)", to_bytes(signer.sign(mutated["event"]))))
    # Random combinations of two event mutations, re-signed, to reach interactions.
    for _ in range(combinations):
        name = rng.choice(names)
        env = fixture_envelope(name)
        labels = []
        for _ in range(2):
            label, mutate = rng.choice(EVENT_MUTATIONS)
            try:
                result = mutate(env)
            except (KeyError, TypeError, AttributeError):  # an earlier mutation removed the parent
                result = None
            if result is not None:
                env = result
                labels.append(label)
        signer = _signer_for(env["event"]) if isinstance(env.get("event"), dict) else None
        if labels and signer is not None:
            cases.append((f"{' + '.join(labels)} (re-signed) [{name}]", to_bytes(signer.sign(env["event"]))))
    return cases
