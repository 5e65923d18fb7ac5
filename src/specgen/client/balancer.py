"""Spreading requests over several OpenAI-compatible base URLs, with per-URL health.

Each request goes to the healthy URL with the fewest requests in flight (ties rotate, so equal
servers share load round-robin). A URL that fails with connection errors `failure_threshold`
times in a row is cooled down: it gets no new requests for `cooldown` seconds, doubling on each
relapse up to `max_cooldown`. After the pause it is tried again; one more connection failure
cools it again, one success makes it healthy. When every URL is cooling, the one that recovers
first is used, so a request is never refused here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from yarl import URL

log = logging.getLogger("specgen.client")


def normalize_base_url(url: str) -> str:
    """`https://openrouter.ai/api/v1/` → `https://openrouter.ai/api/v1` (also accepts a full
    `.../chat/completions` URL and strips that suffix)."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("base_url must be a non-empty string")
    url = url.strip().rstrip("/")
    if url.endswith("/chat/completions"):
        url = url[: -len("/chat/completions")]
    parsed = URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(
            f"base_url {url!r} must be an http:// or https:// URL such as "
            "'https://openrouter.ai/api/v1' or 'http://127.0.0.1:8000/v1'"
        )
    if parsed.user or parsed.password:
        raise ValueError("base_url must not contain credentials; use api_key_env")
    return url


@dataclass(slots=True, eq=False)
class Endpoint:
    """One base URL and its counters."""

    url: str
    chat_url: URL = field(repr=False)
    in_flight: int = 0
    requests: int = 0
    ok: int = 0
    connection_errors: int = 0
    consecutive_failures: int = 0
    cooldowns: int = 0
    cooled_until: float = 0.0  # monotonic time; 0 = healthy

    def url_for(self, path: str) -> URL:
        return URL(self.url + "/" + path.lstrip("/"))

    def stats(self, now: float) -> dict[str, Any]:
        return {
            "url": self.url,
            "in_flight": self.in_flight,
            "requests": self.requests,
            "ok": self.ok,
            "connection_errors": self.connection_errors,
            "cooldowns": self.cooldowns,
            "cooling_for_s": round(max(0.0, self.cooled_until - now), 3),
        }


class Balancer:
    """Least-in-flight choice over base URLs, ties round-robin, unhealthy URLs cooled down."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        failure_threshold: int = 3,
        cooldown: float = 5.0,
        max_cooldown: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if isinstance(urls, str):
            urls = [urls]
        normalized = [normalize_base_url(u) for u in urls]
        if not normalized:
            raise ValueError("at least one base_url is needed")
        if len(set(normalized)) != len(normalized):
            raise ValueError(f"duplicate base_url in {normalized}")
        self.endpoints = [
            Endpoint(url=u, chat_url=URL(u + "/chat/completions")) for u in normalized
        ]
        self._single = self.endpoints[0] if len(self.endpoints) == 1 else None
        self._next = 0
        self.failure_threshold = max(1, failure_threshold)
        self.cooldown = cooldown
        self.max_cooldown = max(cooldown, max_cooldown)
        self._clock = clock

    def acquire(self) -> Endpoint:
        """The URL for the next request; counts it as in flight until `release`."""
        ep = self._single
        if ep is None:
            eps = self.endpoints
            n = len(eps)
            start = self._next
            now = self._clock()
            best = None
            best_i = start
            for k in range(n):
                i = start + k
                if i >= n:
                    i -= n
                cand = eps[i]
                if cand.cooled_until > now:
                    continue
                if best is None or cand.in_flight < best.in_flight:
                    best, best_i = cand, i
            if best is None:
                best = min(eps, key=lambda e: e.cooled_until)
            # The next search starts after this one, so ties rotate over the healthy URLs.
            self._next = best_i + 1 if best_i + 1 < n else 0
            ep = best
        ep.in_flight += 1
        ep.requests += 1
        return ep

    def release(self, ep: Endpoint, healthy: bool | None) -> None:
        """End a request: True = the server answered, False = a connection-level failure,
        None = says nothing about the server (cancelled, or failed after it answered)."""
        ep.in_flight -= 1
        if healthy:
            ep.ok += 1
            if ep.consecutive_failures or ep.cooldowns:
                if ep.cooldowns:
                    log.info("base_url %s is healthy again", ep.url)
                ep.consecutive_failures = 0
                ep.cooldowns = 0
        elif healthy is False:
            ep.connection_errors += 1
            ep.consecutive_failures += 1
            if self._single is not None:
                return  # nowhere else to send the load
            now = self._clock()
            if ep.consecutive_failures >= self.failure_threshold and ep.cooled_until <= now:
                pause = min(self.max_cooldown, self.cooldown * 2.0 ** min(ep.cooldowns, 30))
                ep.cooled_until = now + pause
                ep.cooldowns += 1
                # After the pause, a single further failure is enough to cool it again.
                ep.consecutive_failures = self.failure_threshold - 1
                log.warning(
                    "base_url %s cooled down for %.1f s after repeated connection errors",
                    ep.url, pause,
                )

    def in_flight(self) -> dict[str, int]:
        return {ep.url: ep.in_flight for ep in self.endpoints}

    def stats(self) -> list[dict[str, Any]]:
        now = self._clock()
        return [ep.stats(now) for ep in self.endpoints]
