"""The completion side's evidence: a provider's counting offset per answer form.

Real providers count a completion differently by its *form* (`../shared/reference/
openrouter-api.md`, "A larger sample"): kimi-k2-0905 upstreams agree on plain answers (0) and
count tool-call answers one fewer (−1); Azure K2.5 counts reasoning answers −1 and reasoning +
tool-call answers −2. So the offset is learnt per (provider, form), from *every* answer of
that form:

* `plain` — no reasoning, no tool calls;
* `reasoning` — non-empty reasoning, no tool calls;
* `tools` — tool calls, no (or empty) reasoning;
* `reasoning+tools` — both.

Each answer brings the set of offsets (−2 … +2) under which it is right: exact at that offset,
or repaired to it by exactly one count-guided repair (re-serialised arguments, whitespace,
repeated events), so the repairs are solved jointly with the offset. An offset is **adopted**
only when it is in the set of at least `SHARE` (80%) of the form's answers (those that some
offset explains): mid-run once `WARMUP` answers are in, at the session's end with any number.
A form whose answers split (no offset holding 80% once `SPLIT_AFTER` answers are in, or at the
end; or an adopted offset that drops below 80%) is **split** for the session: its samples are
`unverified`, the latest ones judged at the offset it had adopted included (judged again).

Sampled forms: an answer the model may have sampled in another form (a Kimi tool call without
`<|tool_calls_section_end|>`, `quality.repairs.form_repair`) supports offsets in a second table.
Those forms are the interpretation only when that table's best offset explains strictly more
answers than the plain table's (from SPLIT_AFTER answers mid-run); a tie (the same answers
explained as a counting offset or as a sampled form) waits up to TIE_AFTER answers, then keeps
the counting offset (docs/quality.md, "Sampled forms").
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

FORMS = ("plain", "reasoning", "tools", "reasoning+tools")
MAX_OFFSET = 2  # a counting rule (a stop token, a section marker) differs by a token or two
OFFSETS = tuple(range(-MAX_OFFSET, MAX_OFFSET + 1))
WARMUP = 5  # answers of a form before an offset may be adopted mid-run
SPLIT_AFTER = 10  # answers of a form after which no offset holding SHARE means split
SHARE = 0.8  # the evidence rule: an offset must explain this share of the form's answers
WINDOW = 200  # recent answers kept per provider and form
TIE_AFTER = 40  # answers after which a tie between the two tables is broken (plain)


def answer_form(message: Any) -> str:
    """The form of an assistant message (module docstring)."""
    reasoning = bool(getattr(message, "reasoning", None))
    tools = bool(getattr(message, "tool_calls", None))
    return ("reasoning+tools" if tools else "reasoning") if reasoning else (
        "tools" if tools else "plain")


class Members(OrderedDict):
    """The latest WINDOW samples judged at a form's offset (older ones were vouched for by
    the evidence of their time and stay as judged)."""

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        if len(self) > WINDOW:
            self.popitem(last=False)


@dataclass(slots=True)
class Table:
    """Which offsets a form's answers support, under one set of repairs."""

    supports: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    counts: Counter = field(default_factory=Counter)  # offset -> answers supporting it
    # offset -> answers right at it as answered: exact, or in a form the model may have
    # sampled for the unchanged text (`sampled_form:*`), no transformation undone
    exact: Counter = field(default_factory=Counter)

    def add(self, support: dict[int, bool]) -> None:
        if len(self.supports) == WINDOW:
            for o, was_exact in self.supports[0].items():
                self.counts[o] -= 1
                self.exact[o] -= int(was_exact)
        self.supports.append(support)
        for o, was_exact in support.items():
            self.counts[o] += 1
            self.exact[o] += int(was_exact)

    def best(self) -> tuple[int | None, float]:
        """The offset explaining most answers (ties: more of them right as answered, then
        the smaller |offset|) and its share."""
        n = len(self.supports)
        if not n:
            return None, 0.0
        o = max(OFFSETS, key=lambda k: (self.counts[k], self.exact[k], -abs(k)))
        return o, self.counts[o] / n

    def share(self, offset: int) -> float:
        n = len(self.supports)
        return self.counts[offset] / n if n else 0.0


@dataclass(slots=True)
class Form:
    """The evidence of one provider's answers of one form, in two tables: `plain` with the
    provider-side repairs, `sampled` with the sampled forms joined (`quality.repairs.
    form_repair`; the same as `plain` for answers with no other form). The sampled forms are
    the interpretation only when they explain strictly more answers than the plain table's
    best offset does (module docstring, "Sampled forms")."""

    plain: Table = field(default_factory=Table)
    sampled: Table = field(default_factory=Table)
    offset: int | None = None  # adopted
    forms: bool = False  # adopted with the sampled forms (judged from `sampled`)
    split: bool = False
    # key -> its prompt check, of the latest samples judged at `offset` (WINDOW of them: the
    # evidence they were judged on): made unverified if the form splits
    members: Members = field(default_factory=lambda: Members())

    @property
    def supports(self) -> deque:
        return self.plain.supports

    def add(self, support: dict[int, bool], sampled: dict[int, bool] | None = None) -> None:
        """An answer right under the offsets of `support` ({offset: right there as
        answered}), and of `sampled` with the sampled forms (None: the same)."""
        self.plain.add(support)
        self.sampled.add(support if sampled is None else sampled)

    def table(self) -> Table:
        return self.sampled if self.forms else self.plain

    def choice(self) -> tuple[bool, int | None, float, bool]:
        """(with sampled forms, best offset, its share, whether the two tables tie): the
        sampled forms only when their best offset explains more answers."""
        op, sp = self.plain.best()
        os_, ss = self.sampled.best()
        if ss > sp:
            return True, os_, ss, False
        return False, op, sp, ss == sp and os_ != op

    def best(self) -> tuple[int | None, float]:
        _, o, share, _ = self.choice()
        return o, share

    def share(self, offset: int) -> float:
        return self.table().share(offset)

    def evaluate(self, final: bool = False) -> str | None:
        """Apply the evidence rule; "adopted" or "split" when the state changed."""
        if self.split:
            return None
        n = len(self.plain.supports)
        if not n:
            return None
        if self.offset is not None:
            if self.share(self.offset) >= SHARE or (n < SPLIT_AFTER and not final):
                return None
            self.split, self.offset = True, None
            return "split"
        forms, o, share, tie = self.choice()
        # a tie between the tables (the same answers at −1 as counted, or at 0 without the
        # section end) waits for an answer that tells them apart, up to TIE_AFTER answers
        # the sampled forms, which widen what each answer supports, need SPLIT_AFTER answers
        ready = final or n >= TIE_AFTER or (
            not tie and n >= (SPLIT_AFTER if forms else WARMUP))
        if share >= SHARE and ready:
            self.offset, self.forms = o, forms
            return "adopted"
        if share < SHARE and (n >= SPLIT_AFTER or final):
            self.split = True
            return "split"
        return None

    def state(self) -> str:
        return "split" if self.split else "adopted" if self.offset is not None else "learning"

    def to_json(self) -> dict[str, Any]:
        o, share = self.best()
        return {"state": self.state(), "offset": self.offset, "answers": len(self.supports),
                "best": o, "share": round(share, 3), "sampled_forms": self.forms}
