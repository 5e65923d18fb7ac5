"""First-byte, idle and total timeouts for one request, with one lazy timer.

Rescheduling a timer on every stream chunk would cost more than parsing the chunk. Instead the
reader only stamps `last` (a float) on each read; the single timer wakes at the earliest moment
a deadline could have passed, recomputes it from `last`, and either cancels the request's task
or sleeps again. A request that streams steadily wakes its timer about once per idle period.
"""

from __future__ import annotations

import asyncio
import math

_EPS = 1e-3  # a timer that wakes this early counts as on time (avoids spinning)


def _limit(value: float | None) -> float:
    return math.inf if value is None or value <= 0 else float(value)


class Deadline:
    """Cancels `task` when a timeout passes; `fired` then names which one."""

    __slots__ = ("_loop", "_task", "_handle", "_first_at", "_total_at", "_idle", "last",
                 "reading", "fired", "_first_byte", "_total")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task,
        *,
        first_byte: float | None,
        idle: float | None,
        total: float | None,
    ):
        now = loop.time()
        self._loop = loop
        self._task = task
        self._first_byte = _limit(first_byte)
        self._total = _limit(total)
        self._idle = _limit(idle)
        self._total_at = now + self._total
        self._first_at = min(now + self._first_byte, self._total_at)
        self.last = now  # loop time of the latest bytes received; the reader updates it
        self.reading = False  # headers received, now reading the body
        self.fired: str | None = None
        self._handle: asyncio.TimerHandle | None = None
        if self._first_at != math.inf:
            self._handle = loop.call_at(self._first_at, self._check)

    def got_headers(self) -> None:
        """The response started: from now on the idle timeout applies."""
        now = self._loop.time()
        self.reading = True
        self.last = now
        due = min(now + self._idle, self._total_at)
        handle = self._handle
        if due == math.inf:
            if handle is not None:
                handle.cancel()
                self._handle = None
        elif handle is None or due < handle.when():
            if handle is not None:
                handle.cancel()
            self._handle = self._loop.call_at(due, self._check)

    def _due(self) -> tuple[float, str]:
        if not self.reading:
            if self._first_at < self._total_at:
                return self._first_at, "first_byte"
            return self._total_at, "total"
        idle_at = self.last + self._idle
        if idle_at < self._total_at:
            return idle_at, "idle"
        return self._total_at, "total"

    def _check(self) -> None:
        self._handle = None
        due, which = self._due()
        if self._loop.time() + _EPS >= due:
            self.fired = which
            self._task.cancel()
        elif due != math.inf:
            self._handle = self._loop.call_at(due, self._check)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def describe(self) -> str:
        which = self.fired
        if which == "first_byte":
            return f"first-byte timeout: no response within {self._first_byte:g} s"
        if which == "idle":
            return f"idle timeout: no data for {self._idle:g} s"
        return f"total timeout: the request took longer than {self._total:g} s"
