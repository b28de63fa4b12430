"""Run ``akrelay sync --once`` several times in this process; report time and memory of each run.

Usage: ``python sync_once_probe.py SPEC.json``, where SPEC is ``{"runs": [{"name", "args"}]}``.
Prints one JSON line per run: exit code, seconds, RSS before the run and peak RSS
during it (the kernel's high-water mark, reset before each run), and its stdout.
The first run should be a warm-up, so that imports are not counted against the others.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import sys
import time

from akrelay.cli import main


def status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def run(spec: dict) -> None:
    for item in spec["runs"]:
        gc.collect()
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
        base = status_kb("VmRSS")
        out = io.StringIO()
        start = time.monotonic()
        with contextlib.redirect_stdout(out):
            code = main(item["args"])
        seconds = time.monotonic() - start
        print(json.dumps({"name": item["name"], "rc": code, "seconds": seconds, "base_kb": base,
                          "peak_kb": status_kb("VmHWM"), "stdout": out.getvalue()}), flush=True)


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        run(json.load(fh))
