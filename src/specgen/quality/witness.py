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
        self.open: dict[Any, _Open] = {}  # completion side waiting for the offset
        self.decided: dict[Any, tuple[_Open, Verdict]] = {}  # ... for its prompt side now
        self.resolved: list[Resolution] = []

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
        every = self._side(provider, "every")  # every answer's delta, after its repair
        candidates = None
        if c_state == "unusable" or (plain and cs.state()[0] == "unusable") \
                or every.scattered():
            verdict = Verdict("unverified", f"{provider}'s completion counts are unusable "
                                            f"(ours {completion}, provider {theirs_c})")
        elif c_state in ("stable", "unsettled", "off_by_content"):
            verdict = _completion_side(completion, theirs_c, dc, c_off, repair)
        else:
            # the offset is not known yet: the verdict under every offset it may turn out
            # to be; one verdict for all of them is final now, else the sample waits
            candidates = {o: _completion_side(completion, theirs_c, dc, o, repair)
                          for o in OFFSETS}
            verdict = _agreed(candidates)
            if verdict is None and cs.state()[0] != "learning":  # this answer taught it
                verdict = candidates.get(cs.state()[1]) or candidates[0]
            if verdict is not None:
                candidates = None
            else:
                verdict = Verdict("exact")  # ours, unchanged meanwhile
        verdict.settled = settled
        if candidates is None:
            _learn_every(every, verdict, theirs_c, dc, c_off)
        if verdict.check == "mismatch":
            problems.append(verdict.detail)
        c_check = "mismatch" if problems else verdict.check
        if candidates is not None:
            c_check = verdict.completion_check = "pending"
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
        if candidates is not None and p_check == "mismatch":
            candidates = None  # a mismatch whatever the offset: final now
            c_check = verdict.completion_check = verdict.check
        sides = dict(prompt_check=p_check, completion_check=c_check, prompt_delta=dp,
                     completion_delta=dc, shape=shape)
        if candidates is not None:
            self.open[key if key is not None else object()] = _Open(
                provider, candidates, p_check, theirs_c, dc)
        if c_state == "learning" and cs.state()[0] != "learning":  # this answer taught it
            self._resolve_completion(provider)
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
        if candidates is not None:
            verdict.detail = "completion: waits for the provider's counting offset; " + (
                verdict.detail or f"ours {completion}, provider {theirs_c}")
        if p_check in ("rendering", "pending") and dp:
            note = f"prompt: provider {theirs_p}, ours {prompt} ({_signed(dp)}: " + (
                "its rendering of this request shape)" if p_check == "rendering" else
                "this request shape's rendering not known yet: judged again when it is)")
            verdict.detail = f"{verdict.detail}; {note}" if verdict.detail else note
        return verdict

    def _resolve_completion(self, provider: str, offset: int | None = None) -> None:
        """The provider's offset is known (or the session ends: `offset`): every sample of it
        whose completion side waited gets the verdict for that offset."""
        if offset is None:
            offset = self._side(provider, "completion").state()[1]
        every = self._side(provider, "every")
        for key in [k for k, o in self.open.items() if o.provider == provider]:
            o = self.open.pop(key)
            v = o.candidates.get(offset, o.candidates[0])
            _learn_every(every, v, o.theirs, o.delta, offset)
            self.decided[key] = (o, v)
        self._emit()

    def _emit(self) -> None:
        """Samples whose both sides are now judged go to `resolved`."""
        for r in self.shapes.take_resolved():
            if r.key in self.open:  # its completion waits still
                self.open[r.key].prompt_check = r.prompt_check
            elif r.key in self.decided:
                self.decided[r.key][0].prompt_check = r.prompt_check
            else:
                self.resolved.append(Resolution(r.key, combine(r.completion_check,
                                                               r.prompt_check),
                                                r.prompt_check, r.completion_check))
        for key in [k for k, (o, _) in self.decided.items() if o.prompt_check != "pending"]:
            o, v = self.decided.pop(key)
            c = v.check
            p = "unjudged" if c == "mismatch" and o.prompt_check != "mismatch" \
                else o.prompt_check
            self.resolved.append(Resolution(
                key, combine(c, p if p != "unjudged" else "exact"), p, c, v))

    def take_resolved(self) -> list[Resolution]:
        """The samples judged again since the last call (both sides final)."""
        self._emit()
        out, self.resolved = self.resolved, []
        return out

    def settle(self) -> list[Resolution]:
        """The session ends: every sample still pending gets its final verdict — the
        completion side at its provider's offset (while still learning: its most common
        plain delta within a counting offset, else 0), the prompt side by
        `ShapeBook.settle`."""
        for provider in sorted({o.provider for o in self.open.values()}):
            side = self._side(provider, "completion")
            state, offset = side.state()
            if state == "learning":
                common = side.counts.most_common(1)
                offset = common[0][0] if common and abs(common[0][0]) <= MAX_OFFSET else 0
            self._resolve_completion(provider, offset)
        for r in self.shapes.settle():
            self.shapes.resolved.append(r)
        return self.take_resolved()

    def seed(self, provider: str, prompt_delta: int | None, completion_delta: int) -> None:
        """An earlier session's sample that its counts vouched for (exact or repaired): its
        deltas are the provider's offsets, so a resumed run does not learn them again."""
        del prompt_delta  # the prompt side is learnt per request shape (seed_shape)
        self._side(provider, "completion").add(completion_delta)

    def learn_offset(self, provider: str, offset: int) -> None:
        """A provider's completion counting offset measured beforehand (`specgen probe`):
        known at once, so its first answers are judged on arrival."""
        side = self._side(provider, "completion")
        for _ in range(max(0, WARMUP - len(side.deltas))):
            side.add(offset)
        self._resolve_completion(provider)

    def seed_open(self, provider: str, key: Any, *, theirs: int, delta: int, stored: int,
                  prompt_check: str, repairs: list[str]) -> None:
        """An earlier session's sample stored with its completion side waiting (`stored`
        completion ids, its count `repairs`): its verdict stands at the offset it was stored
        for (the provider's count minus those ids); at another one it is a mismatch (the raw
        answer, to try other repairs with, is not kept)."""
        at = theirs - stored
        check = "repaired" if repairs else "exact"
        self.open[key] = _Open(provider, {
            o: Verdict(check, repairs=list(repairs)) if o == at else
            Verdict("mismatch", f"completion: ours {stored}, provider {theirs} (expected "
                                f"offset {o:+d})") for o in OFFSETS},
            prompt_check, theirs, delta)
        if self._side(provider, "completion").state()[0] != "learning":
            self._resolve_completion(provider)

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


OFFSETS = tuple(range(-MAX_OFFSET, MAX_OFFSET + 1))  # the counting offsets a provider may have


@dataclass(slots=True)
class _Open:
    """A sample whose completion side waits for its provider's counting offset: its verdict
    under each offset, and its prompt side's (`pending` while that waits too)."""

    provider: str
    candidates: dict[int, Verdict]
    prompt_check: str
    theirs: int  # the provider's completion count
    delta: int  # provider − ours (before any repair)


@dataclass(slots=True)
class Resolution:
    """A pending sample's final verdict: `count_check` and each side's, and `completion` the
    completion side's verdict (its repair's ids and message, when the offset chose one)."""

    key: Any
    count_check: str
    prompt_check: str
    completion_check: str
    completion: Verdict | None = None


def _completion_side(completion: int, theirs: int, dc: int, offset: int,
                     repair: Repair | None) -> Verdict:
    """The completion side's verdict for a provider counting with `offset`."""
    if dc == offset:
        return Verdict("exact")
    fixed = repair(theirs - offset) if repair is not None else None
    if fixed is None:
        return Verdict("mismatch", f"completion: ours {completion}, provider {theirs} "
                                   f"(expected offset {offset:+d})")
    message, ids, names = fixed
    return Verdict("repaired", f"completion: ours {completion} -> {len(ids)} after "
                               f"{'+'.join(names)}, provider {theirs}", names, message, ids)


def _agreed(candidates: dict[int, Verdict]) -> Verdict | None:
    """The verdict every offset gives (one check, the same ids), or None."""
    first = candidates[0]
    if all(v.check == first.check and v.ids == first.ids for v in candidates.values()):
        return first
    return None


def _learn_every(every: Side, verdict: Verdict, theirs: int, dc: int, offset: int) -> None:
    """Feed the 'every answer' side with the delta left after the verdict's repair."""
    if verdict.ids is not None:  # the delta that is left: the provider's counting
        every.add(theirs - len(verdict.ids))
    elif verdict.check != "unverified" and (verdict.check != "mismatch"
                                            or abs(dc - offset) > MAX_OFFSET):
        every.add(dc)  # (a small unexplained delta may be a transformation's: left out)


def _signed(n: int | None) -> str:
    return "not known" if n is None else f"{n:+d}"
