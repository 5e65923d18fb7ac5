"""One shared tick that reads every streaming connection in batches.

A provider writes a stream one token at a time; reading each write as it lands costs an event
loop wake-up, a socket read and a protocol call per token, far more than parsing the token.
While a connection is held here its transport does not read: the kernel keeps the bytes, and
once per tick each held connection is read once, so a tick's worth of events arrives as one
block and is parsed together.

Two ways to read a held connection, chosen per transport:

* **direct**: the transport stays paused and the tick reads it: plain TCP (asyncio or uvloop)
  from the socket itself, asyncio's TLS through the socket transport's own read step (the
  bytes then go through the TLS layer as usual); holding costs no selector change at all. A
  connection that brought nothing for `handoff` seconds goes back to the loop's watch until
  its next bytes (an answer still queued at the provider costs no polling);
* **resume** (TLS on uvloop, anything else): paused when bytes arrive, resumed at the next
  tick.

Timeouts keep working: bytes still stamp the request's deadline when they are read, so an idle
or total timeout fires at most one tick late.
"""

from __future__ import annotations

import asyncio
import os
from asyncio import selector_events
from collections.abc import Callable
from typing import Any, Protocol


class H1Connection(Protocol):
    """What the ticker uses of a connection (client/h1.py's `H1Connection`); a protocol, so
    this module needs no import of its only user."""

    transport: Any
    ticker: ReadTicker | None
    reader: Any
    read_step: Callable[[], None] | None
    held: bool
    fresh: bool
    closed: bool
    empty_ticks: int
    last_len: int

    def fail(self, exc: BaseException) -> None: ...

    def data_received(self, data: bytes) -> None: ...

READ_SIZE = 64 * 1024  # bytes per direct read; a full read is followed by another
_SOCKET_TRANSPORT: Any = getattr(selector_events, "_SelectorSocketTransport", None)


def reader_of(conn: H1Connection) -> tuple[Any, Any]:
    """(the transport to pause, the direct read step or None for pause/resume)."""
    transport: Any = conn.transport
    ssl_proto = getattr(transport, "_ssl_protocol", None)
    if ssl_proto is None and transport.get_extra_info("sslcontext") is None:
        sock = transport.get_extra_info("socket")
        if sock is not None:  # plain TCP on any loop: the tick reads the paused socket
            return transport, _fd_read(conn, sock.fileno())
        return transport, None
    inner = getattr(ssl_proto, "_transport", None)  # asyncio's TLS: the socket transport
    read = getattr(inner, "_read_ready", None)
    if read is not None and _SOCKET_TRANSPORT is not None and isinstance(inner, _SOCKET_TRANSPORT):
        # asyncio reads up to 256 KiB at a time: an allocation that large can be an mmap and
        # a munmap per read (~14 us); a tick's bytes of one stream fit in far less
        inner.max_size = READ_SIZE
        return inner, read
    return transport, None  # TLS on another loop: pause/resume


def _fd_read(conn: H1Connection, fd: int) -> Callable[[], None]:
    """A read step for a paused plain-TCP transport: bytes go to the protocol as its
    transport would pass them; an error fails the request as the transport would; at EOF the
    transport reads again itself (and reports the end)."""
    def read() -> None:
        try:
            data = os.read(fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            conn.fail(exc)
            return
        if data:
            conn.data_received(data)
        elif conn.ticker is not None:
            conn.read_step = None  # pause/resume from now on: the loop sees the EOF
            conn.ticker.release(conn)
    return read


class ReadTicker:
    """Holds connections (`hold` / `release`) and reads them all once per `interval` s."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float, handoff: float = 1.0):
        self._loop = loop
        self.interval = interval
        self._handoff = max(1, round(handoff / interval))  # empty ticks before handing off
        self._held: dict[H1Connection, None] = {}
        self._handle: asyncio.TimerHandle | None = None
        self.ticks = 0

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, conn: H1Connection) -> None:
        """Stop `conn`'s own reading; the next ticks read it."""
        if conn.held or conn.closed or conn.transport is None:
            return
        if conn.reader is None:
            conn.reader, conn.read_step = reader_of(conn)
        conn.held = True
        conn.empty_ticks = 0
        conn.reader.pause_reading()
        self._held[conn] = None
        if self._handle is None:
            self._schedule()

    def release(self, conn: H1Connection) -> None:
        """Give `conn` back to the loop's own reading."""
        if not conn.held:
            return
        conn.held = False
        del self._held[conn]
        if not conn.closed:
            conn.reader.resume_reading()

    def close(self) -> None:
        for conn in list(self._held):
            self.release(conn)
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self) -> None:
        step = self.interval
        self._handle = self._loop.call_at((self._loop.time() // step + 1) * step, self._tick)

    def _tick(self) -> None:
        self._handle = None
        self.ticks += 1
        handoff = self._handoff
        for conn in list(self._held):
            if not conn.held:
                continue  # released by an earlier read of this tick
            read = conn.read_step
            if read is None:
                self.release(conn)  # resume: the loop reads what came; bytes hold it again
                continue
            conn.fresh = False
            read()
            while conn.fresh and conn.last_len == READ_SIZE and conn.held:
                read()  # a full read: there may be more
            if conn.fresh:
                conn.empty_ticks = 0
            elif conn.held:
                conn.empty_ticks += 1
                if conn.empty_ticks >= handoff:
                    self.release(conn)
        if self._held:
            self._schedule()
