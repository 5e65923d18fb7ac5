"""Account budgets the simulator enforces like OpenRouter: the in-flight spending budget (402)
and guardrail / workspace / key spend budgets (403). See docs/sim.md, "Budgets".

The in-flight budget weighs every admitted chat request by its worst-case cost (prompt tokens
at the prompt price plus `max_tokens` at the completion price) and holds that weight until the
request finishes in any way, then `linger_s` seconds more. A request whose own weight is above
the budget is refused for good (`weight_exceeds_budget`); one that does not fit next to the
running weight is refused with a `Retry-After` (`in_flight_budget_exhausted`).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from .config import SPEND_LIMIT_SCOPES, SimConfig
from .faults import error_body


def usd(x: float) -> str:
    """Dollars for a message: up to 6 decimals, no trailing zeros."""
    text = f"{x:.6f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def _seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


class InFlightBudget:
    """The running weight of the chat requests in flight (plus those that finished less than
    `linger_s` ago) against `budget` USD."""

    def __init__(self, budget: float, retry_after_s: float = 1.0, linger_s: float = 0.0):
        self.budget = budget
        self.retry_after_s = retry_after_s
        self.linger_s = linger_s
        self._active = 0.0  # weights of the admitted requests still in flight
        self._active_n = 0
        self._lingering: deque[tuple[float, float]] = deque()  # (until, weight), in order
        self._linger_sum = 0.0
        self.peak = 0.0  # the highest running weight admitted so far
        self._headers = {"Retry-After": _seconds(retry_after_s)}

    def running(self) -> float:
        """The current running weight (USD)."""
        lingering = self._lingering
        if lingering:
            now = time.monotonic()
            while lingering and lingering[0][0] <= now:
                self._linger_sum -= lingering.popleft()[1]
            if not lingering:
                self._linger_sum = 0.0
        return self._active + self._linger_sum

    def admit(self, weight: float) -> tuple[int, dict[str, Any], dict[str, str] | None, str] | None:
        """Admit a request of this weight (None), or the refusal: (status, body, headers,
        stats outcome)."""
        budget = self.budget
        if weight > budget:
            return 402, error_body(
                402, f"This request's estimated cost (${usd(weight)}) is larger than your "
                f"in-flight budget (${usd(budget)}): lower max_tokens or add credits",
                {"reason": "weight_exceeds_budget", "limit_source": "openrouter_credits",
                 "request_usd": weight, "budget_usd": budget}), None, "weight_exceeds_budget"
        running = self.running()
        if running + weight > budget:
            return 402, error_body(
                402, f"In-flight spending budget exhausted: ${usd(running)} of your "
                f"${usd(budget)} in-flight budget is held by running and recently finished "
                f"requests and this one needs ${usd(weight)}; retry after "
                f"{_seconds(self.retry_after_s)} s or hold fewer requests in flight",
                {"reason": "in_flight_budget_exhausted",
                 "limit_source": "openrouter_in_flight_budget", "in_flight_usd": running,
                 "request_usd": weight, "budget_usd": budget}), dict(self._headers), \
                "in_flight_budget"
        if weight > 0:  # (a free request holds nothing, and is never released)
            self._active += weight
            self._active_n += 1
        running += weight
        if running > self.peak:
            self.peak = running
        return None

    def release(self, weight: float) -> None:
        """An admitted request finished (in any way)."""
        self._active_n -= 1
        if self._active_n <= 0:
            self._active_n = 0
            self._active = 0.0  # no float residue once nothing is in flight
        else:
            self._active -= weight
        if self.linger_s > 0:
            self._lingering.append((time.monotonic() + self.linger_s, weight))
            self._linger_sum += weight


def spend_limit_error(cfg: SimConfig, spent: float) -> dict[str, Any]:
    """The 403 body once the spend reached `spend_limit_usd`."""
    scope = SPEND_LIMIT_SCOPES[cfg.spend_limit_source]
    limit = cfg.spend_limit_usd
    resets = cfg.spend_limit_resets_at
    when = f"; it resets at {resets}" if resets else ""
    return error_body(
        403, f"Budget limit exceeded: ${usd(spent)} spent of the ${usd(limit)} {scope} "
        f"budget{when}",
        {"limit_source": cfg.spend_limit_source, "scope": scope, "limit_usd": limit,
         "spend_usd": spent, "resets_at": resets})
