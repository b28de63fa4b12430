"""KQL REGEX cost on hostile patterns (issue 11): RE2 (the engine) against the alternatives.

For each pattern of the issue, times one unanchored search with

* ``re2`` (google-re2, what ``akrelay.kip.kql.regex`` uses) at the issue's size
  and at the 65,536-character subject limit;
* the ``regex`` package with its ``timeout`` (if installed), the budgeted
  alternative: it can only stop a match when its time is up, so every row of a
  FILTER pays the whole timeout;
* Python ``re`` (the previous engine) at sizes small enough to finish, to show
  the growth.

Times are thread CPU time. Last line: ``regex_re2_worst: <value> ms`` (the
slowest RE2 search over all patterns and sizes).

    python3 bench/bench_regex.py [--regex-timeout 1.0]
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from akrelay.kip.kql.regex import MAX_SUBJECT, compile_regex  # noqa: E402

def _ab(n: int) -> str:
    return "".join(random.Random(1).choice("ab") for _ in range(n))


CASES = [
    # pattern, subject builder, issue size, sizes Python re can finish
    ("^(a|a){1,27}c", lambda n: "a" * n, 200, (16, 20, 22)),
    ("a*a*a*c", lambda n: "a" * n, 401, (100, 200, 401)),
    ("(a|a)*c", lambda n: "a" * n, 60, (16, 20, 22)),
    ("(a+)+b", lambda n: "a" * n, 60, (16, 20, 22)),
    ("(x+x+)+y", lambda n: "x" * n, 60, (10, 12, 14)),
    # a DFA that outgrows its cache: RE2 stays linear, with its largest constant
    ("(a|b)*a(a|b){20}c$", lambda n: _ab(n - 1) + "c", 4096, ()),
    ("(a|b)*a(a|b){40}(a|b)*b", lambda n: _ab(n - 1) + "c", 4096, ()),
]


def cpu_ms(fn) -> float:
    start = time.thread_time()
    fn()
    return (time.thread_time() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--regex-timeout", type=float, default=1.0, help="timeout for the regex package, seconds")
    args = parser.parse_args()
    try:
        import regex as budgeted
    except ImportError:
        budgeted = None
    worst = 0.0
    for pattern, subject, size, re_sizes in CASES:
        compiled = compile_regex(pattern)
        for n in (size, MAX_SUBJECT):
            text = subject(n)
            ms = cpu_ms(lambda: compiled.search(text))
            worst = max(worst, ms)
            print(f"re2    {pattern!r:24} n={n:6}  {ms:9.3f} ms")
        if budgeted is not None:
            text = subject(size)
            outcome: list[str] = []

            def timed() -> None:
                try:
                    budgeted.compile(pattern).search(text, timeout=args.regex_timeout)
                except TimeoutError:
                    outcome.append(" (timed out)")

            ms = cpu_ms(timed)
            print(f"regex  {pattern!r:24} n={size:6}  {ms:9.3f} ms{''.join(outcome)}")
        for n in re_sizes:
            text = subject(n)
            python = re.compile(pattern)
            print(f"re     {pattern!r:24} n={n:6}  {cpu_ms(lambda: python.search(text)):9.3f} ms")
    print(f"regex_re2_worst: {worst:.3f} ms")


if __name__ == "__main__":
    main()
