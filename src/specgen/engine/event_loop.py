"""The event loop a run uses: uvloop when it is installed (the `fast` extra), else asyncio's.

uvloop's C loop and transports cost less per wake-up and per socket read than the standard
selector loop, which shows at thousands of streams in flight (docs/benchmarks/streams.md);
everything specgen does works the same on either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("specgen.engine")

T = TypeVar("T")


class LoopUnavailable(RuntimeError):
    """`event_loop = "uvloop"` was asked for but uvloop is not installed."""


def loop_factory(choice: str) -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """(factory, name) for `[engine] event_loop`; a None factory is asyncio's default."""
    if choice == "asyncio":
        return None, "asyncio"
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise LoopUnavailable(
                "engine.event_loop = \"uvloop\" but uvloop is not installed: "
                "pip install 'specgen[fast]' (or set event_loop = \"auto\")") from None
        return None, "asyncio"
    return uvloop.new_event_loop, "uvloop"


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """`asyncio.run(main)` on the chosen loop."""
    try:
        factory, name = loop_factory(choice)
    except LoopUnavailable:
        main.close()
        raise
    log.debug("event loop: %s", name)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
