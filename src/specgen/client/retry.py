"""Pure helpers for the engine's retry policy: jittered backoff and rate-limit headers.

The client never retries by itself; it classifies the failure and reports how long the server
asked us to wait. The engine decides whether and when to try again.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Protocol


class _Rng(Protocol):
    def random(self) -> float: ...

    def uniform(self, a: float, b: float) -> float: ...


def backoff_delay(
    attempt: int,
    *,
    base: float = 1.0,
    cap: float = 60.0,
    retry_after: float | None = None,
    rng: _Rng = random,  # type: ignore[assignment]
) -> float:
    """Seconds to wait before retry number `attempt` (1 = the first retry).

    Full-jitter exponential backoff: uniform(0, min(cap, base * 2**(attempt-1))). A server's
    Retry-After is a floor: the delay is never shorter than it, spread over up to 10% more so
    that requests refused together do not all come back in the same instant.
    """
    attempt = max(1, int(attempt))
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 62))
    delay = rng.uniform(0.0, max(0.0, ceiling))
    if retry_after is not None and math.isfinite(retry_after) and retry_after > 0:
        floor = retry_after * (1.0 + 0.1 * rng.random())
        delay = max(delay, floor)
    return delay


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta seconds or an HTTP date. None if absent
    or unreadable; never negative."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        seconds = when - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def parse_rate_limit_reset(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds until an `X-RateLimit-Reset` moment. OpenRouter sends Unix milliseconds; other
    servers send Unix seconds or a delta in seconds, told apart by size."""
    if not value:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(number) or number < 0:
        return None
    now = time.time() if now is None else now
    if number > 1e11:  # Unix milliseconds
        return max(0.0, number / 1000.0 - now)
    if number > 1e9:  # Unix seconds
        return max(0.0, number - now)
    return number  # already a delta


def retry_after_from_headers(headers: Mapping[str, str], *, now: float | None = None
                             ) -> float | None:
    """The wait a response asks for: Retry-After first, else X-RateLimit-Reset."""
    wait = parse_retry_after(headers.get("Retry-After"), now=now)
    if wait is None:
        wait = parse_rate_limit_reset(headers.get("X-RateLimit-Reset"), now=now)
    return wait
