"""Batched, ordered writes to the run store.

Everything the engine records goes into one `Batch`; `flush()` commits it in a single
transaction. Batches commit in the order they were filled, so the store is always a prefix of
what the engine did: a `kill -9` loses the uncommitted tail (the last fraction of a second and
whatever was in flight), never something in the middle.

`flush()` can run in a worker thread (`flush_async`): SQLite releases the GIL while it works,
so the event loop keeps serving sockets during a commit. Only one flush runs at a time.

A commit the store refuses (`StoreWriteError`: disk full, read-only, store deleted or
corrupt, locked) loses nothing: the batch goes back in front of what was buffered since, the
writer records a `problem`, and a later flush retries everything held. Only a bug (any other
exception) is fatal, reported through `error` / `wait_idle` as before.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..store import Batch, Store, StoreWriteError


@dataclass(slots=True)
class StoreProblem:
    """Why the store does not take commits right now (cleared by the next good commit)."""

    kind: str  # StoreWriteError.kind: disk_full | read_only | corrupt | missing | locked | io
    message: str  # the latest failure, e.g. "disk full: database or disk is full (run dir x)"
    since: float  # time.time() of the first failure of this streak
    failures: int  # failed commits in this streak
    last: float  # time.time() of the latest failure
    error: StoreWriteError  # the latest failure itself (its __cause__: the SQLite/OS error)


class StoreWriter:
    def __init__(self, store: Store, *, interval: float = 0.2, max_rows: int = 500,
                 threaded: bool = True, retry_max: float = 2.0):
        self.store = store
        self.interval = interval
        self.max_rows = max_rows
        self.threaded = threaded
        self.retry_max = retry_max  # longest wait between retries while the store refuses
        self.batch = Batch()
        self._flushing: asyncio.Future | None = None
        self._in_commit: Batch | None = None  # the batch of the commit under way
        self.last_flush = time.monotonic()
        self.commits = 0
        self.rows_committed = 0
        self.commit_seconds = 0.0
        # (dataset, conv_id) of conversations written but not yet committed, for dedupe
        self.uncommitted_convs: set[tuple[str, str]] = set()
        self._in_commit_convs: set[tuple[str, str]] = set()
        self.error: BaseException | None = None  # a commit that failed (the run must stop)
        self.problem: StoreProblem | None = None  # the store refuses commits; rows are held

    def has_uncommitted_conv(self, dataset: str, conv_id: str) -> bool:
        key = (dataset, conv_id)
        return key in self.uncommitted_convs or key in self._in_commit_convs

    @property
    def held_rows(self) -> int:
        """Rows buffered or in a commit under way: not in the store yet."""
        n = len(self.batch)
        return n + len(self._in_commit) if self._in_commit is not None else n

    @property
    def held_results(self) -> int:
        """Result rows (paid answers) buffered or in a commit under way: not in the store."""
        n = len(self.batch.results)
        return n + len(self._in_commit.results) if self._in_commit is not None else n

    def retry_delay(self) -> float:
        """While the store refuses commits: how long after a failure the next retry is due
        (doubling from `interval` up to `retry_max`); 0 without a problem."""
        p = self.problem
        if p is None:
            return 0.0
        return min(self.retry_max, self.interval * 2 ** min(p.failures, 16))

    def due(self) -> bool:
        if not self.batch:
            return False
        if self.problem is not None:  # held rows: retry on the back-off, not on size
            return time.monotonic() - self.last_flush >= self.retry_delay()
        return (len(self.batch) >= self.max_rows
                or time.monotonic() - self.last_flush >= self.interval)

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

    def flush(self) -> bool:
        """Commit everything buffered, now, on this thread (no threaded commit may be under
        way: await `wait_idle()` first). True when everything buffered is committed; False
        when the store refused (the rows are held, `problem` says why). Always tries, even
        within the retry back-off."""
        if self._flushing is not None:
            raise RuntimeError("flush() while a threaded commit is under way")
        if not self.batch:
            return True
        batch, convs = self._take()
        self._in_commit = batch
        return self._commit_here(batch, convs)

    def _commit_here(self, batch: Batch, convs: set[tuple[str, str]]) -> bool:
        """Commit on this thread; hold the rows when the store refuses."""
        try:
            self._commit(batch)
        except StoreWriteError as exc:
            self._settle(batch, convs, exc)
            return False
        except BaseException:
            self._settle(batch, convs, None, bug=True)
            raise
        self._settle(batch, convs, None)
        return True

    async def flush_async(self, *, force: bool = False) -> bool:
        """Commit what is buffered (in a worker thread when `threaded`); waits for a flush
        already running first, so commits stay in order. Cancelling the caller does not
        cancel a commit under way: `wait_idle` waits for it.

        True when the commit went through (or there was nothing to commit); False when the
        store refused it: the rows are held and `problem` is set. While a problem is set the
        held rows are retried at most every `retry_delay()` (sooner returns False without a
        try) unless `force`. Raises what `wait_idle` raises (a bug in an earlier commit)."""
        await self.wait_idle()
        if not self.batch:
            return True
        if (self.problem is not None and not force
                and time.monotonic() - self.last_flush < self.retry_delay()):
            return False
        batch, convs = self._take()
        self._in_commit_convs = convs
        self._in_commit = batch
        if not self.threaded:
            return self._commit_here(batch, convs)
        fut = asyncio.ensure_future(asyncio.to_thread(self._commit, batch))
        self._flushing = fut
        fut.add_done_callback(self._flush_done)
        try:
            await asyncio.shield(fut)
        except StoreWriteError:
            return False
        return True

    def _flush_done(self, fut: asyncio.Future) -> None:
        if fut is not self._flushing:  # already handled (wait_idle ran before the callback)
            return
        self._flushing = None
        batch, convs = self._in_commit, self._in_commit_convs
        if fut.cancelled():  # the commit's thread may still finish it: nothing to hold
            self._settle(batch, convs, None, bug=True)
            return
        exc = fut.exception()
        if exc is not None and not isinstance(exc, StoreWriteError):
            self.error = exc
            self._settle(batch, convs, None, bug=True)
            return
        self._settle(batch, convs, exc)

    def _settle(self, batch: Batch | None, convs: set[tuple[str, str]],
                exc: StoreWriteError | None, *, bug: bool = False) -> None:
        """A commit ended (on the loop's thread): clear it, and on a refusal hold its rows."""
        self._in_commit = None
        self._in_commit_convs = set()
        self.last_flush = time.monotonic()
        if bug:
            return
        if exc is None:
            self.problem = None
            return
        if batch is not None:
            self._hold(batch, convs)
        now = time.time()
        p = self.problem
        if p is None:
            self.problem = StoreProblem(exc.kind, exc.message, now, 1, now, exc)
        else:
            p.kind, p.message, p.error, p.last = exc.kind, exc.message, exc, now
            p.failures += 1

    def _hold(self, old: Batch, convs: set[tuple[str, str]]) -> None:
        """Put the rows of a refused commit back in front of what was buffered since, in the
        current `batch` object (code holding a reference to it keeps appending to the right
        place): lists are old + new; upserts keep the newest value of a key; the newest
        session row wins."""
        new = self.batch
        for name in ("conversations", "attempts", "results", "quarantine", "invalid_rows",
                     "events"):
            rows = getattr(old, name)
            if rows:
                getattr(new, name)[:0] = rows
        for name in ("meta", "datasets", "conv_status", "tasks", "verdicts", "moved"):
            upserts = getattr(old, name)
            if upserts:
                cur = getattr(new, name)
                merged = {**upserts, **cur}
                cur.clear()
                cur.update(merged)
        if new.session is None:
            new.session = old.session
        self.uncommitted_convs |= convs

    async def wait_idle(self) -> None:
        """Wait until no commit is under way; re-raise the failure of the last one (a bug: a
        refused commit is not a failure here, see `problem`)."""
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
