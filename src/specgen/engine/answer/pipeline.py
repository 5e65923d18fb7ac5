"""The answer path: every answer passes the stages below, in order (docs/design.md, "How an
answer travels").

    usage ─► accept ─► size ─► normalise ─► witness ─► repeats ─► quality ─► repetition
    ─► record

Each stage is a module with one entry point, `check(answer, context)`, that fills in its part
of the `Answer` and returns an outcome (`Kept`, `Quarantined`, `Rejected`, `Fatal`) to end the
journey, or None to go on; `record` always ends it with `Kept`. A new rule about answers is a
new stage module and one line in `STAGES`. After the stages, the rejection breaker may turn a
rejection into `Fatal`, and the quality monitor observes the outcome (its exclusions and
alarms are handed back for the engine to carry out).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...client.types import ChatResponse
from ...quality.monitor import Decision, QualityMonitor
from ..budget import Charge
from ..state import Job
from . import accept, normalise, quality, record, rejudge, repeats, repetition, size, usage, witness
from .attempt import Answer, AnswerContext
from .observe import observation, rejudged_observation
from .outcomes import Kept, Outcome
from .record import response_json

Stage = Callable[[Answer, AnswerContext], Outcome | None]

STAGES: tuple[Stage, ...] = (
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

    def process(self, job: Job, resp: ChatResponse, charge: Charge) -> Processed:
        a = Answer(job=job, resp=resp, charge=charge)
        outcome: Outcome | None = None
        for stage in self.stages:
            outcome = stage(a, self.ctx)
            if outcome is not None:
                break
        if outcome is None:
            raise RuntimeError("the answer path ended without an outcome (no record stage)")
        outcome = self.breaker.judge(outcome)
        if isinstance(outcome, Kept) and a.verdict is not None and a.verdict.check == "pending":
            self.rejudge.hold(outcome.record, response_json(resp))
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
