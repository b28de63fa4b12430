"""Suite-wide test settings.

Hypothesis explores new random examples on every local run. Under CI (``CI`` set)
it runs derandomized, so a submission's result does not depend on the draw: a
counterexample found locally becomes a regression test, not a coin flip in CI.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
