"""Answers that answer (issue 22): the fact first, from the capsule that holds it, with its belief, in any shape."""

from __future__ import annotations

from akrelay.knowql import extract

from .conftest import validator
from .kq_harness import knowql_app

QUERY = validator("Query")


def _text(doc):
    return "".join(part["text"] for item in doc["output"] for part in item["content"])


def _lead(doc):
    return _text(doc).split("\n", 1)[0]


def _world(kq):
    """Capsules on nearby topics: the accepted ones share words with the questions that others answer."""
    c = kq.corpus
    cold = c.publish("alice", "Cold cache after a restart",
                     "After a restart the query cache stays cold for about 40 seconds while it refills.")
    warm = c.publish("bob", "Pre-warming the query cache",
                     "Replaying the last hour of queries at boot pre-warms the cache and avoids the cold period.",
                     relations=(("extends", cold["hash"]),))
    restart = c.publish("carol", "Restart procedure for the cache nodes",
                        "Restart the cache nodes one at a time and check the cache hit rate after each restart.")
    moon = c.publish("dave", "Server crashes and the full moon", "Server crashes are more frequent during a full moon.",
                     kind="hypothesis")
    fsync = c.publish("alice", "fsync and server crashes",
                      "Calling fsync after every write stopped data loss when servers crashed.")
    mtu = c.publish("bob", "VPN handshake failures", "Lowering the tunnel MTU to 1380 bytes fixed the VPN handshakes.")
    timeout = c.publish("carol", "API gateway timeout", "The API gateway closes upstream requests after 30 seconds.")
    friday = c.publish("dave", "Friday deployments", "Deployments on Friday cause more incidents than on other days.")
    mercury = c.publish("alice", "Mercury retrograde and disk failures",
                        "Disks fail 3 times more often while Mercury is in retrograde.")
    kq.submit(cold, warm, restart, moon, fsync, mtu, timeout, friday, mercury,
              c.assess("bob", mercury["hash"], "challenges", "Astrology."),
              c.assess("carol", mercury["hash"], "challenges", "No such effect in our fleet."),
              c.assess("carol", restart["hash"], "supports", "This is our runbook."),
              c.assess("bob", fsync["hash"], "supports", "Confirmed after the power cut."),
              c.assess("alice", moon["hash"], "challenges", "No correlation in a year of incidents."),
              c.assess("bob", moon["hash"], "challenges", "The incident data do not show it."),
              c.assess("alice", friday["hash"], "supports", "Our numbers agree."),
              c.assess("bob", friday["hash"], "challenges", "Not in our data."),
              c.assess("carol", friday["hash"], "challenges", "Could not reproduce."),
              c.assess("dave", mtu["hash"], "supports", "Packet captures agree."))
    return {k: v["hash"] for k, v in locals().items() if isinstance(v, dict) and "hash" in v}


def test_the_first_line_states_the_fact_from_the_capsule_that_answers() -> None:
    with knowql_app() as kq:
        ids = _world(kq)
        doc = kq.ask({"ask": "How long does the cache stay cold after a restart?", "scope": ["knowledge"]}).json()
        QUERY.validate(doc)
        # The unconfirmed capsule that answers leads, not the accepted one that shares "cache" and "restart".
        assert doc["citations"][0]["source"] == ids["cold"]
        lead = _lead(doc)
        assert lead.startswith("Unconfirmed (only its author supports it): 40 seconds: After a restart") \
            and lead.endswith("[1]")
        # The grouped evidence follows the lead, as before, and every marker is a citation of the turn.
        assert "\nFindings (accepted):\n" in _text(doc) or "\nUnconfirmed:\n" in _text(doc)
        for n in range(1, len(doc["citations"]) + 1):
            assert f"[{n}]" in _text(doc)
        # How many / which: the unit-bearing number, the sentence; accepted says so.
        mtu = kq.ask({"ask": "What tunnel MTU fixed the VPN handshakes?", "scope": ["knowledge"]}).json()
        assert mtu["citations"][0]["source"] == ids["mtu"]
        assert "1380 bytes" in _lead(mtu) and "(accepted; 1 supporting assessment)" in _lead(mtu)
        # Yes/no: Yes for an accepted claim that says so.
        yes = kq.ask({"ask": "Does calling fsync after every write stop data loss?", "scope": ["knowledge"]}).json()
        assert _lead(yes).startswith("Yes: Calling fsync") and yes["citations"][0]["source"] == ids["fsync"]
        # The same snapshot gives the same answer.
        again = kq.ask({"ask": "How long does the cache stay cold after a restart?", "scope": ["knowledge"]}).json()
        assert _text(again) == _text(doc) and again["citations"] == doc["citations"]


def test_a_rejected_or_contested_best_answer_is_flagged_in_the_first_line() -> None:
    with knowql_app() as kq:
        ids = _world(kq)
        doc = kq.ask({"ask": "Are server crashes more frequent during a full moon?", "scope": ["knowledge"]}).json()
        assert doc["citations"][0]["source"] == ids["moon"] and doc["citations"][0]["belief"] == "rejected"
        assert _lead(doc) == ("No: two assessors rejected the claim \u201cServer crashes and the full moon\u201d "
                              "(2 rejecting / 0 supporting); it is not stated as fact [1]")
        assert "are more frequent during a full moon" not in _text(doc)  # never stated as fact
        contested = kq.ask({"ask": "Do Friday deployments cause more incidents?", "scope": ["knowledge"]}).json()
        assert contested["citations"][0]["source"] == ids["friday"]
        assert _lead(contested).startswith("Unclear: Contested (1 supporting assessment, 2 rejecting assessments): ")


def test_a_question_nothing_answers_is_declined_without_citations() -> None:
    with knowql_app() as kq:
        _world(kq)
        # Words in common ("cache", "restart", "server") are not an answer.
        for ask in ("How many engineers maintain the cache servers?", "What is the MTU of the storage network?",
                    "How long does the espresso machine take to heat up after a restart?"):
            doc = kq.ask({"ask": ask, "scope": ["knowledge"]}).json()
            assert doc["status"] == "completed" and doc["citations"] == [], (ask, _lead(doc))
            assert _lead(doc).startswith("Nothing in scope answers this question"), ask
        shaped = kq.ask({"ask": "How many engineers maintain the cache servers?", "scope": ["knowledge"],
                         "shape": {"type": "object", "properties": {"found": {"type": "boolean"},
                                                                    "value": {"type": ["number", "null"]}}}}).json()
        assert shaped["output_json"] == {"found": False, "value": None}


def test_shape_fields_are_filled_from_the_answering_sentence_with_provenance() -> None:
    with knowql_app() as kq:
        ids = _world(kq)
        shape = {"type": "object", "additionalProperties": False, "properties": {
            "value": {"type": "number"}, "unit_note": {"type": "string", "enum": ["bytes", "seconds"]}}}
        doc = kq.ask({"ask": "What tunnel MTU in bytes fixed the VPN handshakes?", "scope": ["knowledge"],
                      "shape": shape}).json()
        QUERY.validate(doc)
        assert doc["status"] == "completed" and doc["output_json"] == {"value": 1380, "unit_note": "bytes"}
        provenance = doc["akrelay"]["provenance"]["value"]
        assert provenance["source"] == ids["mtu"] and provenance["citation"] == 1 and "1380" in provenance["sentence"]
        # The unit the field names is the unit it gets (30 s -> 30000 ms); a boolean is the yes/no answer.
        timeout = kq.ask({"ask": "What is the API gateway's upstream timeout?", "scope": ["knowledge"],
                          "shape": {"type": "object", "properties": {"timeout_ms": {"type": "integer"}}}}).json()
        assert timeout["output_json"] == {"timeout_ms": 30000}
        yes = kq.ask({"ask": "Does calling fsync after every write stop data loss?", "scope": ["knowledge"],
                      "shape": {"type": "object", "properties": {"stops": {"type": "boolean"}}}}).json()
        assert yes["output_json"] == {"stops": True}
        # A rejected claim fills nothing as fact but its "No"; unsupported fields are left out (or null).
        moon = kq.ask({"ask": "Are server crashes more frequent during a full moon?", "scope": ["knowledge"],
                       "shape": {"type": "object", "properties": {"more_frequent": {"type": "boolean"},
                                                                  "rate": {"type": "number"},
                                                                  "note": {"type": ["string", "null"]}}}}).json()
        assert moon["output_json"] == {"more_frequent": False, "note": None}
        untyped = kq.ask({"ask": "What tunnel MTU in bytes fixed the VPN handshakes?", "scope": ["knowledge"],
                          "shape": {"type": "object", "properties": {"qualifies": {}, "mtu": {"type": "string"}}}}).json()
        assert untyped["output_json"] == {"mtu": "1380 bytes"}
        # Contested by assessors with only its author behind it: reported, neither stated nor used for shape.
        mercury = kq.ask({"ask": "How many times more often do disks fail while Mercury is in retrograde?",
                          "scope": ["knowledge"], "shape": {"type": "object", "properties": {
                              "factor": {"type": "number"}}}}).json()
        assert mercury["citations"][0]["source"] == ids["mercury"] and mercury["output_json"] == {}
        assert _lead(mercury).startswith("Contested: two assessors rejected the claim \u201cMercury retrograde")
        assert "3 times more often" not in _text(mercury).split("\n\n", 1)[0]
        # A required field nothing supports still fails the turn (never invented).
        failed = kq.ask({"ask": "What tunnel MTU fixed the VPN handshakes?", "scope": ["knowledge"], "shape": {
            "type": "object", "properties": {"latency_ms": {"type": "number"}}, "required": ["latency_ms"]}}).json()
        assert failed["status"] == "failed" and "'latency_ms'" in failed["error"]


def test_a_follow_up_resolves_against_the_previous_turn_and_prefers_what_was_not_cited() -> None:
    with knowql_app() as kq:
        ids = _world(kq)
        first = kq.ask({"ask": "How long does the cache stay cold after a restart?", "scope": ["knowledge"]}).json()
        assert first["citations"][0]["source"] == ids["cold"]
        follow = kq.ask({"ask": "And how can that be avoided?", "session_id": first["session_id"]}).json()
        assert follow["citations"][0]["source"] == ids["warm"], _lead(follow)
        assert "pre-warms the cache" in _lead(follow)
        # Without the session, the same short ask has too little to go on.
        alone = kq.ask({"ask": "And how can that be avoided?", "scope": ["knowledge"]}).json()
        assert not alone["citations"] or alone["citations"][0]["source"] != ids["warm"] or \
            _lead(alone).startswith("Nothing")


def test_sentences_quantities_and_question_types() -> None:
    assert extract.sentences("It took 1.5 s, e.g. on SSDs. Then 3 retries. Done") == [
        "It took 1.5 s, e.g. on SSDs.", "Then 3 retries.", "Done"]
    found = extract.quantities("about 40 seconds, 1,380 bytes, 3 retries, 22 °C, twelve minutes and 85%")
    assert [(q.value, q.unit) for q in found] == [(40, "s"), (1380, "B"), (3, None), (22, "°C"), (12, "min"),
                                                  (85, "%")]
    assert extract.convert(found[4], "s") == 720 and extract.convert(found[1], "s") is None
    kinds = {ask: extract.question_type(ask).kind for ask in (
        "How long does it take?", "How many replicas are there?", "Why does it fail?", "Is it rejected?",
        "Which collector is used?", "At what temperature does it throttle?", "How much log data per day?")}
    assert list(kinds.values()) == ["duration", "count", "why", "yesno", "which", "quantity", "quantity"]
    assert extract.question_type("How much log data per day?").unit_class is None  # "per day" is a rate
    assert extract.unit_of_name("timeout_ms") == ("time", "ms") and extract.unit_of_name("mtu_bytes") == ("size", "B")


def test_a_huge_hostile_statement_is_read_in_bounded_time() -> None:
    """Sentence splitting and the unit grammar stay linear: long digit runs and abbreviation chains."""
    with knowql_app() as kq:
        c = kq.corpus
        # Within the relay's 16,384-character statement limit.
        hostile = "The disk quota is 5 GB. " + "1" * 8_000 + "a1 " + "e.g. X " * 1_100 + "9" * 500 + "x9"
        big = c.publish("alice", "Disk quota", hostile)
        kq.submit(big, c.assess("bob", big["hash"], "supports", "Yes."))
        doc = kq.ask({"ask": "How big is the disk quota?", "scope": ["knowledge"], "timeout_seconds": 5}).json()
        assert doc["status"] == "completed", doc.get("error")  # milliseconds here, 5 s is generous; quadratic reading took ~15 s
        assert doc["citations"][0]["source"] == big["hash"] and _lead(doc).startswith("5 GB: The disk quota is 5 GB")
