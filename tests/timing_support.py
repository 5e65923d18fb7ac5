"""What timing-sensitive tests share: the "faster machine" knob.

No test compares a duration or CPU time with an absolute number (machines differ 3×); a test
whose property needs a workload heavy enough to be seen (an answer that takes a while to
judge, a loop long enough to show its cost per token) sizes it here, so the suite can be run
as if on a faster machine:

    SPECGEN_TEST_FASTER=3 python -m pytest -m timing

shrinks those workloads 3×; each such test then still holds, by calibrating against what it
measured itself (see tests/test_loop_stall.py).
"""

from __future__ import annotations

import os


def faster() -> float:
    """How many times faster than this machine the timing-sensitive tests act as if they ran
    (SPECGEN_TEST_FASTER, default 1): their workloads are divided by it."""
    raw = os.environ.get("SPECGEN_TEST_FASTER", "1")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"SPECGEN_TEST_FASTER must be a number, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"SPECGEN_TEST_FASTER must be > 0, got {raw!r}")
    return value


def scaled(size: float, minimum: float = 1) -> float:
    """`size` of a timing-sensitive workload as this run wants it (divided by `faster()`)."""
    return max(minimum, size / faster())
