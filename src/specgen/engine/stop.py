"""Why and how a session stops: a drain (no new requests, wait for those in flight), a stop
now (cancel them), or a fatal error. One `StopState` per session; every part of the engine
asks it, and only `request` and `fail` change it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from .events import EventLog

log = logging.getLogger("specgen.engine")


class StopState:
    def __init__(self, events: EventLog, *, drain_timeout: float,
                 in_flight: Callable[[], int], wake: Callable[[], None]):
        self.events = events
        self.drain_timeout = drain_timeout
        self.in_flight = in_flight
        self.wake = wake
        self.stopping: str | None = None  # None | "drain" | "now"
        self.reason: str | None = None
        self.kind: str | None = None  # user | account | unreachable | store | alarm | quality
        self.fatal: str | None = None  # why the run must stop (fatal error, bad row)
        # the fatal error is the input's (a dataset row or source the run cannot use): exit 2,
        # as when the same mistake is found before the session starts
        self.bad_input = False
        self.now = asyncio.Event()  # set when in-flight requests are to be cancelled

    @property
    def halted(self) -> bool:
        """No new requests: stopping or failing."""
        return bool(self.stopping or self.fatal)

    def request(self, why: str, now: bool = False, kind: str = "user") -> None:
        """First call: stop dispatching and drain. A second call (or now=True): cancel.
        `kind`: who stops it — user, account (a spent budget), unreachable, store, alarm."""
        if self.stopping is not None and kind != "user":
            return  # already stopping; only the user escalates a drain to a cancel
        self.kind = self.kind or kind
        if now or self.stopping == "drain":
            if self.stopping != "now":
                self.stopping = "now"
                self.reason = self.reason or why
                self.events.add("stop_now", None, None, why)
                log.warning("stopping now (%s): cancelling %d request(s) in flight",
                            why, self.in_flight())
            self.now.set()
        elif self.stopping is None:
            self.stopping = "drain"
            self.reason = why
            self.events.add("stop", None, None, why)
            log.warning("stopping (%s): no new requests; waiting up to %gs for %d in flight "
                        "(stop again to cancel them)", why, self.drain_timeout,
                        self.in_flight())
        self.wake()

    def fail(self, message: str, *, event: str | None = "fatal", dataset: str | None = None,
             provider: str | None = None, logged: bool = True, bad_input: bool = False) -> bool:
        """The run must stop with this error (the first one wins; False if one was set):
        recorded as an `event` of that kind (None: none) and logged unless `logged` is
        False (the caller said it already). `bad_input`: the error is a dataset's (exit 2)."""
        if self.fatal:
            return False
        self.fatal = message
        self.bad_input = bad_input
        if event:
            self.events.add(event, dataset, provider, message)
        if logged:
            log.error("%s", message)
        self.wake()
        return True

    async def drain(self, inflight: dict[asyncio.Task, object]) -> None:
        """Wait for the requests in flight: all of them when the session finished normally,
        up to `drain_timeout` when stopping; then cancel what is left."""
        if not inflight:
            return
        timeout = None if self.stopping is None and not self.fatal else self.drain_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while inflight and not self.now.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.reason = (self.reason or "stop") + (
                    f"; drain timeout ({self.drain_timeout:g}s) hit, in-flight requests "
                    "cancelled")
                break
            waiter = asyncio.ensure_future(self.now.wait())
            await asyncio.wait([*inflight, waiter], timeout=left,
                               return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        if inflight:
            tasks = list(inflight)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
