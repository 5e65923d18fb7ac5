"""Stage 5, repetition: a repetition loop in the sampled ids (`[quality] repetition`).

The completion ids are measured as `specgen stats` measures them (quality.repetition): a loop
repeating at least `tokens` tokens of a block of at most `period` is recorded on the answer
(the `repetition` alarm counts it) and then flagged (kept; an event once per dataset and
provider) or quarantined as `repetition` (retried like any quarantine). `repetition = false`
turns the stage off.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import orjson

from ...quality.repetition import RepetitionRule, find_loop, repetition_rule
from .attempt import Answer, AnswerContext, Note
from .outcomes import Outcome, Quarantined


@lru_cache(maxsize=8)
def _rule(spec_json: bytes) -> RepetitionRule | None:
    return repetition_rule(orjson.loads(spec_json))


def rule_of(spec: Any) -> RepetitionRule | None:
    """The (validated, cached) rule of a `[quality] repetition` value."""
    return _rule(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS))


def check(a: Answer, ctx: AnswerContext) -> Outcome | None:
    rule = rule_of(ctx.cfg.quality.repetition)
    if rule is None or not a.completion:
        return None
    loop = find_loop(a.completion, rule.tokens, rule.period)
    if loop is None:
        return None
    a.repetition = loop
    detail = {"message": f"a block of {loop.period} token(s) repeated for {loop.tokens} tokens "
                         f"(from completion token {loop.start}; [quality] repetition: "
                         f"{rule.tokens}+ tokens)",
              "tokens": loop.tokens, "period": loop.period, "start": loop.start,
              "threshold": rule.tokens}
    if rule.action == "quarantine":
        return Quarantined("repetition", detail)
    a.notes.append(Note("repetition", f"answers of {a.resp.provider!r} hold repetition loops "
                                      f"({detail['message']}); kept (flagged): `specgen stats` "
                                      "lists them, `specgen export --max-repetition` leaves "
                                      "them out"))
    return None
