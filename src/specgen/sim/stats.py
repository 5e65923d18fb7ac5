"""Counters behind `GET /sim/stats` (tests and benchmarks read them)."""

from __future__ import annotations

from typing import Any


class Stats:
    """Requests, outcomes, tokens, cost and quirks, overall and per provider."""

    def __init__(self) -> None:
        self.requests = 0  # chat requests received
        self.completed = 0  # answered in full
        self.in_flight = 0
        self.failed: dict[str, int] = {}  # outcome kind -> count (bad_request, rate_limit, ...)
        self.faults: dict[str, int] = {}  # injected faults, incl. ones hidden by a fallback
        self.fallbacks = 0  # provider failures OpenRouter-style routing moved past
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.reasoning_tokens = 0
        self.cost_usd = 0.0
        self.quirks: dict[str, int] = {}
        self.resegmented = 0  # raw mode: completions whose ids were re-segmented
        self.providers: dict[str, dict[str, Any]] = {}

    def provider(self, name: str) -> dict[str, Any]:
        ps = self.providers.get(name)
        if ps is None:
            ps = self.providers[name] = {"requests": 0, "completed": 0, "failed": 0,
                                         "prompt_tokens": 0, "completion_tokens": 0,
                                         "cost_usd": 0.0, "faults": {}}
        return ps

    def count_fault(self, fault: str, provider: str) -> None:
        self.faults[fault] = self.faults.get(fault, 0) + 1
        pf = self.provider(provider)["faults"]
        pf[fault] = pf.get(fault, 0) + 1

    def add_completion(self, provider: str, prompt_tokens: int, completion_tokens: int,
                       reasoning_tokens: int, cost: float, quirks: list[str],
                       resegmented: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.reasoning_tokens += reasoning_tokens
        self.cost_usd += cost
        if resegmented:
            self.resegmented += 1
        for q in quirks:
            self.quirks[q] = self.quirks.get(q, 0) + 1
        ps = self.provider(provider)
        ps["completed"] += 1
        ps["prompt_tokens"] += prompt_tokens
        ps["completion_tokens"] += completion_tokens
        ps["cost_usd"] += cost

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "completed": self.completed, "in_flight": self.in_flight,
            "failed": dict(self.failed), "failed_total": sum(self.failed.values()),
            "faults": dict(self.faults), "fallbacks": self.fallbacks,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "reasoning_tokens": self.reasoning_tokens, "cost_usd": self.cost_usd,
            "quirks": dict(self.quirks), "resegmented": self.resegmented,
            "providers": {k: {**v, "faults": dict(v["faults"])} for k, v in self.providers.items()},
        }
