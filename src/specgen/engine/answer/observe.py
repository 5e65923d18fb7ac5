"""What the quality monitor learns from an answer's outcome (`quality.observe.Observation`)."""

from __future__ import annotations

from ...display import UNKNOWN_PROVIDER
from ...quality.observe import JUDGED, UNKNOWN, Observation
from .attempt import Answer, AnswerContext
from .outcomes import Fatal, Kept, Outcome, Quarantined


def observation(a: Answer, outcome: Outcome, ctx: AnswerContext) -> Observation:
    job, resp = a.job, a.resp
    if isinstance(outcome, Kept):
        kind, reason = "ok", None
    elif isinstance(outcome, Quarantined):
        kind, reason = "quarantined", outcome.reason
    else:
        rejected = outcome.rejected if isinstance(outcome, Fatal) else outcome
        kind, reason = "rejected", rejected.reason if rejected is not None else None
    message = a.message if kind == "ok" else None
    judged = a.count_check if a.settled and kind != "rejected" else None
    return Observation.of_answer(
        provider=resp.provider, dataset=job.ds.name, task=job.task_id, outcome=kind,
        reason=reason, tools_offered=bool(job.tools), content=resp.content,
        reasoning=resp.reasoning, api_calls=bool(resp.tool_calls),
        message_calls=None if message is None else bool(message.tool_calls),
        repairs=a.repairs if kind == "ok" else (), count_check=judged,
        finish_reason=resp.finish_reason,
        quantization_mismatch=ctx.policy.quantization_mismatch(resp.provider,
                                                               resp.quantization),
        after_tool_result=bool(job.messages) and job.messages[-1].get("role") == "tool",
        repetition=a.repetition is not None,
        witness=a.count_check if kind != "rejected" else None,
        counts_unusable=kind != "rejected" and a.count_check == "unverified" and (
            (a.verdict is not None and a.verdict.unvouched)
            or ctx.witness.unusable(resp.provider or resp.base_url or UNKNOWN_PROVIDER)))


def rejudged_observation(change) -> Observation:
    """A sample judged again (`answer.rejudge.Change`: stored pending, or made unverified as
    its form split): only its count verdict is news (its other figures were counted when it
    arrived)."""
    quarantined = change.quarantine is not None
    return Observation(
        provider=change.provider or UNKNOWN, dataset=change.dataset, task=change.task,
        outcome="quarantined" if quarantined else "ok",
        reason=change.quarantine.reason if quarantined else None,
        count_check=change.after if change.after in JUDGED else None,
        witness=change.after, rejudged=True, counts_unusable=change.unvouched)
