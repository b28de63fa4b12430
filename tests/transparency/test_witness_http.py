"""Witnesses over real served relays: C2SP add-checkpoint, and ``akrelay audit --witness … --quorum K``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from relay_harness import Served, start_relay
from test_audit_cli import envelope, submit, wait_for_checkpoint

from akrelay.cli import main

ADD = "/v1/knowledge/witness/add-checkpoint"


def discovery(served: Served) -> dict:
    return httpx.get(served.origin + "/.well-known/agent-knowledge", verify=served.ssl_context()).json()


def checkpoint(served: Served) -> str:
    return httpx.get(served.origin + "/v1/knowledge/checkpoint", verify=served.ssl_context()).text


def push(witness: Served, body: str) -> httpx.Response:
    return httpx.post(witness.origin + ADD, content=body.encode(), verify=witness.ssl_context(),
                      headers={"content-type": "text/plain"})


def proof_lines(log: Served, first: int, second: int) -> str:
    hashes = httpx.get(f"{log.origin}/v1/knowledge/proof/consistency?from={first}&to={second}",
                       verify=log.ssl_context()).json()["hashes"]
    return "".join(h + "\n" for h in hashes)


@pytest.mark.slow
def test_witnesses_cosign_pushed_checkpoints_and_audit_requires_a_quorum(tmp_path: Path, capsys) -> None:
    relays: list[Served] = []
    try:
        log = start_relay(tmp_path / "log")
        relays.append(log)
        submit(log, [envelope(i) for i in range(4)])
        wait_for_checkpoint(log, 4)
        log_vkey = discovery(log)["log"]["vkey"]
        peers = tmp_path / "peers.toml"  # the witnesses know the log by its pinned key (and do not sync from it)
        peers.write_text(f'[[peer]]\norigin = "{log.origin}"\nlog_key = "{log_vkey}"\nenabled = false\n')
        w1 = start_relay(tmp_path / "w1", extra=["--peers", str(peers)])
        relays.append(w1)
        w2 = start_relay(tmp_path / "w2", extra=["--peers", str(peers)])
        relays.append(w2)
        keys = [discovery(w)["log"]["witness"]["vkey"] for w in (w1, w2)]
        bundle = tmp_path / "bundle.pem"
        bundle.write_text("\n".join(r.cacert.read_text().strip() for r in relays) + "\n")
        state = tmp_path / "audit.json"

        def audit(*extra: str) -> tuple[int, str, str]:
            code = main(["audit", log.origin, "--cacert", str(bundle), "--state", str(state), "--key", log_vkey,
                         *[a for k in keys for a in ("--witness", k)], *extra])
            out, err = capsys.readouterr()
            return code, out, err

        code, _, err = audit("--quorum", "1")
        assert code == 1 and "quorum not met: 0 of 1" in err and err.count("missing: no cosigned checkpoint") == 2
        assert not state.exists()  # nothing is remembered from an audit that failed

        first = checkpoint(log)
        size1 = int(first.split("\n")[1])
        answer = push(w1, "old 0\n\n" + first)
        assert answer.status_code == 200, answer.text
        assert answer.text.startswith("\u2014 " + keys[0].split("+")[0] + " ") and answer.text.endswith("\n")
        # the usual error format for each refusal
        for body, status, code_name in [
            (f"old {size1 + 0}\n\n" + first.replace("\n\n", "\n\nX"), 400, "invalid_request"),
            ("old 0\n\n" + first, 409, "checkpoint_conflict"),
            ("old 0\n\n" + first.replace("localhost:", "elsewhere:"), 404, "not_found"),
            ("garbage", 400, "invalid_request"),
        ]:
            refused = push(w1, body)
            assert refused.status_code == status, (body, refused.text)
            assert refused.json()["error"]["code"] == code_name
        assert push(w1, "old 0\n\n" + first).json()["error"]["data"] == {"size": size1}
        assert push(w1, "x" * 300_000).status_code == 413

        code, out, err = audit("--quorum", "1")
        assert code == 0, err
        assert "1 of 2 witnesses cosigned" in out and "missing" in err  # w2 is said to be missing
        code, _, err = audit("--quorum", "2")
        assert code == 1 and "quorum not met: 1 of 2" in err and keys[1].split("+")[0] in err

        # the log grows; w2 cosigns the old checkpoint, w1 the new one (with the log's consistency proof)
        submit(log, [envelope(i) for i in range(4, 9)])
        wait_for_checkpoint(log, size1 + 5)
        assert push(w2, "old 0\n\n" + first).status_code == 200
        second = checkpoint(log)
        size2 = int(second.split("\n")[1])
        good = proof_lines(log, size1, size2)
        bad = ("B" if good[0] != "B" else "C") + good[1:]  # the first hash changed
        assert push(w1, f"old {size1}\n{bad}\n" + second).json()["error"]["code"] == "inconsistent_checkpoint"
        answer = push(w1, f"old {size1}\n{good}\n" + second)
        assert answer.status_code == 200, answer.text
        code, out, err = audit("--quorum", "2")
        assert code == 0, err
        assert "2 of 2 witnesses cosigned" in out
        assert f"cosigned size {size1}" in err and f"cosigned size {size2}" in err
        # `akrelay witness LOG WITNESS`: w2 cosigned size1, so its first push (old 0) is a 409 and the
        # second carries the log's consistency proof from size1
        submit(log, [envelope(i) for i in range(9, 11)])
        wait_for_checkpoint(log, size2 + 2)
        assert main(["witness", log.origin, w2.origin, "--cacert", str(bundle), "--key", log_vkey]) == 0
        note = capsys.readouterr().out
        assert int(note.split("\n")[1]) >= size2 + 2 and note.count("\u2014 ") == 2
        code, out, err = audit("--quorum", "2")
        assert code == 0, err
        assert main(["witness", log.origin, w2.origin, "--cacert", str(bundle), "--key", keys[0]]) == 1  # not a log key
        assert "not a valid verifier key" in capsys.readouterr().err
        # a bad witness key is a usage error
        assert main(["audit", log.origin, "--cacert", str(bundle), "--witness", log_vkey]) == 2
        assert "cosignature/v1" in capsys.readouterr().err
    finally:
        for relay in relays:
            relay.stop()
