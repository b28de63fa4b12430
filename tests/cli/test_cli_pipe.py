"""A closed stdout (``akrelay ... | head``) ends the command quietly, with status 0."""

from __future__ import annotations

import os
import subprocess
import sys


def test_closed_stdout_is_not_a_traceback() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes anything
    proc = subprocess.run(
        [sys.executable, "-m", "akrelay", "knowledge", "terms", "cache language"],
        stdout=write_end, stderr=subprocess.PIPE, timeout=60,
    )
    os.close(write_end)
    assert proc.returncode == 0
    assert b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr
