"""Adaptive concurrency (AIMD): fewer requests in flight when the API pushes back, more again
as answers succeed; never above the configured `concurrency` nor below `min_concurrency`.

Congestion signals are rate limits (429) and overload (503/529). Timeouts are not: on a router
a stalled provider times out whatever the load, and shrinking the window would only slow the
healthy providers (each timed-out request is retried with backoff anyway).

One decrease per window: a 429 only shrinks the limit if its request was dispatched after the
last decrease (the requests already in flight were sent under the old limit and say nothing
about the new one), as TCP does per round trip.
"""

from __future__ import annotations

import time
from collections.abc import Callable

CONGESTION_KINDS = frozenset({"rate_limit", "overloaded"})


class AdaptiveLimit:
    """The current in-flight limit. `epoch` stamps dispatches (see `on_congestion`)."""

    def __init__(
        self, maximum: int, minimum: int = 1, *, enabled: bool = True,
        decrease: float = 0.7, recover_step: float = 0.05, min_interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.maximum = max(1, maximum)
        self.minimum = max(1, min(minimum, self.maximum))
        self.enabled = enabled
        self.decrease = decrease
        self.step = max(1, round(self.maximum * recover_step))
        self.min_interval = min_interval
        self.clock = clock
        self.limit = self.maximum
        self.epoch = 0
        self.backoffs = 0  # number of decreases so far
        self.last_reason: str | None = None
        self._successes = 0
        self._last_decrease = float("-inf")

    def on_success(self) -> None:
        """An answer came back: after about a quarter window of successes, grow by one step."""
        if self.limit >= self.maximum:
            return
        self._successes += 1
        if self._successes * 4 >= self.limit:
            self._successes = 0
            self.limit = min(self.maximum, self.limit + self.step)

    def on_error(self, kind: str, epoch: int) -> bool:
        """A request dispatched at `epoch` failed with class `kind`; True if the limit shrank."""
        if not self.enabled or kind not in CONGESTION_KINDS:
            return False
        now = self.clock()
        if epoch < self.epoch or now - self._last_decrease < self.min_interval:
            return False
        new = max(self.minimum, int(self.limit * self.decrease))
        self._last_decrease = now
        self._successes = 0
        self.last_reason = kind
        self.epoch += 1
        if new == self.limit:
            return False
        self.limit = new
        self.backoffs += 1
        return True
