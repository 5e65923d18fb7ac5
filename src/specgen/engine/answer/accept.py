"""Stage 1, accept: is this answer from a provider, quantization and model the run allows?

An answer outside `[endpoint.provider]` (an ignored or excluded provider, a quantization not
allowed) or from another model than the one asked for is rejected: its cost is counted and the
task retried (docs/engine.md, "Provider policy"). A run whose answers are all rejected is
misconfigured: `RejectionBreaker` stops it after `REJECTION_BREAKER` in a row.
"""

from __future__ import annotations

from .attempt import Answer, AnswerContext
from .outcomes import Fatal, Kept, Outcome, Rejected

REJECTION_BREAKER = 100  # consecutive policy rejections that stop the run (a bad policy)


def check(a: Answer, ctx: AnswerContext) -> Outcome | None:
    resp = a.resp
    reason = ctx.policy.rejection(resp.provider, resp.quantization)
    if reason is None:
        reason = ctx.model_check.rejection(resp.model)
    if reason is None:
        return None
    what = (f"model {resp.model!r} (asked: {ctx.cfg.target.model!r})"
            if reason == "wrong_model" else f"provider {resp.provider!r}")
    return Rejected(reason, what)


class RejectionBreaker:
    """Counts rejections in a row (a kept answer resets it); the one that reaches the limit
    becomes `Fatal`: every answer is paid for, so a policy that rejects all stops the run."""

    def __init__(self, limit: int = REJECTION_BREAKER):
        self.limit = limit
        self.in_a_row = 0

    def judge(self, outcome: Outcome) -> Outcome:
        if isinstance(outcome, Kept):
            self.in_a_row = 0
        elif isinstance(outcome, Rejected):
            self.in_a_row += 1
            if self.in_a_row == self.limit:
                fix = ("[endpoint] accept_models, or route to providers that serve the model"
                       if outcome.reason == "wrong_model"
                       else "[endpoint.provider] against the endpoint list")
                return Fatal(
                    f"the last {self.in_a_row} answers were all rejected (latest: "
                    f"{outcome.what}, {outcome.reason}); every answer is paid for, so the run "
                    f"stops — check {fix}", rejected=outcome)
        return outcome
