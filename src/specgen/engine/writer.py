"""Batched, ordered writes to the run store.

Everything the engine records goes into one `Batch`; `flush()` commits it in a single
transaction. Batches commit in the order they were filled, so the store is always a prefix of
what the engine did: a `kill -9` loses the uncommitted tail (the last fraction of a second and
whatever was in flight), never something in the middle.

`flush()` can run in a worker thread (`flush_async`): SQLite releases the GIL while it works,
so the event loop keeps serving sockets during a commit. Only one flush runs at a time.
"""

from __future__ import annotations

import asyncio
import time

from ..store import Batch, Store


class StoreWriter:
    def __init__(self, store: Store, *, interval: float = 0.2, max_rows: int = 500,
                 threaded: bool = True):
        self.store = store
        self.interval = interval
        self.max_rows = max_rows
        self.threaded = threaded
        self.batch = Batch()
        self._flushing: asyncio.Future | None = None
        self.last_flush = time.monotonic()
        self.commits = 0
        self.rows_committed = 0
        self.commit_seconds = 0.0
        # (dataset, conv_id) of conversations written but not yet committed, for dedupe
        self.uncommitted_convs: set[tuple[str, str]] = set()
        self._in_commit_convs: set[tuple[str, str]] = set()
        self.error: BaseException | None = None  # a commit that failed (the run must stop)

    def has_uncommitted_conv(self, dataset: str, conv_id: str) -> bool:
        key = (dataset, conv_id)
        return key in self.uncommitted_convs or key in self._in_commit_convs

    def due(self) -> bool:
        return bool(self.batch) and (
            len(self.batch) >= self.max_rows
            or time.monotonic() - self.last_flush >= self.interval
        )

    def _take(self) -> tuple[Batch, set[tuple[str, str]]]:
        batch, convs = self.batch, self.uncommitted_convs
        self.batch, self.uncommitted_convs = Batch(), set()
        return batch, convs

    def _commit(self, batch: Batch) -> None:
        t0 = time.perf_counter()
        self.store.write(batch)
        self.commit_seconds += time.perf_counter() - t0
        self.commits += 1
        self.rows_committed += len(batch)

    def flush(self) -> None:
        """Commit everything buffered, now, on this thread (no threaded commit may be under
        way: await `wait_idle()` first)."""
        if self._flushing is not None:
            raise RuntimeError("flush() while a threaded commit is under way")
        if not self.batch:
            return
        batch, _ = self._take()
        self._commit(batch)
        self.last_flush = time.monotonic()

    async def flush_async(self) -> None:
        """Commit what is buffered (in a worker thread when `threaded`); waits for a flush
        already running first, so commits stay in order. Cancelling the caller does not
        cancel a commit under way: `wait_idle` waits for it."""
        await self.wait_idle()
        if not self.batch:
            return
        batch, convs = self._take()
        self._in_commit_convs = convs
        if not self.threaded:
            try:
                self._commit(batch)
            finally:
                self._flush_done(None)
            return
        fut = asyncio.ensure_future(asyncio.to_thread(self._commit, batch))
        self._flushing = fut
        fut.add_done_callback(self._flush_done)
        await asyncio.shield(fut)

    def _flush_done(self, fut: asyncio.Future | None) -> None:
        self._flushing = None
        self._in_commit_convs = set()
        self.last_flush = time.monotonic()
        if fut is not None and not fut.cancelled() and fut.exception() is not None:
            self.error = fut.exception()

    async def wait_idle(self) -> None:
        """Wait until no commit is under way; re-raise the failure of the last one."""
        while self._flushing is not None:
            fut = self._flushing
            try:
                await asyncio.shield(fut)
            except asyncio.CancelledError:
                if not fut.done():
                    raise
            except Exception:  # noqa: BLE001 - reported through self.error below
                pass
            if self._flushing is fut:  # callback not run yet
                self._flush_done(fut)
        if self.error is not None:
            raise self.error
