"""Whose fault an alarm is: the rule that tells a fault of one provider (exclude it, the run
goes on) from one every provider shares (the alarm stands). docs/quality.md, "An alarm one
provider causes".

`blame(rule, window, capacity, routable)` is the one entry point. It reads the fired alarm's window
(each entry: hit, task, provider, label) and returns a `Blame`:

* `exclude` — the alarm's evidence sits on `suspects`: each has at least `MIN_OWN` (5) of
  its own answers in the window and, alone, its share passes the alarm's threshold; the other
  providers together have at least `MIN_OWN` answers and a share on the right side of
  the threshold by a factor 2 (above-alarms: at most half the threshold; `tool_calls`: at
  least twice it); and the policy still allows a provider once the suspects are out;
* `wait` — a provider's own share passes the threshold but it, or the others, have fewer
  answers than the rule needs, while the window is still short of twice the alarm's
  `min_samples` (then the evidence decides, or the alarm fires);
* `unproven` — as `wait`, once the window is that long (or when no other provider answered
  at all): the alarm fires, naming the providers whose share passes;
* `none_left` — the suspects are the cause, but no provider the policy allows would remain;
* `spread` — the cause is not one provider's: every provider with answers enough shows it, or
  the others' share is not clearly clean, or no provider passes the threshold alone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from .alarms import AlarmRule
from .observe import UNKNOWN

# Alarms a provider can cause: its serving stack, counts, schema handling or limits. A
# repetition loop is the model's and the sampling's, which every provider shares.
PROVIDER_CAUSED = frozenset({"raw_markers", "tool_calls", "schema_mismatch", "count_mismatch",
                             "quarantine", "unverifiable", "empty", "length"})
MIN_OWN = 5  # own answers in the window a suspect, and the others together, need at least
CLEAN_FACTOR = 2.0  # the others' share is this far on the right side of the threshold

Verdict = Literal["exclude", "wait", "unproven", "none_left", "spread"]
Entry = tuple[bool, int, str, "str | None"]


@dataclass(frozen=True, slots=True)
class Share:
    """One provider's (or the others') part of an alarm's window."""

    provider: str
    hits: int  # answers that are the alarm's evidence (for tool_calls: without a call)
    answers: int

    @property
    def share(self) -> float:
        return self.hits / self.answers if self.answers else 0.0

    def figure(self, rule: AlarmRule) -> float:
        """The share the alarm's threshold is about (tool_calls: the share with a call)."""
        return 1.0 - self.share if rule.below else self.share

    def passes(self, rule: AlarmRule) -> bool:
        f = self.figure(rule)
        return f < rule.threshold if rule.below else f > rule.threshold

    def clean(self, rule: AlarmRule) -> bool:
        f = self.figure(rule)
        return (f >= rule.threshold * CLEAN_FACTOR if rule.below
                else f <= rule.threshold / CLEAN_FACTOR)

    def text(self, rule: AlarmRule) -> str:
        return f"{100 * self.figure(rule):.0f}% of its {self.answers}"


@dataclass(frozen=True, slots=True)
class Blame:
    """The rule's decision on one fired alarm."""

    verdict: Verdict
    rule: AlarmRule
    suspects: tuple[Share, ...] = ()
    others: Share = Share("(others)", 0, 0)
    by_provider: tuple[Share, ...] = field(default_factory=tuple)

    @property
    def providers(self) -> tuple[str, ...]:
        return tuple(s.provider for s in self.suspects)

    def evidence(self) -> str:
        """`Bad 80% of its 10, Good 0% of its 12`: the alarm's figure per provider."""
        return ", ".join(f"{s.provider} {s.text(self.rule)}" for s in self.by_provider)

    def cause(self) -> str:
        """What the message says of the cause."""
        names = ", ".join(repr(p) for p in self.providers)
        if self.verdict == "exclude":
            mine = ", ".join(s.text(self.rule) for s in self.suspects)
            return (f"caused by provider {names} ({mine} answers, against "
                    f"{100 * self.others.figure(self.rule):.0f}% of the other providers' "
                    f"{self.others.answers})")
        if self.verdict == "none_left":
            return (f"caused by provider {names} ({self.evidence()}), but excluding it "
                    f"leaves no provider the policy allows")
        if len(self.by_provider) == 1:
            return f"one provider answered ({self.evidence()}): none to compare it with"
        if self.verdict in ("wait", "unproven"):
            return (f"whose it is cannot be told yet: too few answers of the other providers "
                    f"to compare ({self.evidence()})")
        return f"not one provider's: {self.evidence()}"

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "providers": list(self.providers),
                "by_provider": {s.provider: {"hits": s.hits, "answers": s.answers,
                                             "figure": round(s.figure(self.rule), 4)}
                                for s in self.by_provider},
                "others": {"hits": self.others.hits, "answers": self.others.answers,
                           "figure": round(self.others.figure(self.rule), 4)}}


def blame(rule: AlarmRule, window: Iterable[Entry], capacity: int | None = None,
          routable: Callable[[Collection[str]], bool] = lambda _names: True) -> Blame:
    """The rule's verdict on an alarm fired over `window` (its entries, oldest first; it
    holds at most `capacity`, so `wait` never outlasts a full window). `routable(names)`:
    whether a provider the policy allows remains once `names` are out."""
    counts: dict[str, list[int]] = {}
    n = 0
    for hit, _task, provider, _label in window:
        c = counts.setdefault(provider, [0, 0])
        c[0] += bool(hit)
        c[1] += 1
        n += 1
    shares = tuple(sorted((Share(p, h, a) for p, (h, a) in counts.items()),
                          key=lambda s: (-s.answers, s.provider)))
    need = MIN_OWN
    passing = [s for s in shares if s.provider != UNKNOWN and s.passes(rule)]
    suspects = tuple(s for s in passing if s.answers >= need)
    rest = [s for s in shares if s not in suspects]
    others = Share("(others)", sum(s.hits for s in rest), sum(s.answers for s in rest))
    made = dict(rule=rule, suspects=suspects, others=others, by_provider=shares)
    short = n < min(2 * rule.min_samples, capacity or n + 1)
    if not passing:
        return Blame("spread", **made)
    if not suspects or others.answers < need:
        if not others.answers and len(suspects) == len(passing):
            # every provider that answered shows it; or one answered: none to compare
            return Blame("spread" if len(suspects) > 1 else "unproven", **made)
        return Blame("wait" if short else "unproven", **made)
    if not others.clean(rule):
        return Blame("wait" if short and len(suspects) < len(passing) else "spread", **made)
    if not routable(tuple(s.provider for s in suspects)):
        return Blame("none_left", **made)
    return Blame("exclude", **made)
