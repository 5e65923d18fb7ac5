"""The answer path: every answer passes the stages below, in order (docs/design.md, "How an
answer travels").

    secret ─► usage ─► accept ─► size ─► normalise ─► witness ─► repeats ─► quality ─► repetition
    ─► record

Each stage is a module with one entry point, `check(answer, context)`, that fills in its part
of the `Answer` and returns an outcome (`Kept`, `Quarantined`, `Rejected`, `Fatal`) to end the
journey, or None to go on; `record` always ends it with `Kept`. A new rule about answers is a
new stage module and one line in `STAGES`. After the stages, the rejection breaker may turn a
rejection into `Fatal`, and the quality monitor observes the outcome (its exclusions and
alarms are handed back for the engine to carry out).

An answer larger than `OFF_LOOP_BYTES` (`answer_bytes`, the size stage's measure) runs its
stages in a worker thread (`judge`): normalising, rendering and the witness's candidates cost
about a second a MiB of text, which on the event loop would leave every other stream in
flight unread. One answer is judged at a time: answers that come meanwhile wait (the loop
keeps reading), then go in arrival order, one per turn of the loop; small answers otherwise
go straight through `process` on the loop. The breaker and the quality monitor always run on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from ...client.types import ChatResponse
from ...quality.monitor import Decision, QualityMonitor
from ..budget import Charge
from ..state import Job
from . import (
    accept,
    normalise,
    quality,
    record,
    rejudge,
    repeats,
    repetition,
    secret,
    size,
    usage,
    witness,
)
from .attempt import Answer, AnswerContext
from .observe import observation, rejudged_observation
from .outcomes import Kept, Outcome
from .record import response_json, unrepaired_row
from .size import answer_bytes

log = logging.getLogger("specgen.engine")
T = TypeVar("T")

# an answer this large is judged in a worker thread (~50 ms or more of work on the loop)
OFF_LOOP_BYTES = 64 * 1024
STALL_PROBE = 0.05  # s: how often the loop's lag is sampled while one is judged off it

Stage = Callable[[Answer, AnswerContext], Outcome | None]

STAGES: tuple[Stage, ...] = (
    secret.check,  # the API key or a proxy credential quoted: quarantined, stored masked
    usage.check,  # a malformed usage: treated as missing, a counted warning
    accept.check,  # provider, quantization and model allowed?
    size.check,  # within [endpoint] max_answer_bytes?
    normalise.check,  # the assistant message and the sampled ids, or a quarantine reason
    witness.check,  # what the provider's own counts say of the ids (and count repairs)
    repeats.check,  # repeated events no count can judge: quarantined
    quality.check,  # what the [quality] policy makes of that verdict
    repetition.check,  # a repetition loop in the sampled ids: flagged or quarantined
    record.check,  # the results row
)


@dataclass(frozen=True, slots=True)
class Processed:
    answer: Answer
    outcome: Outcome
    decisions: tuple[Decision, ...]  # exclusions and alarms the monitor asks for
    # earlier samples stored pending that this answer let the witness judge (rejudge)
    rejudged: tuple[rejudge.Change, ...]


class AnswerPipeline:
    """Runs each answer through `stages`; `process` is the one entry point."""

    def __init__(self, ctx: AnswerContext, monitor: QualityMonitor,
                 stages: tuple[Stage, ...] = STAGES, store=None):
        self.ctx = ctx
        self.monitor = monitor
        self.stages = stages
        self.rejudge = rejudge.Rejudge(ctx.witness, ctx.cfg.quality.on_count_mismatch, store)
        self.breaker = accept.RejectionBreaker()
        # held while an answer is judged off the loop; the answers that come meanwhile queue
        # on it and are then let through one per turn of the loop (streams read in between)
        self._turn = asyncio.Lock()

    def at_once(self, resp: ChatResponse) -> bool:
        """Whether `process` may judge `resp` now, on the loop: small, and no answer is
        being judged off the loop (else `judge`)."""
        return not self._turn.locked() and answer_bytes(resp, OFF_LOOP_BYTES) <= OFF_LOOP_BYTES

    def process(self, job: Job, resp: ChatResponse, charge: Charge) -> Processed:
        a = Answer(job=job, resp=resp, charge=charge)
        return self._conclude(a, self._stages(a))

    async def judge(self, job: Job, resp: ChatResponse, charge: Charge) -> Processed:
        """`process` for an answer that is large or comes while one is judged off the loop:
        it waits its turn, then a large one runs its stages in a worker thread."""
        async with self._turn:
            a = Answer(job=job, resp=resp, charge=charge)
            size = answer_bytes(resp, OFF_LOOP_BYTES)
            if size <= OFF_LOOP_BYTES:
                return self._conclude(a, self._stages(a))
            log.info("judging an answer of %s bytes from %s off the event loop", f"{size:,}",
                     resp.provider)
            started = time.monotonic()
            work = asyncio.ensure_future(asyncio.to_thread(self._staged_in_thread, a))
            stall = 0.0  # the loop's longest stall meanwhile: what other streams waited
            turns = 0  # probes that woke while the work still ran: the loop was free then
            while not work.done():
                woke = time.monotonic()
                await asyncio.wait((work,), timeout=STALL_PROBE)
                stall = max(stall, time.monotonic() - woke - STALL_PROBE)
                turns += not work.done()
            outcome, thread = work.result()
            log.info("an answer of %s bytes from %s judged off the event loop in %.2f s "
                     "(the loop's longest stall meanwhile: %.0f ms; %d turns of the loop "
                     "meanwhile; judged in thread %s)", f"{size:,}", resp.provider,
                     time.monotonic() - started, stall * 1000, turns, thread)
            return self._conclude(a, outcome)

    def _staged_in_thread(self, a: Answer) -> tuple[Outcome, str]:
        return self._stages(a), threading.current_thread().name

    def _stages(self, a: Answer) -> Outcome:
        outcome: Outcome | None = None
        for stage in self.stages:
            outcome = stage(a, self.ctx)
            if outcome is not None:
                break
        if outcome is None:
            raise RuntimeError("the answer path ended without an outcome (no record stage)")
        return outcome

    def _conclude(self, a: Answer, outcome: Outcome) -> Processed:
        outcome = self.breaker.judge(outcome)
        if isinstance(outcome, Kept) and a.verdict is not None and a.verdict.check == "pending":
            self.rejudge.hold(outcome.record, response_json(a.resp),
                              unrepaired_row(a, outcome.record))
        elif isinstance(outcome, Kept) and a.verdict is not None and \
                a.verdict.check in ("exact", "repaired"):
            self.rejudge.remember(outcome.record, unrepaired_row(a, outcome.record))
        decisions = self.monitor.observe(observation(a, outcome, self.ctx))
        changes = tuple(self.rejudge.take())
        return Processed(a, outcome, (*decisions, *self.observe(changes)), changes)

    def settle(self) -> tuple[tuple[rejudge.Change, ...], tuple[Decision, ...]]:
        """The session ends: every sample still pending judged, and what the monitor makes
        of those verdicts."""
        changes = tuple(self.rejudge.settle())
        return changes, tuple(self.observe(changes))

    def observe(self, changes: tuple[rejudge.Change, ...]) -> list[Decision]:
        """The monitor counts a re-judged sample's final verdict (it counted none at once)."""
        out: list[Decision] = []
        for c in changes:
            out += self.monitor.observe(rejudged_observation(c))
        return out


async def uncancelled(work: Awaitable[T]) -> T:
    """Await `work` to its end even when the awaiting task is cancelled meanwhile (a paid
    answer being judged is finished and carried out; the task then ends normally)."""
    task = asyncio.ensure_future(work)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
