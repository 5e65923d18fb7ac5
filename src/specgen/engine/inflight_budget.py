"""Budget-aware concurrency: keep the estimated cost of what is in flight under what the
account accepts.

OpenRouter estimates every paid request (prompt + `max_tokens` at the endpoint's prices) and
refuses new ones with 402 `in_flight_budget_exhausted` while the running ones fill the
account's in-flight budget, a cap that depends on the balance. So the number of requests that
fit depends on their size, not on a count: 2,000 requests of `max_tokens = 16384` may need a
budget that 150 fill.

The engine cannot ask for the budget; it learns it. Each refusal is an upper bound: the weight
that was in flight when the refused request was sent, plus the request itself. The cap is set a
little below the tightest recent bound, so the run settles just under what the account allows
instead of bouncing on 402s. While the cap is what holds requests back, successes grow it:
slowly near the last bound (0.5% per round trip), faster once well past it with no refusal
(5%), so a topped-up account is found again. A request is always allowed when nothing is in flight.

Weights are dollars when prices are known, else tokens (prompt + max_tokens): the cap is
learned in the same unit, so either works.
"""

from __future__ import annotations

import math
from typing import Any

BELOW_BOUND = 0.9  # the cap after a refusal, as a share of the bound it gave
NEAR_BOUND = 1.1  # up to this share of the last bound the cap grows slowly ...
SLOW_GROWTH = 0.005  # ... by this much per round trip of successes (settling under it)
FAST_GROWTH = 0.05  # beyond it no refusal came: the budget grew (credits added), find it


class InFlightBudget:
    """The learned in-flight weight cap (None until the account first refuses)."""

    def __init__(self, unit: str = "usd"):
        self.unit = unit  # "usd" or "tokens"
        self.cap: float | None = None
        self.bound: float | None = None  # the bound of the refusal that set the cap last
        self.refusals = 0
        self._typical = 0.0  # a running mean of request weights, for the shown limit

    def admits(self, weight: float, in_flight_weight: float, in_flight: int) -> bool:
        """May a request of `weight` be sent with `in_flight_weight` already running?"""
        self._typical = weight if not self._typical else 0.98 * self._typical + 0.02 * weight
        cap = self.cap
        return cap is None or in_flight == 0 or in_flight_weight + weight <= cap

    def on_refused(self, weight_before: float, weight: float) -> bool:
        """A request sent with `weight_before` in flight was refused for the in-flight budget.
        True when the cap went down."""
        self.refusals += 1
        bound = weight_before + weight
        new = max(weight, BELOW_BOUND * bound)
        if self.cap is None or new < self.cap:
            self.cap, self.bound = new, bound
            return True
        return False

    def on_success(self, in_flight_weight: float, in_flight: int) -> None:
        """An answer came back; grow the cap if it is what holds requests back."""
        cap = self.cap
        if cap is None or in_flight_weight + self._typical <= BELOW_BOUND * cap:
            return
        near = self.bound is not None and cap < NEAR_BOUND * self.bound
        rate = SLOW_GROWTH if near else FAST_GROWTH
        self.cap = cap * (1.0 + rate / max(1, in_flight))

    def limit_for(self, configured: int) -> int:
        """How many typical requests fit under the cap (the configured count when no cap)."""
        if self.cap is None or not self._typical:
            return configured
        return max(1, min(configured, math.floor(self.cap / self._typical)))

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "cap": None if self.cap is None else round(self.cap, 6),
                "last_bound": None if self.bound is None else round(self.bound, 6),
                "refusals": self.refusals}

    def note(self, configured: int) -> str:
        """What a 402 in_flight_budget taught, in words (for the event log and the log)."""
        cap = ((f"${self.cap:.4f}" if self.unit == "usd" else f"{self.cap:,.0f} tokens")
               if self.cap else "-")
        return (f"402 in_flight_budget_exhausted: the account's in-flight budget holds about "
                f"{self.limit_for(configured)} requests like these (estimated cost in "
                f"flight kept under {cap}); concurrency follows it")
