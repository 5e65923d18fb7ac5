"""Outage windows: the simulator unreachable for a while, as the path to a real API can be.

`Outages` drives one server's windows. The configured `[[outages]]` run on the server's loop,
timed from the moment it started listening; `begin(mode)` / `end()` start and end one by hand
(tests). Modes:

* `refuse`: the listening socket is closed, so new connections are refused (ECONNREFUSED),
  and every open connection is reset (its request is lost, counted `cancelled`). At the end
  the server listens again on the same port: the base URL keeps working.
* `reset`: connections are accepted and reset (RST) before any response byte, and so is every
  new request on an already open keep-alive connection. Answers already under way finish.
* `graceful`: a server shutting down cleanly (SIGTERM to uvicorn, nginx -s quit): the
  listening socket is closed (new connections refused), idle keep-alive connections are
  closed (FIN), and a connection busy with an answer finishes it and then closes. At the end
  it listens again on the same port.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .config import OutageWindow

if TYPE_CHECKING:
    from .http import HttpServer
    from .server import Simulator

log = logging.getLogger("specgen.sim")
MODES = ("refuse", "reset", "graceful")


class Outages:
    """The outage state of one server (`sim.outage_active`, `sim.outages_started`)."""

    def __init__(self, http: HttpServer, sim: Simulator):
        self.http = http
        self.sim = sim
        self.mode: str | None = None  # the window in force, or None
        self._task: asyncio.Task | None = None
        self.t0 = 0.0  # loop time the server started listening

    @property
    def active(self) -> bool:
        return self.mode is not None

    def schedule(self, windows: Sequence[OutageWindow], t0: float) -> None:
        """Run `windows` (sorted, disjoint) on the running loop, timed from loop time `t0`."""
        self.t0 = t0
        if windows:
            self._task = asyncio.get_running_loop().create_task(self._run(list(windows)))

    async def _run(self, windows: list[OutageWindow]) -> None:
        loop = asyncio.get_running_loop()
        try:
            for w in windows:
                await asyncio.sleep(max(0.0, self.t0 + w.start_s - loop.time()))
                self.begin(w.mode)
                await asyncio.sleep(max(0.0, self.t0 + w.end_s - loop.time()))
                await self.end()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - an outage bug must not take the server down
            log.exception("outage schedule failed")

    def begin(self, mode: str = "refuse") -> None:
        """Start an outage now (ending the one in force, if any, first)."""
        if mode not in MODES:
            raise ValueError(f"outage mode must be one of {', '.join(MODES)}, not {mode!r}")
        http = self.http
        if self.mode == "reset" and mode != "reset":
            http.resetting = False
        self.mode = mode
        sim = self.sim
        sim.outage_active = True
        sim.outages_started += 1
        if mode == "reset":
            http.resetting = True
        else:
            http.stop_listening(graceful=mode == "graceful")
        log.info("outage (%s) started", mode)

    async def end(self) -> None:
        """End the outage in force: stop resetting, listen again on the same port."""
        if self.mode is None:
            return
        self.mode = None
        self.http.resetting = False
        await self.http.start_listening()
        self.sim.outage_active = False
        log.info("outage ended")

    async def close(self) -> None:
        """Cancel the schedule (the server is stopping)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
