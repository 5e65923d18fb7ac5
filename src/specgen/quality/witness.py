"""The count witness: every sample checked against the provider's own token counts.

On a hosted API the rebuilt ids are a reconstruction; the provider's `usage.prompt_tokens` and
`usage.completion_tokens` (counted with the model's own tokenizer on most stacks) are the one
independent witness of what the model processed and sampled. Each sample gets a verdict:

* `exact` — the completion count agrees with ours after the provider's learned offset, and
  the prompt is the official rendering or this provider's rendering of its request shape;
* `repaired` — the completion (or the prompt) agrees after a count-guided repair
  (`quality.repairs`);
* `pending` — the completion is right, the prompt side waits for its shape's rendering
  (`quality.shapes`): judged again once known, or when the session ends;
* `unverified` — no witness: the provider reports no usage, or its counts are unusable
  (its deltas against ours never settle on a constant);
* `mismatch` — the counts contradict our ids on either side: the sample is wrong.

The two sides are judged apart and recorded on the verdict (`prompt_check`,
`completion_check`, both deltas, the request shape). The prompt side is learnt per provider
and request shape by `quality.shapes.ShapeBook` (docs/quality.md, "Two sides"). The completion
offset is learnt per provider from the deltas (provider − ours) of its plain answers (those no
known transformation could touch): most providers count exactly (0); some count the stop
token differently (a constant of at most `MAX_OFFSET`). Until a provider has `WARMUP` answers
the offset is taken as 0. Its counts are `unusable` once `UNUSABLE_AFTER` answers show no
delta holding half of them (every answer, its delta taken after its repair), or
`UNUSABLE_AFTER` plain ones hold none for `STABLE_SHARE` while scattering.

`CountWitness.judge` is the one entry point.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .shapes import ShapeBook, combine

WARMUP = 5  # answers before a provider's offset is trusted (0 until then)
STABLE_SHARE = 0.8  # the offset holds for at least this share of the recent answers
UNUSABLE_AFTER = 20  # answers after which no dominant offset means "counts unusable"
UNUSABLE_SHARE = 0.5
WINDOW = 200  # recent deltas kept per provider and side
# A counting rule differs by a token or two (the stop token, a BOS); a bigger constant is not
# counting but content — a hidden system prompt — and stays a mismatch.
MAX_OFFSET = 2


@dataclass(slots=True)
class Side:
    """The deltas of one provider's counts on one side (prompt or completion)."""

    deltas: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    counts: Counter = field(default_factory=Counter)  # of the deltas in the window

    def add(self, delta: int) -> None:
        if len(self.deltas) == WINDOW:
            old = self.deltas[0]
            self.counts[old] -= 1
            if not self.counts[old]:
                del self.counts[old]
        self.deltas.append(delta)
        self.counts[delta] += 1

    def state(self) -> tuple[str, int]:
        """("learning" | "stable" | "unsettled" | "off_by_content" | "unusable", offset to
        expect)."""
        n = len(self.deltas)
        if n < WARMUP:
            return "learning", 0
        offset, hits = self.counts.most_common(1)[0]
        share = hits / n
        if n >= UNUSABLE_AFTER and share < UNUSABLE_SHARE or (
                n >= UNUSABLE_AFTER and share < STABLE_SHARE and len(self.counts) > 3):
            return "unusable", 0
        if abs(offset) > MAX_OFFSET:
            return "off_by_content", 0  # e.g. a hidden system prompt: every answer mismatches
        return ("stable" if share >= STABLE_SHARE else "unsettled"), offset

    def scattered(self) -> bool:
        """No delta holds half of at least UNUSABLE_AFTER answers: no counting at all."""
        n = len(self.deltas)
        return n >= UNUSABLE_AFTER and self.counts.most_common(1)[0][1] / n < UNUSABLE_SHARE

    def settled(self) -> bool:
        """The deltas hold one constant (whatever it is) for most recent answers."""
        n = len(self.deltas)
        return n >= WARMUP and self.counts.most_common(1)[0][1] / n >= STABLE_SHARE


@dataclass(slots=True)
class Verdict:
    check: str  # exact | repaired | unverified | mismatch
    detail: str = ""
    repairs: list[str] = field(default_factory=list)
    message: Any = None  # the repaired AssistantMessage (check "repaired"; None: unchanged)
    ids: list[int] | None = None  # its completion ids
    prompt_ids: list[int] | None = None  # the prompt the model saw, when a repair found it
    prompt_messages: Any = None  # the history as the serving stack rendered it, then
    # each side on its own (quality.shapes): prompt exact | rendering | pending | repaired |
    # mismatch | unverified | unjudged (the completion is wrong); completion exact |
    # repaired | mismatch | unverified; the deltas provider − ours; the request shape
    prompt_check: str | None = None
    completion_check: str | None = None
    prompt_delta: int | None = None
    completion_delta: int | None = None
    shape: str | None = None
    # judged with the provider's completion counting settled (one delta holding for most
    # recent answers); False while learning it, or while its deltas vary
    settled: bool = True


Repair = Callable[[int], tuple[Any, list[int], list[str]] | None]
PromptRepair = Callable[[int], tuple[list[int], list[str]] | None]


def _count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


class CountWitness:
    def __init__(self) -> None:
        self.sides: dict[tuple[str, str], Side] = {}
        self.shapes = ShapeBook()

    def _side(self, provider: str, which: str) -> Side:
        side = self.sides.get((provider, which))
        if side is None:
            side = self.sides[(provider, which)] = Side()
        return side

    def judge(self, provider: str, *, prompt: int, completion: int, usage: dict[str, Any],
              repair: Repair | None = None, prompt_repair: PromptRepair | None = None,
              shape: str = "", tools: bool = False, key: Any = None) -> Verdict:
        """Our counts (`prompt`, `completion` ids) against the answer's `usage`. `repair(n)`
        tries the known transformations for a completion of exactly n ids; None when no
        transformation could apply to this answer (a plain answer: only those teach the
        provider's completion offset, since a re-serialised or padded answer's delta is not
        the provider's counting). `prompt_repair(n)` does the same for the prompt (None: a
        plain prompt). The prompt side is judged per request `shape` (`quality.shapes`:
        `tools` says whether the request declared tools; `key`, the sample's task id, names a
        pending sample when its shape's rendering becomes known)."""
        theirs_p, theirs_c = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
        if theirs_c is None:
            return Verdict("unverified", "no usage counts in the answer")
        cs = self._side(provider, "completion")
        c_state, c_off = cs.state()
        settled = cs.settled()
        problems: list[str] = []
        fixed_prompt: tuple[list[int], list[str]] | None = None
        p_check, dp = "unverified", None
        if theirs_p is not None:
            dp = theirs_p - prompt
            expected = self.shapes.expected(provider, shape)
            base = expected if expected is not None else 0
            if prompt_repair is not None and dp != base:
                fixed_prompt = prompt_repair(theirs_p - base)
                if fixed_prompt is not None:
                    dp = theirs_p - len(fixed_prompt[0])
            p_check = "pending"  # judged below, once the completion's verdict is known
        dc = theirs_c - completion
        plain = repair is None
        if plain:
            cs.add(dc)
        verdict = Verdict("exact")
        every = self._side(provider, "every")  # every answer's delta, after its repair
        if c_state == "unusable" or (plain and cs.state()[0] == "unusable") \
                or every.scattered():
            verdict = Verdict("unverified", f"{provider}'s completion counts are unusable "
                                            f"(ours {completion}, provider {theirs_c})")
        elif dc != c_off:
            # A delta of a token or two may be the provider's counting while its offset is
            # not yet known: no repair may explain it away then.
            known = c_state in ("stable", "unsettled")
            fixed = (repair(theirs_c - c_off)
                     if repair is not None
                     and (known or abs(dc - c_off) > MAX_OFFSET) else None)
            if fixed is not None:
                message, ids, names = fixed
                verdict = Verdict("repaired", f"completion: ours {completion} -> {len(ids)} "
                                              f"after {'+'.join(names)}, provider {theirs_c}",
                                  names, message, ids)
            else:
                problems.append(f"completion: ours {completion}, provider {theirs_c} "
                                f"(expected offset {c_off:+d})")
        verdict.settled = settled
        if verdict.ids is not None:  # the delta that is left: the provider's counting
            every.add(theirs_c - len(verdict.ids))
        elif verdict.check != "unverified" and (not problems or abs(dc - c_off) > MAX_OFFSET):
            every.add(dc)  # (a small unexplained delta may be a transformation's: left out)
        c_check = "mismatch" if problems else verdict.check
        if dp is not None:
            p_check = self.shapes.judge(provider, shape, dp, tools=tools, key=key,
                                        completion_check=c_check) \
                if c_check != "mismatch" else "unjudged"
            if p_check == "mismatch":
                problems.insert(0, f"prompt: ours {prompt}, provider {theirs_p} (this "
                                   f"provider's delta for this request shape: "
                                   f"{_signed(self.shapes.expected(provider, shape))})")
            elif p_check in ("exact", "rendering") and fixed_prompt is not None:
                p_check = "repaired"
        sides = dict(prompt_check=p_check, completion_check=c_check, prompt_delta=dp,
                     completion_delta=dc, shape=shape)
        if problems:
            return Verdict("mismatch", "; ".join(problems), settled=settled, **sides)
        if fixed_prompt is not None and p_check == "repaired":
            ids, names = fixed_prompt
            note = f"prompt: ours {prompt} -> {len(ids)} after {'+'.join(names)}, " \
                   f"provider {theirs_p}"
            verdict.detail = f"{note}; {verdict.detail}" if verdict.detail else note
            verdict.repairs = [*names, *verdict.repairs]
            verdict.prompt_ids = ids
        for k, v in sides.items():
            setattr(verdict, k, v)
        verdict.check = combine(c_check, p_check if p_check != "unjudged" else "exact")
        if p_check in ("rendering", "pending") and dp:
            note = f"prompt: provider {theirs_p}, ours {prompt} ({_signed(dp)}: " + (
                "its rendering of this request shape)" if p_check == "rendering" else
                "this request shape's rendering not known yet: judged again when it is)")
            verdict.detail = f"{verdict.detail}; {note}" if verdict.detail else note
        return verdict

    def seed(self, provider: str, prompt_delta: int | None, completion_delta: int) -> None:
        """An earlier session's sample that its counts vouched for (exact or repaired): its
        deltas are the provider's offsets, so a resumed run does not learn them again."""
        del prompt_delta  # the prompt side is learnt per request shape (seed_shape)
        self._side(provider, "completion").add(completion_delta)

    def seed_shape(self, provider: str, shape: str, delta: int, *, tools: bool,
                   key: Any = None, pending: bool = False,
                   completion_check: str = "exact") -> None:
        """A stored sample's prompt delta for its shape (a pending one is judged again)."""
        self.shapes.seed(provider, shape, delta, tools=tools, key=key, pending=pending,
                         completion_check=completion_check)

    def state(self, provider: str) -> dict[str, Any]:
        """A provider's learned offsets: {side: {"state", "offset", "answers"}}."""
        out = {}
        for which in ("prompt", "completion"):
            side = self.sides.get((provider, which))
            if side is not None:
                st, off = side.state()
                out[which] = {"state": st, "offset": off, "answers": len(side.deltas)}
        return out

    def unusable(self, provider: str) -> bool:
        side = self.sides.get((provider, "completion"))
        every = self.sides.get((provider, "every"))
        return (side is not None and side.state()[0] == "unusable") or (
            every is not None and every.scattered())

    def to_json(self) -> dict[str, Any]:
        shapes = self.shapes.to_json()
        # list(): one copy, taken at once (a large answer is judged in a worker thread while
        # the loop writes live.json)
        out = {p: self.state(p) for p in sorted({p for p, _ in list(self.sides)})}
        for p, st in out.items():
            if self.unusable(p):
                st["counts_unusable"] = True
        for p, by_shape in shapes.items():
            out.setdefault(p, {})["prompt_shapes"] = by_shape
        return out


def _signed(n: int | None) -> str:
    return "not known" if n is None else f"{n:+d}"
