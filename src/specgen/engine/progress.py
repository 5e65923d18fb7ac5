"""How far a run is, and how long the rest will take: per-dataset plans and a rolling ETA.

* **Source totals** (`RowCounter`): a dataset's row count, counted once in a daemon thread
  where it is cheap (JSONL: a byte scan for newlines; Parquet and Arrow: their metadata).
  JSON must be parsed to count, so it stays unknown and reads as a lower bound ("≥ rows read")
  until the source is exhausted.
* **Planned requests** (`plan`): the tasks known so far plus the conversations still to be
  read times the tasks a conversation takes (the mean of the conversations finished this
  session, else of all so far). Exact once the source is read and no conversation is open.
* **Progress** of a dataset: done / planned requests, or the share of its token budget spent,
  whichever ends it first; `basis` says which.
* **ETA** (`EtaEstimator`): the requests left over every dataset divided by the completion rate
  of a rolling window; none until the window holds enough (`min_done` completions over at
  least `min_span` seconds), a lower bound when some total is.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MIN_DONE = 10  # completions in the window before an ETA is shown
MIN_SPAN = 10.0  # seconds the window must span before an ETA is shown
WINDOW = 60.0  # seconds of completions the rate is measured over


class RowCounter:
    """A dataset's row count, counted in a daemon thread; `rows` is None until known (and
    stays None when counting is not cheap or the source cannot be read)."""

    def __init__(self, path: Path, split: str | None = None,
                 count: Callable[[Path, str | None], int | None] | None = None,
                 background: bool = True):
        self.rows: int | None = None
        self.done = threading.Event()
        if count is None:
            from ..sources import count_rows as count
        self._count = count
        self._args = (path, split)
        if background:
            threading.Thread(target=self._run, name="specgen-row-count", daemon=True).start()
        else:
            self._run()

    def _run(self) -> None:
        try:
            self.rows = self._count(*self._args)
        except Exception:  # noqa: BLE001 - a total is a nicety: unknown is fine
            self.rows = None
        finally:
            self.done.set()


@dataclass(frozen=True, slots=True)
class DatasetFigures:
    """What the plan of one dataset is computed from (counts over every session)."""

    rows_read: int
    rows_total: int | None  # row slots of the source when counted, else None
    exhausted: bool
    state: str  # active | budget_reached | limit_reached | done
    conversations: int  # admitted so far
    open: int  # conversations not finished yet
    rows_other_shard: int
    limit: int | None
    tasks_known: int  # done + failed + quarantined + pending
    tasks_ended: int  # done + failed + quarantined
    closed_convs: int = 0  # conversations finished this session ...
    closed_tasks: int = 0  # ... and their tasks
    token_budget: int | None = None
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Plan:
    """A dataset's planned requests and its progress. `kind`: "exact", "estimate" ("~") or
    "lower_bound" ("≥", the source's size is not known yet)."""

    requests: float
    kind: str
    fraction: float | None  # None: cannot tell (a lower bound and no budget)
    basis: str  # "requests" or "budget"
    remaining: float  # requests still to end (for the ETA)

    def label(self) -> str:
        """`49/49 req`, `31/~62 req 50%`, `12/≥40 req`, `63% of budget`."""
        if self.basis == "budget" and self.fraction is not None:
            return f"{100 * self.fraction:.0f}% of budget"
        if self.kind == "lower_bound" and not self.requests:
            return "-"
        mark = {"exact": "", "estimate": "~", "lower_bound": "≥"}[self.kind]
        done = self.requests - self.remaining
        text = f"{_n(done)}/{mark}{_n(self.requests)} req"
        if self.fraction is not None and self.kind != "exact":
            text += f" {100 * self.fraction:.0f}%"
        return text


def _n(v: float) -> str:
    return f"{round(v):,}"


def tasks_of_closed(answers: int, status: str, reason: str | None) -> int:
    """The tasks a conversation made once it is finished: its answers, plus the task that
    ended it when that one failed or was quarantined."""
    why = reason or ""
    if status == "done" or why.startswith("planner_error"):
        return answers
    if status == "ended" and not why.startswith("quarantined"):
        return answers  # the planner ended it: no task beyond the answers
    return answers + 1


def plan(f: DatasetFigures) -> Plan:
    """Planned requests and progress of one dataset."""
    per_conv = (f.closed_tasks / f.closed_convs if f.closed_convs
                else f.tasks_known / f.conversations if f.conversations else 1.0)
    per_conv = max(per_conv, 1.0)
    reading = f.state == "active" and not f.exhausted
    future = 0.0
    kind = "exact"
    if reading:
        kind = "estimate"
        if f.rows_total is None:
            kind = "lower_bound"
        else:
            ratio = f.conversations / f.rows_read if f.rows_read else 1.0
            future = max(0, f.rows_total - f.rows_read) * ratio
        if f.limit is not None:
            own = (f.conversations / (f.conversations + f.rows_other_shard)
                   if f.conversations + f.rows_other_shard else 1.0)
            room = max(0, f.limit - f.conversations - f.rows_other_shard) * own
            if kind == "lower_bound" or room < future:
                future, kind = room, "estimate"
    if f.open:
        kind = "estimate" if kind == "exact" else kind
    requests = f.tasks_known + f.open * (per_conv - 1.0) + future * per_conv
    requests = max(requests, float(f.tasks_known))
    remaining = max(0.0, requests - f.tasks_ended)
    if f.state == "budget_reached":
        remaining = 0.0  # no new work this session: its pending tasks wait for a bigger budget
    frac = (f.tasks_ended / requests if requests else 1.0) if kind != "lower_bound" else None
    basis = "requests"
    if f.token_budget:
        share = min(1.0, f.completion_tokens / f.token_budget)
        if f.state == "budget_reached":
            share = 1.0
        if frac is None or share > frac:
            basis, frac = "budget", share
            if f.tasks_ended and share > 0:  # requests the rest of the budget pays for
                per_req = f.completion_tokens / f.tasks_ended
                remaining = min(remaining if kind != "lower_bound" else float("inf"),
                                (f.token_budget - f.completion_tokens) / per_req)
                remaining = max(0.0, remaining)
    if frac is not None:
        frac = min(frac, 1.0)
    return Plan(requests=requests, kind=kind, fraction=frac, basis=basis, remaining=remaining)


class EtaEstimator:
    """Time left from the completion rate of a rolling window of (time, completed) samples."""

    def __init__(self, window: float = WINDOW, min_done: int = MIN_DONE,
                 min_span: float = MIN_SPAN, clock: Callable[[], float] = time.monotonic):
        self.window = window
        self.min_done = min_done
        self.min_span = min_span
        self.clock = clock
        self.samples: deque[tuple[float, int]] = deque()

    def sample(self, completed: int) -> None:
        """Record the number of tasks ended so far (a cumulative count)."""
        now = self.clock()
        if self.samples and completed < self.samples[-1][1]:
            self.samples.clear()  # a reset (should not happen): start over
        self.samples.append((now, completed))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()

    def rate(self) -> float | None:
        """Completions per second over the window; None until it is meaningful."""
        if len(self.samples) < 2:
            return None
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        if n1 - n0 < self.min_done or t1 - t0 < self.min_span:
            return None
        return (n1 - n0) / (t1 - t0)

    def eta(self, remaining: float) -> float | None:
        """Seconds until `remaining` more tasks end at the recent rate (None: unknown)."""
        if remaining <= 0:
            return 0.0
        rate = self.rate()
        return None if not rate else remaining / rate


def run_eta(plans: list[Plan], estimator: EtaEstimator) -> tuple[float | None, bool]:
    """(seconds left over every dataset, whether it is only a lower bound)."""
    remaining = sum(p.remaining for p in plans)
    lower = any(p.kind == "lower_bound" and p.basis == "requests" for p in plans)
    if remaining == float("inf"):
        return None, True
    if remaining <= 0:
        return 0.0, False
    return estimator.eta(remaining), lower


def fmt_duration(seconds: float | None) -> str:
    """`45s`, `3m05s`, `2h07m`, `<1s`; `-` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0 or seconds > 86400 * 365:
        return "-"
    if 0 < seconds < 0.5:
        return "<1s"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{s:02d}s" if m else f"{s}s"


def dataset_figures(ds, spend, rows_total: int | None) -> DatasetFigures:
    """The figures of an engine's dataset (`engine.state.DsRun`) and its budget spend."""
    t = ds.tasks
    ended = t.get("done", 0) + t.get("failed", 0) + t.get("quarantined", 0)
    return DatasetFigures(
        rows_read=ds.rows_read, rows_total=rows_total, exhausted=ds.exhausted, state=ds.state,
        conversations=ds.conversations, open=ds.open, rows_other_shard=ds.rows_other_shard,
        limit=ds.cfg.limit, tasks_known=ended + t.get("pending", 0), tasks_ended=ended,
        closed_convs=ds.closed_convs, closed_tasks=ds.closed_tasks,
        token_budget=spend.token_budget, completion_tokens=spend.completion_tokens)


def rows_total(ds, counter: RowCounter | None) -> int | None:
    """The source's row slots: counted, or known once it was read to its end."""
    if ds.exhausted:
        return ds.rows_read
    return counter.rows if counter is not None else None
