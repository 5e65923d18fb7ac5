"""Is the path to the API up? Outages and endpoint-wide pauses are not request failures.

A connection that cannot be made at all (DNS, refused, TLS, reset before any response) says
nothing about the request, and neither does a storm of 5xx across many different tasks, nor
first-byte timeouts on several different tasks with no answer between (connections accepted,
never answered: a hung API): the endpoint is down. Then dispatching pauses, one request at a time probes it with backoff, and
the run goes on as soon as it answers; attempts made meanwhile do not count against a task's
`max_attempts`. An endpoint down longer than `outage_timeout` stops the run (stopped, work
pending, resumable).

One transition per state change: an answer or a failure of a request sent before the last
change (down, or up again) says nothing about the endpoint since, so it changes nothing. A
server shutting down gracefully finishes the answers under way while it refuses new
connections; those late answers do not read as "reachable again" (nor, after it is back, the
late failures of requests sent while it was down as a new outage).

A `Retry-After` longer than `retry_after_cap` is not parked on one request in silence either:
the whole endpoint pauses, visibly, until then.

`EndpointHealth` is the one entry point: the scheduler tells it every attempt's outcome and
asks `gate()` how many requests it may send now.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

UNREACHABLE_STREAK = 3  # consecutive no-response failures that mean the path is down
STORM_TASKS = 20  # distinct tasks failing with 5xx in a row, no success between: down
STORM_KINDS = frozenset({"server", "overloaded"})
HUNG_TASKS = 5  # distinct tasks with no response within the first-byte timeout, in a row
PROBE_FIRST = 1.0  # seconds before the first probe; doubles up to probe_max


class EndpointHealth:
    def __init__(self, *, outage_timeout: float = 1800.0, probe_max: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.outage_timeout = outage_timeout
        self.probe_max = probe_max
        self.clock = clock
        self.wall = wall
        self.down_since: float | None = None  # monotonic
        self.down_since_wall: float | None = None
        self.down_reason: str | None = None
        self.last_error: str | None = None
        self.paused_until: float | None = None  # monotonic
        self.pause_reason: str | None = None
        self.outages = 0
        self._streak = 0  # consecutive unreachable failures
        self._storm: set[int] = set()  # tasks failing with 5xx since the last good answer
        self._hung: set[int] = set()  # tasks with a first-byte timeout since the last answer
        self._probe_in_flight = False
        self._next_probe = 0.0
        self._probe_wait = PROBE_FIRST
        self._changed_at = -math.inf  # when the endpoint last went down or came back

    # -- what the scheduler asks ------------------------------------------------------------
    @property
    def down(self) -> bool:
        return self.down_since is not None

    def gate(self) -> int | None:
        """How many requests may be sent now: None = no limit from here, 0 = none, 1 = a
        probe."""
        now = self.clock()
        if self.paused_until is not None:
            if now < self.paused_until:
                return 0
            self.paused_until = self.pause_reason = None
        if self.down_since is None:
            return None
        if self._probe_in_flight or now < self._next_probe:
            return 0
        return 1

    def probe_sent(self) -> None:
        self._probe_in_flight = True

    def expired(self) -> bool:
        return (self.down_since is not None
                and self.clock() - self.down_since >= self.outage_timeout)

    def stop_reason(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.down_since_wall or 0))
        return (f"endpoint unreachable since {since} ({self.down_reason}; last error: "
                f"{self.last_error}); outage_timeout of {self.outage_timeout:g}s reached")

    # -- what the scheduler tells -----------------------------------------------------------
    def _stale(self, sent_at: float | None) -> bool:
        """Whether a request was sent before the last change of state."""
        return sent_at is not None and sent_at < self._changed_at

    def on_answer(self, probe: bool = False, sent_at: float | None = None) -> str | None:
        """The API answered (any HTTP response that is not a 5xx counts) a request sent at
        `sent_at` (`clock` time; None: now). Returns a message when this ends an outage."""
        if self.down_since is not None and self._stale(sent_at):
            return None  # sent before the outage: not a sign it is over
        self._streak = 0
        self._storm.clear()
        self._hung.clear()
        if probe:
            self._probe_in_flight = False
        if self.down_since is None:
            return None
        self._changed_at = self.clock()
        took = self._changed_at - self.down_since
        self.down_since = self.down_since_wall = self.down_reason = None
        self._probe_wait = PROBE_FIRST
        self._probe_in_flight = False
        return f"endpoint reachable again after {took:.0f}s; dispatching resumes"

    def on_failure(self, kind: str, task_id: int, message: str, *, responded: bool,
                   probe: bool = False, phase: str | None = None,
                   sent_at: float | None = None) -> str | None:
        """A failed attempt (`responded`: an HTTP status came back; `phase`: a timeout's;
        `sent_at` as for `on_answer`). Returns a message when this starts (or ends) an
        outage."""
        if self.down_since is None and self._stale(sent_at):
            return None  # sent while it was down: not a sign it is down again
        if kind == "unreachable":
            self._streak += 1
        elif kind in STORM_KINDS and responded:
            self._storm.add(task_id)
        elif kind == "timeout" and phase == "first_byte" and not responded:
            self._hung.add(task_id)
        elif responded:  # any other HTTP error came from a server that answered: it is up
            return self.on_answer(probe, sent_at)
        elif not self.down:  # a timeout or a broken body: neither up nor down
            return None
        self.last_error = message
        if self.down_since is not None:
            if probe:
                self._probe_in_flight = False
                self._next_probe = self.clock() + self._probe_wait
                self._probe_wait = min(self.probe_max, self._probe_wait * 2)
            return None
        if self._streak >= UNREACHABLE_STREAK:
            reason = "no connection could be made"
        elif len(self._storm) >= STORM_TASKS:
            reason = f"5xx errors on {len(self._storm)} different requests in a row"
        elif len(self._hung) >= HUNG_TASKS:
            reason = (f"no response within the first-byte timeout on {len(self._hung)} "
                      "different requests in a row (connections accepted, never answered)")
        else:
            return None
        self.outages += 1
        self.down_since = self._changed_at = self.clock()
        self.down_since_wall = self.wall()
        self.down_reason = reason
        self._next_probe = self.down_since + PROBE_FIRST
        self._probe_wait = PROBE_FIRST * 2
        return (f"endpoint down ({reason}; last: {message}): dispatching paused, probing with "
                f"backoff; the run stops if it stays down for {self.outage_timeout:g}s")

    def pause(self, seconds: float, why: str) -> bool:
        """Pause every request for `seconds` (a long Retry-After). True if this extends the
        pause (the caller says so once)."""
        until = self.clock() + seconds
        if self.paused_until is not None and until <= self.paused_until:
            return False
        self.paused_until = until
        self.pause_reason = why
        return True

    def to_json(self) -> dict[str, Any]:
        now = self.clock()
        state = "ok"
        if self.down_since is not None:
            state = "down"
        elif self.paused_until is not None and now < self.paused_until:
            state = "paused"
        out: dict[str, Any] = {"state": state, "outages": self.outages}
        if state == "down":
            out.update(since=self.down_since_wall, reason=self.down_reason,
                       last_error=self.last_error,
                       next_probe_in_s=round(max(0.0, self._next_probe - now), 1))
        elif state == "paused":
            out.update(reason=self.pause_reason,
                       resumes_in_s=round(self.paused_until - now, 1))  # type: ignore[operator]
        return out
