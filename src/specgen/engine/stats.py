"""In-memory counters of a running engine: per provider, per error class, and rates.

These feed the live view and the plain log lines; the store stays the source of truth (and
`specgen status` reads only the store).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from ..display import UNKNOWN_PROVIDER


class LatencyHistogram:
    """Log-bucketed latencies (5% wide buckets): constant memory, percentiles within ~5%."""

    __slots__ = ("counts", "n")
    _BASE = math.log(1.05)
    _MIN = 1e-3

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.n = 0

    def add(self, seconds: float) -> None:
        self.counts[int(math.log(max(seconds, self._MIN) / self._MIN) / self._BASE)] += 1
        self.n += 1

    def percentile(self, p: float) -> float | None:
        if not self.n:
            return None
        rank = p / 100 * self.n
        seen = 0
        for bucket in sorted(self.counts):
            seen += self.counts[bucket]
            if seen >= rank:
                return self._MIN * math.exp((bucket + 0.5) * self._BASE)
        return None


@dataclass(slots=True)
class ProviderStats:
    requests: int = 0  # attempts that got an answer or an error from this provider
    ok: int = 0
    rejected: int = 0
    quarantined: int = 0
    errors: Counter = field(default_factory=Counter)
    repairs: Counter = field(default_factory=Counter)
    checks: Counter = field(default_factory=Counter)  # samples by count_check
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    def to_json(self) -> dict:
        pct = {f"p{p}": self.latency.percentile(p) for p in (50, 90, 99)}
        return {
            "requests": self.requests, "ok": self.ok, "rejected": self.rejected,
            "quarantined": self.quarantined, "errors": dict(self.errors),
            "repairs": dict(self.repairs), "count_checks": dict(self.checks),
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "cost_usd": round(self.cost_usd, 6),
            "latency_s": {k: (round(v, 3) if v is not None else None) for k, v in pct.items()},
        }


class RateMeter:
    """Rates over a sliding window from cumulative counters sampled now and then."""

    def __init__(self, window: float = 30.0, clock=time.monotonic):
        self.window = window
        self.clock = clock
        self.samples: deque[tuple[float, float, float]] = deque()

    def sample(self, requests: float, tokens: float) -> None:
        now = self.clock()
        self.samples.append((now, requests, tokens))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window:
            self.samples.popleft()

    def rates(self) -> tuple[float, float]:
        """(requests/s, tokens/s) over the window."""
        if len(self.samples) < 2:
            return 0.0, 0.0
        (t0, r0, k0), (t1, r1, k1) = self.samples[0], self.samples[-1]
        dt = t1 - t0
        return ((r1 - r0) / dt, (k1 - k0) / dt) if dt > 0 else (0.0, 0.0)


class RunStats:
    """Counters of this session (the live view adds the store's earlier totals)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.providers: dict[str, ProviderStats] = {}
        self.errors: Counter[str] = Counter()  # error class -> count, this session
        self.rejections: Counter[str] = Counter()
        self.quarantines: Counter[str] = Counter()
        self.answers = 0  # answers kept this session
        self.completion_tokens = 0  # completion tokens of every billed attempt, this session
        self.attempts = 0
        self.rate = RateMeter()
        # the longest the event loop was held by one piece of work this session (seconds
        # the periodic tick woke late; every stream in flight went unread meanwhile)
        self.loop_stall = 0.0

    def rejudged(self, provider: str | None, before: str, after: str,
                 quarantined: str | None) -> None:
        """A sample of this session stored `before` (pending) judged again: `after`, and
        moved to quarantine with reason `quarantined` (None: still a sample)."""
        p = self.provider(provider)
        p.checks[before] -= 1
        if p.checks[before] <= 0:
            del p.checks[before]
        if quarantined is None:
            p.checks[after] += 1
            return
        p.ok -= 1
        p.quarantined += 1
        self.answers -= 1
        self.quarantines[quarantined] += 1

    def provider(self, name: str | None) -> ProviderStats:
        key = name or UNKNOWN_PROVIDER
        stats = self.providers.get(key)
        if stats is None:
            stats = self.providers[key] = ProviderStats()
        return stats

    def billed(self, provider: str | None, prompt_tokens: int, completion_tokens: int,
               cost_usd: float | None) -> ProviderStats:
        """Count one attempt that reached a provider (an answer or an error) and what it
        was charged; returns the provider's figures."""
        self.completion_tokens += completion_tokens
        p = self.provider(provider)
        p.requests += 1
        p.prompt_tokens += prompt_tokens
        p.completion_tokens += completion_tokens
        p.cost_usd += cost_usd or 0.0
        return p

    def tick(self) -> None:
        # answered requests, kept or quarantined: a run whose answers are all quarantined
        # still shows the rate it gets answers at
        self.rate.sample(self.answers + sum(self.quarantines.values()), self.completion_tokens)
