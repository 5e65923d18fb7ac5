"""Stage 5, repeats: an answer whose text is largely byte-identical repeated stream events,
with no witness to say whether they are the model's or a relay's.

A relay that doubles every SSE event doubles the answer's text; with the provider's counts the
witness takes the repeats out (or finds the counts agree with them: the model wrote them).
Without counts (`unverified`), nothing tells a doubled answer from a model repeating itself,
so an answer whose repeated events add `REPEATED_SHARE` or more of its text (and at least
`REPEATED_EVENTS` of them) is quarantined as `repeated_events`, never exported as a sample.
"""

from __future__ import annotations

from .attempt import Answer, AnswerContext
from .outcomes import Outcome, Quarantined

REPEATED_SHARE = 0.25  # of the answer's text added by events repeating the one before
REPEATED_EVENTS = 4  # repeated events at least (one retransmission is the witness's matter)


def check(a: Answer, ctx: AnswerContext) -> Outcome | None:
    resp = a.resp
    spans = resp.duplicates
    if not spans or len(spans) < REPEATED_EVENTS or a.count_check != "unverified":
        return None
    total = len(resp.content or "") + len(resp.reasoning or "")
    repeated = sum(length for _field, _offset, length in spans)
    if total <= 0 or repeated < REPEATED_SHARE * total:
        return None
    return Quarantined("repeated_events", {
        "message": f"{len(spans)} stream events repeated the one before byte for byte, "
                   f"{repeated:,} of {total:,} characters of text, and no token counts to "
                   "tell a relay's doubling from the model's own repetition",
        "events": len(spans), "repeated_chars": repeated, "text_chars": total})
