"""Budgets enforced before dispatch: per-dataset completion tokens and the run's dollar cap.

Each dispatched request reserves its worst case (`max_tokens` completion tokens; prompt tokens x
prompt price + max_tokens x completion price) until its attempt ends, when the reservation is
replaced by what the attempt really used. A request is sent only if what was spent, plus every
reservation in flight, plus its own worst case fits the budget, so a run does not overshoot as
long as providers honour `max_tokens` and the prices are right. With no known prices the dollar
cap falls back to the cost the API reports (`usage.cost`): then the overshoot is bounded by the
requests in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..client.usage import clean_usage

Verdict = Literal["ok", "wait", "tokens_exhausted", "cost_exhausted"]


@dataclass(slots=True)
class Prices:
    """USD per token (None = unknown) and where they came from."""

    prompt: float | None = None
    completion: float | None = None
    source: str = "unknown"  # "config", "endpoints", "config+endpoints" or "unknown"

    @property
    def known(self) -> bool:
        return self.prompt is not None and self.completion is not None

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        if not self.known:
            return None
        return prompt_tokens * self.prompt + completion_tokens * self.completion  # type: ignore[operator]

    def to_json(self) -> dict[str, object]:
        return {"prompt_per_m": _per_m(self.prompt), "completion_per_m": _per_m(self.completion),
                "source": self.source}


def _per_m(price: float | None) -> float | None:
    return None if price is None else price * 1e6


def resolve_prices(
    prompt_per_m: float | None, completion_per_m: float | None,
    endpoint_prices: tuple[float | None, float | None] | None,
) -> Prices:
    """Config overrides (USD per million) first, then the endpoint list's prices."""
    prompt = None if prompt_per_m is None else prompt_per_m / 1e6
    completion = None if completion_per_m is None else completion_per_m / 1e6
    from_config = prompt is not None or completion is not None
    from_endpoints = False
    if endpoint_prices is not None:
        if prompt is None and endpoint_prices[0] is not None:
            prompt, from_endpoints = endpoint_prices[0], True
        if completion is None and endpoint_prices[1] is not None:
            completion, from_endpoints = endpoint_prices[1], True
    source = "+".join(s for s, on in (("config", from_config), ("endpoints", from_endpoints))
                      if on) or "unknown"
    return Prices(prompt, completion, source)


def cap_below_one_request(max_cost_usd: float | None, prices: Prices,
                          max_tokens: dict[str, int]) -> str | None:
    """Why `max_cost_usd` cannot pay for one request of any dataset (`max_tokens`: each
    dataset's), or None. A request in flight is counted at its worst case, so under such a cap
    nothing would ever be sent. Only the completion side is counted (the prompt adds to it)."""
    if max_cost_usd is None or prices.completion is None or not max_tokens:
        return None
    name, least = min(max_tokens.items(), key=lambda kv: kv[1])
    worst = least * prices.completion
    if max_cost_usd >= worst:
        return None
    return (f"[budget] max_cost_usd ${max_cost_usd:g} is smaller than one request's worst case "
            f"(${worst:.6g}: max_tokens {least:,} of dataset {name!r} x "
            f"${prices.completion * 1e6:g} per million completion tokens, prices from "
            f"{prices.source}, before its prompt tokens): a request in flight is counted at "
            "its worst case, so nothing would ever be sent; raise max_cost_usd "
            "or lower max_tokens")


@dataclass(frozen=True, slots=True)
class Charge:
    """What one attempt was charged: its usage as the provider reported it, its cost as
    reported (or computed from known prices; None when neither is known)."""

    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None


@dataclass(slots=True)
class Reservation:
    dataset: str
    tokens: int
    cost: float


@dataclass(slots=True)
class DatasetSpend:
    token_budget: int | None
    completion_tokens: int = 0  # every billed attempt, kept or not
    prompt_tokens: int = 0
    cost_usd: float = 0.0
    reserved_tokens: int = 0


class Budget:
    """Spend so far + reservations in flight, checked against the caps."""

    def __init__(self, max_cost_usd: float | None, prices: Prices, *,
                 live_factor: float = 1.0):
        self.max_cost_usd = max_cost_usd
        self.prices = prices
        # mode = "batch": the live price over `prices` (the batch price), for the attempts
        # sent live (batch_fallback = "live"): reserved and charged at what they cost
        self.live_factor = live_factor
        self.cost_usd = 0.0  # everything spent by the run (all datasets, all sessions)
        self.reserved_cost = 0.0
        self.datasets: dict[str, DatasetSpend] = {}

    def add_dataset(self, name: str, token_budget: int | None, *, prompt_tokens: int = 0,
                    completion_tokens: int = 0, cost_usd: float = 0.0) -> DatasetSpend:
        spend = DatasetSpend(token_budget, completion_tokens, prompt_tokens, cost_usd)
        self.datasets[name] = spend
        self.cost_usd += cost_usd
        return spend

    def worst_cost(self, prompt_tokens: int, max_tokens: int, live: bool = False) -> float:
        cost = self.prices.cost(prompt_tokens, max_tokens) or 0.0
        return cost * self.live_factor if live else cost

    def check(self, dataset: str, prompt_tokens: int, max_tokens: int,
              live: bool = False) -> Verdict:
        """May a request of this dataset with this worst case be dispatched now?"""
        spend = self.datasets[dataset]
        if spend.token_budget is not None:
            if spend.completion_tokens + max_tokens > spend.token_budget:
                return "tokens_exhausted"
            if spend.completion_tokens + spend.reserved_tokens + max_tokens > spend.token_budget:
                return "wait"
        if self.max_cost_usd is not None:
            if not self.prices.known:
                return "cost_exhausted" if self.cost_usd >= self.max_cost_usd else "ok"
            worst = self.worst_cost(prompt_tokens, max_tokens, live)
            if self.cost_usd + worst > self.max_cost_usd:
                return "cost_exhausted"
            if self.cost_usd + self.reserved_cost + worst > self.max_cost_usd:
                return "wait"
        return "ok"

    def reserve(self, dataset: str, prompt_tokens: int, max_tokens: int,
                live: bool = False) -> Reservation:
        cost = self.worst_cost(prompt_tokens, max_tokens, live)
        self.datasets[dataset].reserved_tokens += max_tokens
        self.reserved_cost += cost
        return Reservation(dataset, max_tokens, cost)

    def release(self, r: Reservation) -> None:
        self.datasets[r.dataset].reserved_tokens -= r.tokens
        self.reserved_cost -= r.cost
        r.tokens, r.cost = 0, 0.0

    def charge(self, dataset: str, prompt_tokens: int, completion_tokens: int,
               cost_usd: float | None) -> None:
        """Record what one attempt really used (billed failures and rejects included)."""
        spend = self.datasets[dataset]
        spend.prompt_tokens += prompt_tokens
        spend.completion_tokens += completion_tokens
        if cost_usd:
            spend.cost_usd += cost_usd
            self.cost_usd += cost_usd

    def attempt_cost(self, prompt_tokens: int, completion_tokens: int,
                     reported: float | None, live: bool = False) -> float | None:
        """The cost of an attempt: as the API reported it, else from known prices."""
        if reported is not None:
            return reported
        cost = self.prices.cost(prompt_tokens, completion_tokens)
        return cost * self.live_factor if live and cost is not None else cost

    def charge_usage(self, dataset: str, usage: dict[str, Any], *, bad: bool = False,
                     worst_case: int = 0, live: bool = False) -> Charge:
        """Charge one attempt's `usage` (tokens, and its cost or the known prices') to its
        dataset and the run. A bad count or cost is never charged as sent (`clean_usage`):
        when the provider's usage was malformed (`bad`) and its completion count is gone,
        the attempt's `worst_case` (its max_tokens, what dispatch reserved) is charged, so
        a provider sending `-20000` or `"abc"` cannot defeat a token budget."""
        usage, dropped = clean_usage(usage)
        pt = int(usage.get("prompt_tokens") or 0)
        ct = usage.get("completion_tokens")
        if ct is None and (bad or dropped):
            ct = worst_case
        ct = int(ct or 0)
        reported = usage.get("cost")
        reported = float(reported) if isinstance(reported, int | float) else None
        cost = self.attempt_cost(pt, ct, reported, live)
        self.charge(dataset, pt, ct, cost)
        return Charge(pt, ct, cost)
