"""Stage 1, usage: a `usage` the client had to clean (a count or cost that was not a
non-negative number: `"abc"`, `-20000`, NaN, an object that is not one) is treated as missing
— the answer is kept, unverified by the count witness, and nothing bad is charged — and each
such answer is a counted warning (`usage_invalid` events, the first per dataset and provider
logged). This stage never ends the journey."""

from __future__ import annotations

from .attempt import Answer, AnswerContext, Note
from .outcomes import Outcome


def check(a: Answer, ctx: AnswerContext) -> Outcome | None:
    bad = a.resp.usage_warnings
    if bad:
        who = a.resp.provider or a.resp.base_url or "the provider"
        a.notes.append(Note("usage_invalid", f"{who} sent a malformed usage "
                            f"({'; '.join(bad[:4])}): treated as missing (not charged, "
                            "counts not judged)", once=False))
    return None
