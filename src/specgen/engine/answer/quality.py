"""Stage 4, quality: what the run's `[quality]` policy makes of the witness's verdict.

A `mismatch` (the provider's counts contradict our ids) is quarantined as `count_mismatch`
(`on_count_mismatch = "quarantine"`, the default), or kept as `count_check = mismatch` and left
out of exports (`"flag"`, said once per dataset and provider), or kept silently (`"keep"`). An
`unverified` sample is quarantined as `no_witness` only with `require_witness = true`. The
quarantine's detail carries both counts (ours and the provider's) on both sides.
"""

from __future__ import annotations

from typing import Any

from .attempt import Answer, AnswerContext, Note
from .outcomes import Outcome, Quarantined


def check(a: Answer, ctx: AnswerContext) -> Outcome | None:
    q = ctx.cfg.quality
    check_ = a.count_check
    if check_ == "mismatch":
        if q.on_count_mismatch == "quarantine":
            return Quarantined("count_mismatch", count_figures(a))
        if q.on_count_mismatch == "flag":
            provider = a.resp.provider
            a.notes.append(Note("count_mismatch",
                                f"answers of {provider!r} contradict its own token counts "
                                f"({a.verdict.detail}); kept as count_check = mismatch, left "
                                "out of exports"))
    elif check_ == "unverified" and q.require_witness:
        return Quarantined("no_witness", count_figures(a))
    return None


def count_figures(a: Answer) -> dict[str, Any]:
    """The figures of a count verdict: the witness's words, and each side's counts (ours and
    the provider's; None where the answer reported none)."""
    usage = a.resp.usage if isinstance(a.resp.usage, dict) else {}

    def side(ours: int, key: str) -> dict[str, Any]:
        theirs = usage.get(key)
        return {"ours": ours, "provider": theirs if isinstance(theirs, int) else None}

    return {
        "message": a.verdict.detail if a.verdict is not None else "",
        "check": a.count_check,
        "settled": a.settled,
        "prompt": side(len(a.job.prompt_ids), "prompt_tokens"),
        "completion": side(len(a.completion or ()), "completion_tokens"),
    }
