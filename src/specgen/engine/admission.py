"""Reading the datasets: rows are read lazily and admitted as conversations only while fewer
than the window (`admit_window x concurrency`) are open; datasets in listed order, or
interleaved by weight. Invalid rows are counted (or stop the run without `skip_invalid`),
rows of other shards and duplicates skipped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..config import RunConfig
from ..records import InvalidRowRecord
from ..sources.files import cannot_read
from ..store import Store
from .conversations import Conversations
from .events import EventLog
from .shard import Shard
from .stages import Stages
from .state import DsRun
from .stop import StopState
from .writer import StoreWriter

log = logging.getLogger("specgen.engine")

SEEN_CAP = 500_000  # conversation ids remembered per dataset and session for dedupe
ADMIT_CHUNK = 64  # conversations admitted per pass (keeps the loop responsive)
READ_CHUNK = 2048  # rows read per pass at most (rows of other shards, duplicates...)
_END = object()  # the source has no (more) rows


class Admission:
    def __init__(self, cfg: RunConfig, stages: Stages, book: Conversations,
                 writer: StoreWriter, reader: Store, events: EventLog, stop: StopState,
                 datasets: list[DsRun], *, window: int, shard: Shard | None,
                 wake: Callable[[], None]):
        self.cfg = cfg
        self.stages = stages
        self.book = book
        self.writer = writer
        self.reader = reader  # a second connection for reads during threaded commits
        self.events = events
        self.stop = stop
        self.datasets = datasets
        self.window = window
        self.shard = shard
        self.wake = wake
        self.weighted = any(d.weight is not None for d in cfg.datasets)
        self._bg: set[asyncio.Task] = set()  # source openers

    def admissible(self) -> list[DsRun]:
        """Datasets that may take new conversations now, in the order to take them."""
        live = [d for d in self.datasets if d.can_admit()]
        if not live:
            return []
        if self.weighted:
            return sorted(live, key=lambda d: (d.admitted_session / d.weight, d.position))
        return live[:1]

    def fill(self) -> bool:
        """Admit conversations until the window is full or no dataset can take more, a few
        chunks per call. True when more could be admitted right away (call again soon)."""
        if self.stop.halted:
            return False
        book = self.book
        for _ in range(4):
            if book.open >= self.window:
                return False
            candidates = self.admissible()
            if not candidates:
                return False
            ds = candidates[0]
            self.admit(ds, min(ADMIT_CHUNK, self.window - book.open))
            if self.stop.fatal or ds.opening:
                return False  # the opener wakes the loop when the source is ready
        return book.open < self.window and bool(self.admissible())

    def admit(self, ds: DsRun, want: int) -> int:
        """Read rows of `ds` until `want` conversations are admitted (or READ_CHUNK rows)."""
        if ds.limit_hit():
            self.book.set_state(ds, "limit_reached",
                                f"limit of {ds.cfg.limit} conversations reached")
            return 0
        if ds.rows is None:
            if not ds.opening:
                ds.opening = True
                opener = asyncio.get_running_loop().create_task(self._open_rows(ds))
                self._bg.add(opener)
                opener.add_done_callback(self._bg.discard)
            return 0
        admitted = 0
        for _ in range(READ_CHUNK):
            row = self._next_row(ds)
            if row is None:
                break
            if row.error is not None:
                if not self._invalid(ds, row):
                    break
                continue
            ds.rows_read = row.index + 1
            ds.dirty = True
            conv = row.conversation
            if self.shard is not None and not self.shard.owns(conv.id):
                ds.rows_other_shard += 1
            elif self._seen_before(ds, conv.id):
                ds.rows_duplicate += 1
            else:
                self.book.admit(ds, conv, row.index)
                admitted += 1
            if ds.limit_hit():
                self.book.set_state(ds, "limit_reached",
                                    f"limit of {ds.cfg.limit} conversations reached")
                break
            if admitted >= want:
                break
        return admitted

    def _next_row(self, ds: DsRun):
        """The next row of the source; None at its end (marked exhausted) or when it cannot
        be read (the run stops)."""
        try:
            if ds.lookahead is not None:
                row, ds.lookahead = ds.lookahead, None
                if row is _END:
                    raise StopIteration
                return row
            return next(ds.rows)
        except StopIteration:
            ds.exhausted = True
            ds.dirty = True
            self.book.refresh_state(ds)
        except Exception as exc:  # noqa: BLE001 - an unreadable source stops the run
            self.stop.fail(f"dataset {ds.name!r}: {cannot_read(ds.cfg.path, exc, ds.name)}",
                           event=None, bad_input=True)
        return None

    def _invalid(self, ds: DsRun, row) -> bool:
        """An invalid row: counted and skipped under `skip_invalid` (True), else the run
        stops (False)."""
        err = row.error
        if not ds.cfg.skip_invalid:
            where = f"{err.file}:{err.line}" if err.line is not None else f"{err.file}"
            self.stop.fail(
                f"invalid row in dataset {ds.name!r} at {where} (row {row.index}): "
                f"{err.reason} — fix the row or set skip_invalid = true for this dataset",
                event="invalid_row", dataset=ds.name, logged=False, bad_input=True)
            return False  # not consumed: the resume cursor stays on it
        ds.rows_read = row.index + 1
        ds.dirty = True
        ds.rows_invalid += 1
        self.writer.batch.invalid_rows.append(InvalidRowRecord(
            dataset=ds.name, row_index=row.index, line=err.line, reason=err.reason))
        return True

    async def _open_rows(self, ds: DsRun) -> None:
        """Open the dataset's source at its cursor in a worker thread: skipping millions of
        rows already read must not stall the loop (or the heartbeat)."""
        def open_source():
            rows = iter(self.stages.iter_rows(ds.cfg, start=ds.rows_read,
                                              renderer=self.cfg.target.renderer))
            return rows, next(rows, _END)

        try:
            ds.rows, ds.lookahead = await asyncio.to_thread(open_source)
        except Exception as exc:  # noqa: BLE001 - a source that cannot be opened stops the run
            self.stop.fail(f"dataset {ds.name!r}: {cannot_read(ds.cfg.path, exc, ds.name)}",
                           event=None, bad_input=True)
        finally:
            ds.opening = False
            self.wake()

    def _seen_before(self, ds: DsRun, conv_id: str) -> bool:
        """Dedupe: is (dataset, conv_id) already admitted? Conversations of this session are
        remembered in a set (no query per row); earlier sessions' are looked up in the store.
        A very large session falls back to the store for everything."""
        seen = ds.seen
        if seen is not None:
            if conv_id in seen:
                return True
            if ds.stored_at_start and self.reader.has_conversation(ds.name, conv_id):
                return True
            if len(seen) >= SEEN_CAP:
                ds.seen = None  # from now on: uncommitted ones + the store
            else:
                seen.add(conv_id)
            return False
        return (self.writer.has_uncommitted_conv(ds.name, conv_id)
                or self.reader.has_conversation(ds.name, conv_id))
