"""How many requests may be in flight now, and what answers and errors teach it: the adaptive
limit (`concurrency`: AIMD on 429/503), the account's in-flight spending budget
(`inflight_budget`: 402 in_flight_budget), and the endpoint's health (`outage`: down, probed,
paused by a long Retry-After). Each of those decides; `Limits` feeds them and says why the
limit is what it is."""

from __future__ import annotations

import logging
import time

from ..client.types import ApiError
from ..config import RunConfig
from .concurrency import AdaptiveLimit
from .events import EventLog
from .inflight_budget import InFlightBudget
from .outage import EndpointHealth
from .state import Job

log = logging.getLogger("specgen.engine")


class Limits:
    def __init__(self, cfg: RunConfig, events: EventLog, *, prices_known: bool):
        ep, eng = cfg.endpoint, cfg.engine
        self.cfg = cfg
        self.events = events
        self.adaptive = AdaptiveLimit(ep.concurrency, ep.min_concurrency,
                                      enabled=ep.adaptive_concurrency)
        self.spend_window = InFlightBudget("usd" if prices_known else "tokens")
        self.health = EndpointHealth(outage_timeout=eng.outage_timeout,
                                     probe_max=ep.outage_probe_max)
        self._budget_logged = -1e9

    def on_answer(self, job: Job, provider: str | None) -> None:
        note = self.health.on_answer(probe=job.probe, sent_at=job.sent_at)
        if note:
            self._endpoint_note(provider, note)

    def on_kept(self, in_flight_weight: float, in_flight: int) -> None:
        self.adaptive.on_success()
        self.spend_window.on_success(in_flight_weight, in_flight)

    def on_error(self, job: Job, err: ApiError) -> None:
        """What a failed attempt tells the endpoint's health and the concurrency limits."""
        kind = err.kind
        note = self.health.on_failure(kind, job.task_id, str(err)[:300],
                                      responded=err.status is not None, probe=job.probe,
                                      phase=err.timeout_phase, sent_at=job.sent_at)
        if note:
            self._endpoint_note(err.provider, note)
        if kind == "in_flight_budget":
            if self.spend_window.on_refused(job.weight_before, job.weight):
                note = self.spend_window.note(self.adaptive.maximum)
                self.events.add("concurrency", None, err.provider, note)
                if time.monotonic() - self._budget_logged >= 30:
                    self._budget_logged = time.monotonic()
                    log.warning("%s", note)
        elif self.adaptive.on_error(kind, job.epoch):
            self.events.add("concurrency", None, err.provider,
                            f"{kind}: concurrency lowered to {self.adaptive.limit}")

    def pause_endpoint(self, seconds: float, err: ApiError) -> str | None:
        """A Retry-After above retry_after_cap: every request waits, visibly. Returns why
        the run must stop when the wait is longer than outage_timeout (else None)."""
        eng = self.cfg.engine
        then = time.localtime(time.time() + seconds)
        same_day = time.strftime("%Y-%m-%d", then) == time.strftime("%Y-%m-%d")
        # a wait into another day names the day (Retry-After: 86400 is tomorrow, not today)
        until = time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S", then)
        why = (f"{err.kind} with Retry-After {seconds:.0f}s (above retry_after_cap = "
               f"{eng.retry_after_cap:g}s): all requests paused until {until}")
        if not self.health.pause(seconds, why):
            return None
        self._endpoint_note(err.provider, why)
        if seconds > eng.outage_timeout:
            return (f"the API asks to wait {seconds:.0f}s (until {until}), longer than "
                    f"outage_timeout = {eng.outage_timeout:g}s; rerun after then to resume")
        return None

    def _endpoint_note(self, provider: str | None, note: str) -> None:
        self.events.add("endpoint", None, provider, note)
        log.warning("%s", note)

    def now(self, store_holding: str | None = None) -> tuple[int, str | None]:
        """The in-flight limit now, and why it is below the configured one (None if not)."""
        limit, why = self.adaptive.limit, None
        if limit < self.adaptive.maximum:
            why = f"adaptive: {self.adaptive.last_reason or 'congestion'} answers"
        fits = self.spend_window.limit_for(self.adaptive.maximum)
        if fits < limit:
            limit, why = fits, "the account's in-flight spending budget (402 in_flight_budget)"
        state = self.health.to_json()
        if state["state"] == "down":
            limit, why = 1, f"endpoint down ({state.get('reason')}): one probe at a time"
        elif state["state"] == "paused":
            limit, why = 0, f"paused: {state.get('reason')}"
        if store_holding:
            limit, why = 0, f"store: {store_holding}"
        return limit, why
