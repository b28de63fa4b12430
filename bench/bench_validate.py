"""Full validation of one typical signed knowledge.publish: akrelay core vs the agent-protocols SDK.

Both sides start from the raw request bytes and do strict parse + schema-level
shape + JCS + SHA3-256 + Ed25519 + payload rules. Run on one core:

    python3 bench/bench_validate.py [--seconds 1] [--rounds 5]

Rates are envelopes per CPU second of this single-threaded process, the two
sides alternating round by round so that both see the same machine state;
the best round of each side counts. Prints both rates; the last line is
``validate_ratio: <ours/sdk> x``.
"""

from __future__ import annotations

import argparse
import json
import time

from akrelay.protocol.envelope import verify_envelope
from akrelay.protocol.payload import check_payload_rules
from akrelay.protocol.signer import Signer, publish_event

NOW = 1790553600000


def typical_envelope() -> bytes:
    """A realistic capsule of about 1.9 KiB: evidence, relations, reproduction, tags, one profile."""
    signer = Signer.from_seed(bytes([0x21]) * 32)
    payload = {
        "license": "https://creativecommons.org/licenses/by/4.0/",
        "kind": "observation",
        "title": "Retrieval warm-cache p99 latency drops 38% with a 256 MiB LRU",
        "statement": (
            "On the staging cluster, enabling a 256 MiB in-process LRU in front of the embedding store "
            "reduced warm-cache p99 latency from 182 ms to 113 ms over 40,000 replayed production queries, "
            "with no change in recall@10."
        ),
        "language": "en",
        "context": {
            "scope": "Retrieval service v3.2 on staging, replayed query logs",
            "conditions": ["warm cache after a 10 minute ramp", "LRU sized 256 MiB"],
            "limitations": ["single region", "synthetic replay timing"],
        },
        "basis": "Three replays with and without the cache; medians reported.",
        "evidence": [
            {
                "url": "https://example.com/runs/2026-09-27/latency.csv",
                "description": "Per-query latency samples",
                "digest": "JC3JB0-_nifwwWoPybM5fRubk5jbuqkHqFvU5bsd8xo",
                "media_type": "text/csv",
                "role": "output",
            },
        ],
        "reproduction": {
            "environment": "staging cluster, 8 workers, Python 3.11",
            "steps": ["replay the query log without the cache", "enable the cache", "replay again"],
            "expected": "p99 latency lower with the cache and identical recall@10",
            "observed": "p99 182 ms -> 113 ms; recall@10 0.912 in both",
        },
        "relations": [
            {"relation": "tests", "target": "KWtF8pK-1nNmrbW3iC6AYFBv0Lmd4ZB0cDLuVM1pu7Q"},
            {"relation": "derived_from", "target": "2T6rjsDWzA-1dYQ0rbCR0tZIPlnKHLMCsMH3XP1tqjk"},
        ],
        "tags": ["caching", "latency", "retrieval"],
        "profiles": [
            {
                "profile": {
                    "url": "https://example.com/profiles/latency-report-v1.txt",
                    "digest": "xkLXwXyg7sF7PzJ0kYQ0rbCR0tZIPlnKHLMCsMH3XPA",
                },
                "data": {"percentile": "p99", "unit": "ms", "runs": 3},
            }
        ],
        "extra": {"ticket": "PERF-1432"},
    }
    event = publish_event(signer.agent_id, NOW, NOW, payload)
    return json.dumps(signer.sign(event), ensure_ascii=False).encode("utf-8")


def ours(raw: bytes) -> None:
    check_payload_rules(verify_envelope(raw))


def sdk(raw: bytes) -> None:
    from agent_protocols.knowledge import parse_knowledge_envelope

    parse_knowledge_envelope(raw)


def _signature_only(raw: bytes):
    """Just the strict Ed25519 check of the same envelope: the upper bound for any validator."""
    import hashlib

    from akrelay.protocol.b64 import b64decode_canonical
    from akrelay.protocol.ed25519 import verify_strict

    envelope = verify_envelope(raw)
    key = b64decode_canonical(envelope.actor[len("did:agent:") :], length=32)
    digest = hashlib.sha3_256(envelope.event_jcs).digest()
    signature = b64decode_canonical(envelope.signature, length=64)
    return lambda _raw: verify_strict(key, digest, signature)


def rate(fn, raw: bytes, seconds: float) -> float:
    """Envelopes per CPU second of this process (robust to other load on a shared machine)."""
    count, start = 0, time.process_time()
    deadline = start + seconds
    while True:
        for _ in range(20):
            fn(raw)
        count += 20
        now = time.process_time()
        if now >= deadline:
            return count / (now - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per side per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; the best round of each side counts")
    args = parser.parse_args()
    raw = typical_envelope()
    print(f"envelope_bytes: {len(raw)} B")
    try:
        sdk(raw)  # the SDK must accept the envelope too, or the comparison is meaningless
    except ImportError:
        sdk_available = False
    else:
        sdk_available = True
    ours(raw)
    best_ours = best_sdk = 0.0
    for _ in range(args.rounds):
        best_ours = max(best_ours, rate(ours, raw, args.seconds))
        if sdk_available:
            best_sdk = max(best_sdk, rate(sdk, raw, args.seconds))
    print(f"akrelay_validate: {best_ours:.0f} envelopes/s (one core, CPU time, best of {args.rounds})")
    print(f"ed25519_verify_only: {rate(_signature_only(raw), raw, args.seconds):.0f} signatures/s (the ceiling)")
    if not sdk_available:
        print("sdk_validate: unavailable (pip install agent-protocols==0.12.6)")
        return
    print(f"sdk_validate: {best_sdk:.0f} envelopes/s (one core, CPU time, best of {args.rounds})")
    print(f"validate_ratio: {best_ours / best_sdk:.2f} x")


if __name__ == "__main__":
    main()
