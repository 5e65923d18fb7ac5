"""The engine's in-memory state: datasets being read, open conversations, jobs (tasks).

Only a window of conversations is in memory; everything else lives in the store. A job is one
task (one request of one conversation) with what is needed to send it again: the request body
and the prompt ids (for the budget's worst case and for the sample).
"""

from __future__ import annotations

import heapq
import itertools
import time
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..config import DatasetConfig
from ..conversation import AssistantMessage, Conversation, Message, Tool
from ..records import DatasetRecord
from ..sampling import SampleSettings
from .budget import Reservation


@dataclass(slots=True, eq=False)
class DsRun:
    """One dataset of the run: resume cursor, counters, and its queue of ready jobs."""

    cfg: DatasetConfig
    position: int
    max_tokens: int
    config_hash: str
    rows_read: int = 0
    rows_invalid: int = 0
    rows_duplicate: int = 0
    rows_other_shard: int = 0
    exhausted: bool = False
    state: str = "active"  # active | budget_reached | limit_reached | done | paused
    conversations: int = 0  # conversations admitted so far (store + session)
    prompts: int = 0  # source rows admitted (each gives `n` conversations; `limit` counts these)
    tasks: dict[str, int] = field(default_factory=dict)  # task status -> count
    convs_by_status: dict[str, int] = field(default_factory=dict)
    ready: deque = field(default_factory=deque)
    open: int = 0  # conversations of this dataset held in memory
    in_flight: int = 0
    admitted_session: int = 0
    rows: Iterator | None = None
    opening: bool = False  # the source is being opened (and its first rows skipped) in a thread
    lookahead: Any = None  # the first row, read by the opener
    blocked: str | None = None  # why it cannot dispatch now ("tokens", "cost"), None if it can
    paused: str | None = None  # why an alarm paused it this session (on_alarm = pause_dataset)
    dirty: bool = True
    seen: set[str] | None = field(default_factory=set)  # conv ids admitted this session
    stored_at_start: bool = False  # the store held conversations of it when the session began
    closed_convs: int = 0  # conversations finished this session (for the progress estimate)
    closed_tasks: int = 0  # the tasks they made

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def weight(self) -> float:
        return self.cfg.weight or 1.0

    def bump(self, status: str, delta: int = 1) -> None:
        self.tasks[status] = self.tasks.get(status, 0) + delta

    def conv_bump(self, status: str, delta: int = 1) -> None:
        self.convs_by_status[status] = self.convs_by_status.get(status, 0) + delta

    def can_admit(self) -> bool:
        """Whether reading more rows could give this dataset new work."""
        return self.state == "active" and not self.exhausted and self.blocked is None

    def limit_hit(self) -> bool:
        lim = self.cfg.limit
        return lim is not None and self.prompts + self.rows_other_shard >= lim

    def row(self) -> DatasetRecord:
        return DatasetRecord(
            name=self.name, position=self.position, path=str(self.cfg.path),
            format=self.cfg.format, rows_read=self.rows_read, rows_invalid=self.rows_invalid,
            rows_duplicate=self.rows_duplicate, rows_other_shard=self.rows_other_shard,
            exhausted=int(self.exhausted), state=self.state, config_hash=self.config_hash)


@dataclass(slots=True, eq=False)
class Conv:
    """A conversation held in memory until it is finished (done, ended or failed)."""

    id: int
    ds: DsRun
    conv: Conversation
    row_index: int
    status: str  # pending (no answer yet) | active (some answers)
    answers: dict[int, AssistantMessage] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class Job:
    """One task: a request of one conversation, tried until done, failed or quarantined."""

    task_id: int
    conv: Conv
    turn: int
    messages: list[Message]
    tools: list[Tool] | None
    body: dict[str, Any]
    prompt_ids: array
    attempts: int = 0  # attempts so far, over every session
    quarantines: int = 0
    not_before: float = 0.0
    epoch: int = 0
    reservation: Reservation | None = None
    last_error: str | None = None
    max_tokens: int = 0  # as sent (the dataset's, unless a 402 made it shrink)
    shrunk_from: int | None = None  # the dataset's max_tokens when it was shrunk
    weight: float = 0.0  # estimated cost while in flight (in-flight budget)
    weight_before: float = 0.0  # in-flight weight when it was sent
    probe: bool = False  # sent to probe an endpoint that is down
    live: bool = False  # batch mode: this attempt goes live (batch_fallback), at live prices
    sent_at: float | None = None  # when the attempt in flight was sent (EndpointHealth clock)
    tool_matches: tuple[str, ...] = ()  # how the reused tool results in `messages` matched
    settings: SampleSettings | None = None  # the sampling it is sent with (recorded on it)
    renderer: Any = None  # the renderer of its thinking mode (prompt, answer, witness)

    @property
    def ds(self) -> DsRun:
        return self.conv.ds


class RetryQueue:
    """Jobs waiting out a backoff: a heap by the time they are due."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Job]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, job: Job, delay: float) -> None:
        job.not_before = time.monotonic() + delay
        heapq.heappush(self._heap, (job.not_before, next(self._seq), job))

    def pop_due(self) -> tuple[list[Job], float | None]:
        """The jobs whose backoff is over, and the time until the next one is due (None when
        none is left)."""
        now = time.monotonic()
        due = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap)[2])
        return due, (self._heap[0][0] - now if self._heap else None)

    def remove(self, ds: DsRun) -> list[Job]:
        """Take out (and return) the waiting jobs of one dataset."""
        gone = [item[2] for item in self._heap if item[2].ds is ds]
        if gone:
            self._heap = [item for item in self._heap if item[2].ds is not ds]
            heapq.heapify(self._heap)
        return gone
