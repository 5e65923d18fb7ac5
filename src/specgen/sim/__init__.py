"""`specgen sim`: a local OpenRouter-compatible simulator with providers, quirks and faults.

A real HTTP server over real sockets (asyncio, `specgen.sim.http`). Completions are sampled
as target-model token ids with the configured tokenizer and renderer, then turned into API
fields the way a serving stack does. See docs/sim.md for every knob.

In-process use (the engine's ``base_url = "sim"``)::

    from specgen.sim import start_in_thread

    handle = start_in_thread(None, seed=0)        # SimConfig | path to sim.toml | None
    handle.url                                    # "http://127.0.0.1:PORT/api/v1"
    handle.stats()                                # the GET /sim/stats counters (a dict)
    handle.stop()

``start_in_thread(config, *, seed=None, tokenizer=None, renderer=None, host="127.0.0.1",
port=0, models=None)`` runs the server on its own event loop in a daemon thread and returns
once it is listening. ``tokenizer`` (a loaded `Tokenizer` or a spec such as ``"demo"`` or a
model directory) and ``renderer`` (a renderer name) override the config, so the simulator can
use exactly the run's target; ``models`` (slugs) overrides the served models. Inside a running
event loop use ``await start(...)`` (same arguments), which returns a `SimServer` with
``.url`` and ``await .stop()``.

Outage windows (``[[outages]]`` in the config) run from the moment the server listens; the
port, and so ``.url``, stays the same across them. ``handle.begin_outage("refuse" | "reset")``
and ``handle.end_outage()`` (``server.begin_outage()`` / ``await server.end_outage()``) start
and end one by hand.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import SimConfig, load_sim_config

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer
    from .http import HttpServer
    from .outages import Outages
    from .server import Simulator

__all__ = ["SimConfig", "SimHandle", "SimServer", "load_sim_config", "start", "start_in_thread"]


def _config(config: SimConfig | str | Path | None, models: list[str] | None = None) -> SimConfig:
    if config is None:
        cfg = SimConfig()
    elif isinstance(config, SimConfig):
        cfg = config
    else:
        cfg = load_sim_config(config)
    if models:
        cfg = dataclasses.replace(cfg, models=list(models))
    cfg.validate()  # also a SimConfig built in Python (idempotent)
    return cfg


@dataclass
class SimServer:
    """A running simulator inside the caller's event loop."""

    sim: Simulator
    http: HttpServer
    host: str
    port: int
    outages: Outages | None = None

    @property
    def root_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """Base URL for an OpenAI/OpenRouter client (ends in /api/v1)."""
        return self.root_url + "/api/v1"

    def stats(self) -> dict[str, Any]:
        """What GET /sim/stats answers."""
        return self.sim.stats_json()

    @property
    def outage_active(self) -> bool:
        return self.sim.outage_active

    def begin_outage(self, mode: str = "refuse") -> None:
        """Start an outage now (`refuse` or `reset`, as in `[[outages]]`) until `end_outage`."""
        self.outages.begin(mode)

    async def end_outage(self) -> None:
        """End the outage in force; the server listens again on the same port."""
        await self.outages.end()

    async def stop(self) -> None:
        """Stop listening, drop the open connections, cancel what they were waiting for."""
        if self.outages is not None:
            await self.outages.close()
        await self.http.close()
        await self.sim.close()


async def start(config: SimConfig | str | Path | None = None, *, seed: int | None = None,
                tokenizer: Tokenizer | str | None = None, renderer: str | None = None,
                host: str = "127.0.0.1", port: int = 0,
                models: list[str] | None = None) -> SimServer:
    """Start the simulator in the running event loop; port 0 picks a free port."""
    from .http import serve
    from .outages import Outages
    from .server import Simulator

    sim = Simulator(_config(config, models), seed=seed, tokenizer=tokenizer, renderer=renderer)
    loop = asyncio.get_running_loop()
    sim.attach(loop)
    http = await serve(sim.handle, host, port)
    outages = Outages(http, sim)
    outages.schedule(sim.cfg.outages, loop.time())  # timed from now: the server listens
    return SimServer(sim=sim, http=http, host=host, port=http.port, outages=outages)


@dataclass
class SimHandle:
    """A simulator running on its own event loop in a daemon thread."""

    server: SimServer
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    _stopped: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def root_url(self) -> str:
        return self.server.root_url

    @property
    def sim(self) -> Simulator:
        return self.server.sim

    def stats(self) -> dict[str, Any]:
        """What GET /sim/stats answers (also during a `refuse` outage)."""
        async def read() -> dict[str, Any]:
            return self.server.stats()

        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(timeout=30)

    @property
    def outage_active(self) -> bool:
        return self.server.outage_active

    def begin_outage(self, mode: str = "refuse") -> None:
        """Start an outage now (`refuse` or `reset`) until `end_outage()`."""
        async def begin() -> None:
            self.server.begin_outage(mode)

        asyncio.run_coroutine_threadsafe(begin(), self.loop).result(timeout=30)

    def end_outage(self) -> None:
        """End the outage in force; returns once the server listens again (same port)."""
        asyncio.run_coroutine_threadsafe(self.server.end_outage(), self.loop).result(timeout=30)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server and its thread (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
        try:
            fut.result(timeout=timeout)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=timeout)

    def __enter__(self) -> SimHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(config: SimConfig | str | Path | None = None, *, seed: int | None = None,
                    tokenizer: Tokenizer | str | None = None, renderer: str | None = None,
                    host: str = "127.0.0.1", port: int = 0,
                    models: list[str] | None = None) -> SimHandle:
    """Start the simulator on a new event loop in a daemon thread; returns once listening.
    Errors while starting (bad config, missing tokenizer) are raised here."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            box["server"] = loop.run_until_complete(
                start(config, seed=seed, tokenizer=tokenizer, renderer=renderer, host=host,
                      port=port, models=models))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="specgen-sim", daemon=True)
    thread.start()
    ready.wait()
    if "error" in box:
        thread.join()
        raise box["error"]
    return SimHandle(server=box["server"], loop=loop, thread=thread)
