"""KIP protocol timestamps (§6.5): UTC, exactly millisecond precision, ``...SSSZ``.

agent-knowledge carries integer milliseconds; KIP carries strings. Conversion is
exact in both directions, so nothing is rounded on the way in or out.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from functools import lru_cache

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_FORMAT = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{3})Z$")


@lru_cache(maxsize=8192)
def kip_timestamp(ms: int) -> str:
    """``1790553600000`` -> ``"2026-09-28T00:00:00.000Z"``."""
    moment = _EPOCH + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_kip_timestamp(text: str) -> int:
    """Strictly parse a §6.5 timestamp to epoch ms; ``ValueError`` on any other form."""
    match = _FORMAT.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError("not a KIP timestamp (YYYY-MM-DDTHH:mm:ss.SSSZ)")
    y, mo, d, h, mi, s, ms = (int(g) for g in match.groups())
    moment = datetime(y, mo, d, h, mi, s, ms * 1000, tzinfo=timezone.utc)
    return (moment - _EPOCH) // timedelta(milliseconds=1)
