"""The future-skew rule of Agent Knowledge §8.1 step 4.

Knowledge events are portable history, so there is no lower bound: only an
event dated beyond the receiver's clock plus its skew allowance is refused.
The clock is the caller's (sans-I/O).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from akrelay.protocol.errors import ProtocolError

if TYPE_CHECKING:
    from akrelay.protocol.envelope import Envelope

DEFAULT_SKEW_MS = 300_000


def check_created_at(envelope: Envelope, now_ms: int, skew_ms: int = DEFAULT_SKEW_MS) -> None:
    """Raise ``timestamp_out_of_window`` when ``created_at > now_ms + skew_ms``."""
    created_at = envelope.event["created_at"]
    if created_at > now_ms + skew_ms:
        raise ProtocolError(
            "timestamp_out_of_window",
            f"created_at {created_at} is more than {skew_ms} ms ahead of the receiver clock {now_ms}",
            {"created_at": created_at, "now": now_ms, "skew_ms": skew_ms},
        )
