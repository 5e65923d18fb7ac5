"""What to do with a failed attempt, by what its error means (docs/engine.md, "Retries and
error classes"): retry it (when, and whether it counts against `max_attempts`), retry it
smaller, end the task, stop the run cleanly (an account's budget is spent: resumable), or fail
the run (a bad key, no endpoint).

`RetryPolicy.decide` is the one entry point; it decides and the scheduler carries it out.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from ..client.retry import backoff_delay
from ..client.types import ACCOUNT_LIMITS, ApiError
from ..config import EndpointConfig

Action = Literal["retry", "shrink", "fail_task", "stop_run", "fail_run"]
# Refusals that say nothing about the request: never counted against max_attempts.
UNCOUNTED = frozenset({"unreachable", "in_flight_budget"})
# What a down endpoint does to requests: not counted while it is down.
DOWN_KINDS = frozenset({"server", "overloaded", "connection", "timeout"})
_BUDGET_NAMES = {
    "openrouter_guardrail_budget": "guardrail budget",
    "openrouter_workspace_budget": "workspace budget",
    "openrouter_key_limit": "API key's spending limit",
    "openrouter_credits": "account's credits",
}


@dataclass(slots=True)
class Decision:
    action: Action
    delay: float = 0.0  # seconds before the retry
    counts: bool = True  # the attempt counts against max_attempts
    pause: float | None = None  # pause the whole endpoint this long (a long Retry-After)
    message: str = ""  # why the task ends / the run stops
    max_tokens: int | None = None  # for "shrink": the smaller max_tokens to retry with


class RetryPolicy:
    def __init__(self, ep: EndpointConfig, *, retry_after_cap: float = 300.0,
                 shrink_max_tokens: bool = False, rng: random.Random | None = None):
        self.ep = ep
        self.retry_after_cap = retry_after_cap
        self.shrink_max_tokens = shrink_max_tokens
        self.rng = rng or random.Random()

    def decide(self, err: ApiError, *, attempts: int, max_tokens: int, prompt_cost: float = 0.0,
               endpoint_down: bool = False) -> Decision:
        """`attempts`: counted attempts so far, this one included."""
        kind = err.kind
        if kind in ACCOUNT_LIMITS:
            return Decision("stop_run", counts=False, message=account_message(err))
        if kind == "no_endpoints" and (err.availability or {}).get("retryable") is True:
            return self._retry(err, attempts, counts=True)  # the filter will match again soon
        if err.fatal_for_run:
            return Decision("fail_run", counts=False, message=fatal_message(err))
        if kind == "weight_exceeds_budget":
            smaller = shrunk_max_tokens(err, max_tokens, prompt_cost)
            if self.shrink_max_tokens and smaller is not None:
                return Decision("shrink", counts=True, max_tokens=smaller,
                                message=f"max_tokens {max_tokens} -> {smaller}")
            return Decision("fail_task", message=(
                f"{err} — this request's estimated cost is more than the whole in-flight "
                "budget: lower max_tokens, add credits, or set [budget] shrink_max_tokens"))
        if not err.retryable:
            return Decision("fail_task", message=str(err))
        counts = kind not in UNCOUNTED and not (endpoint_down and kind in DOWN_KINDS)
        if counts and attempts >= self.ep.max_attempts:
            return Decision("fail_task", message=f"gave up after {attempts} attempts; "
                                                 f"last: {err}")
        return self._retry(err, attempts, counts=counts)

    def _retry(self, err: ApiError, attempts: int, *, counts: bool) -> Decision:
        wait = err.retry_after
        delay = backoff_delay(max(1, attempts), base=self.ep.retry_base_delay,
                              cap=self.ep.retry_max_delay, retry_after=wait, rng=self.rng)
        pause = None
        if wait is not None and math.isfinite(wait) and wait > self.retry_after_cap:
            pause = wait
        return Decision("retry", delay=delay, counts=counts, pause=pause)


def shrunk_max_tokens(err: ApiError, max_tokens: int, prompt_cost: float) -> int | None:
    """A max_tokens whose estimate fits the in-flight budget the 402 reported (scaled from
    `metadata.budget_usd` / `request_usd` when given, else halved); None when nothing fits."""
    meta = err.metadata
    budget, request = meta.get("budget_usd"), meta.get("request_usd")
    if (isinstance(budget, int | float) and isinstance(request, int | float)
            and request > prompt_cost >= 0 and budget > prompt_cost):
        share = (budget - prompt_cost) / (request - prompt_cost)
        new = math.floor(max_tokens * share * 0.9)
    else:
        new = max_tokens // 2
    return new if 1 <= new < max_tokens else None


def account_message(err: ApiError) -> str:
    """Why the run stops on a spent account budget, which one, and until when."""
    source = err.limit_source
    meta = err.metadata
    if err.kind == "credits":
        which = _BUDGET_NAMES.get(source or "", "credits")
        return (f"{err} — out of credits ({which}): add credits (or raise the key's limit), "
                "then rerun the same command to resume")
    which = _BUDGET_NAMES.get(source or "", f"spending budget ({source})")
    figures = ", ".join(f"{k.removesuffix('_usd')} ${meta[k]:g}" for k in ("limit_usd",
                        "spend_usd") if isinstance(meta.get(k), int | float))
    until = f"; it resets at {err.resets_at}" if err.resets_at else ""
    return (f"the {which} is spent ({figures or 'no figures given'}){until} — the run stops; "
            f"rerun the same command {'after it resets' if until else 'once it is raised'} "
            f"to resume ({err})")


def fatal_message(err: ApiError) -> str:
    hints = {
        "auth": "check the API key in the environment variable named by endpoint.api_key_env",
        "no_endpoints": "no provider matches the model and the provider policy; relax "
                        "[endpoint.provider] or check the model name, then rerun to resume",
    }
    return f"{err} — {hints.get(err.kind, 'fix the cause and rerun to resume')}"
