"""The count witness: every sample checked against the provider's own token counts.

On a hosted API the rebuilt ids are a reconstruction; the provider's `usage.prompt_tokens` and
`usage.completion_tokens` (counted with the model's own tokenizer on most stacks) are the one
independent witness of what the model processed and sampled (docs/quality.md). **The
completion side decides, the prompt side records.**

* Completion side — per provider and answer form (`quality.forms`): each answer is judged
  under every counting offset (−2 … +2: exact at it, or repaired to it by exactly one
  count-guided repair), and the form's offset is adopted only on evidence (80% of its answers).
  Verdicts: `exact`, `repaired`, `pending` (the form's offset is not adopted yet, or the answer
  disagrees with it while another offset explains it: judged again once adopted, when the
  form splits, or when the session ends), `unverified` (no counts; a provider whose counts are
  unusable; a form whose answers split between offsets), `mismatch` (no offset and no repair
  explains the count, or the form's adopted offset holds at the session's end and this answer
  is not right at it).
* Prompt side — classified per answer (`quality.shapes`): `exact`, `rendering`,
  `default_system`, `history`, `repaired`; a mismatch only for a `shortfall` (the model saw
  less than the sample claims, beyond what rendering and history can explain) or an
  `implausible` delta.

`CountWitness.judge` is the one entry point.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .forms import FORMS, MAX_OFFSET, OFFSETS, WARMUP, Form
from .repairs import SAMPLED_FORM, Ambiguous
from .shapes import PROMPT_MISMATCHES, ShapeBook, combine

UNUSABLE_AFTER = 20  # answers after which counts no offset explains make them unusable
UNUSABLE_SHARE = 0.5  # ... when at least this share of them
WINDOW = 200

__all__ = ["CountWitness", "Verdict", "Resolution", "MAX_OFFSET", "OFFSETS", "WARMUP",
           "UNUSABLE_AFTER", "FORMS"]


@dataclass(slots=True)
class Verdict:
    check: str  # exact | repaired | pending | unverified | mismatch
    detail: str = ""
    repairs: list[str] = field(default_factory=list)
    message: Any = None  # the repaired AssistantMessage (check "repaired"; None: unchanged)
    ids: list[int] | None = None  # its completion ids
    prompt_ids: list[int] | None = None  # the prompt the model saw, when a repair found it
    prompt_messages: Any = None  # the history as the serving stack rendered it, then
    # each side on its own: prompt (quality.shapes classes); completion exact | repaired |
    # pending | mismatch | unverified; the deltas provider − ours; the request shape
    prompt_check: str | None = None
    completion_check: str | None = None
    prompt_delta: int | None = None
    completion_delta: int | None = None
    shape: str | None = None
    form: str | None = None  # the answer form (quality.forms)
    # judged with its form's offset adopted; False while learning it
    settled: bool = True
    # unverified because the counts cannot vouch (unusable, or the form split): feeds the
    # `unverifiable` alarm and the provider's count agreement
    unvouched: bool = False
    # the completion repair's own names (`repairs` also holds the prompt side's): what a
    # later split of the form takes back
    completion_repairs: list[str] = field(default_factory=list)


Repair = Callable[[int], tuple[Any, list[int], list[str]] | Ambiguous | None]
PromptRepair = Callable[[int], tuple[list[int], list[str]] | None]


def _count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


class CountWitness:
    def __init__(self) -> None:
        self.forms: dict[tuple[str, str], Form] = {}
        self.unexplained: dict[str, deque] = {}  # provider -> recent "no offset explains"
        self.shapes = ShapeBook()
        self.open: dict[Any, _Open] = {}  # completion side waiting for its form's offset
        # completion side judged again, its prompt side waiting for its shape's rendering
        self.decided: dict[Any, tuple[Verdict, bool]] = {}
        self.resolved: list[Resolution] = []

    def form(self, provider: str, form: str) -> Form:
        f = self.forms.get((provider, form))
        if f is None:
            f = self.forms[(provider, form)] = Form()
        return f

    def judge(self, provider: str, *, prompt: int, completion: int, usage: dict[str, Any],
              repair: Repair | None = None, prompt_repair: PromptRepair | None = None,
              sampled_repair: Repair | None = None,
              shape: str = "", tools: bool = False, key: Any = None, form: str = "plain",
              history: bool = False, system: bool = True,
              prompt_floor: Callable[[], int] | None = None,
              default_system: Callable[[], int] | None = None) -> Verdict:
        """Our counts (`prompt`, `completion` ids) against the answer's `usage`. `repair(n)`
        tries the known transformations for a completion of exactly n ids (None: none could
        apply); `sampled_repair(n)` those joined with the forms the model may have sampled
        (None: the answer has no other form); `prompt_repair(n)` the same for the prompt.
        `form` is the answer's form; `shape`, `history` (earlier assistant or tool turns),
        `system` (a system message), `prompt_floor()` (the fewest prompt ids any stack could
        have fed for these messages) and `default_system()` (ids of the template's default
        system prompt) classify the prompt side. `key` (the task id) names a sample judged again later."""
        theirs_p, theirs_c = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
        if theirs_c is None:
            return Verdict("unverified", "no usage counts in the answer", form=form)
        dc = theirs_c - completion
        candidates = {o: _completion_side(completion, theirs_c, dc, o, repair)
                      for o in OFFSETS}
        support = _support(candidates)
        sampled = None if sampled_repair is None else {
            o: _completion_side(completion, theirs_c, dc, o, sampled_repair) for o in OFFSETS}
        f = self.form(provider, form)
        settled = f.offset is not None
        hold = False
        unexplained = self.unexplained.setdefault(provider, deque(maxlen=WINDOW))
        explained = bool(support or (sampled is not None and _support(sampled)))
        unexplained.append(not explained)
        if self.unusable(provider):
            verdict = Verdict("unverified", f"{provider}'s completion counts are unusable "
                                            f"(ours {completion}, provider {theirs_c})",
                              unvouched=True)
        elif not explained:
            verdict = Verdict("mismatch", f"completion: ours {completion}, provider "
                                          f"{theirs_c} (no counting offset within "
                                          f"±{MAX_OFFSET} and no repair explains it)")
        else:
            f.add(support, None if sampled is None else _support(sampled))
            self._evaluate(provider, form)
            judged = sampled if sampled is not None and f.forms else candidates
            if f.split:
                verdict = _split_verdict(provider, form)
            elif f.offset is not None and judged[f.offset].check != "mismatch":
                verdict = judged[f.offset]
            else:
                hold = True  # learning, or another offset than the adopted one explains it
                verdict = Verdict("pending")
        verdict.settled, verdict.form = settled, form
        c_check = "pending" if hold else verdict.check
        fixed_prompt: tuple[list[int], list[str]] | None = None
        p_check, dp, p_note = "unverified", None, ""
        if theirs_p is not None:
            dp = theirs_p - prompt
            base = self.shapes.expected(provider, shape) or 0
            if prompt_repair is not None and dp not in (0, base):
                fixed_prompt = prompt_repair(theirs_p - base)
                if fixed_prompt is not None:
                    dp = theirs_p - len(fixed_prompt[0])
            p_check, p_note = self.shapes.judge(
                provider, shape, dp, prompt=prompt, tools=tools, history=history,
                system=system, floor=prompt_floor, default_system=default_system, key=key,
                completion_check=c_check)
            if fixed_prompt is not None and p_check not in PROMPT_MISMATCHES + ("pending",):
                p_check = "repaired"
        prompt_bad = p_check in PROMPT_MISMATCHES
        if hold and prompt_bad:  # a mismatch whatever the offset: final now
            hold, c_check = False, "unjudged"
        sides = dict(prompt_check=p_check, completion_check=c_check, prompt_delta=dp,
                     completion_delta=dc, shape=shape)
        if hold:
            self.open[key if key is not None else object()] = _Open(
                provider, form, candidates, p_check, theirs_c, dc, sampled)
        elif p_check == "pending" and verdict.unvouched and key is not None:
            # final, unvouched, its prompt side waits: said so when both are final
            self.decided[key] = (Verdict(c_check, verdict.detail, unvouched=True), True)
        elif c_check in ("exact", "repaired") and not prompt_bad and key is not None:
            f.members[key] = p_check
        problems = []
        if prompt_bad:
            problems.append(f"prompt: ours {prompt}, provider {theirs_p} ({p_note})")
        if c_check == "mismatch":
            problems.append(verdict.detail)
        if problems:
            return Verdict("mismatch", "; ".join(problems), settled=settled, form=form,
                           **sides)
        if fixed_prompt is not None and p_check == "repaired":
            ids, names = fixed_prompt
            note = f"prompt: ours {prompt} -> {len(ids)} after {'+'.join(names)}, " \
                   f"provider {theirs_p}"
            verdict.detail = f"{note}; {verdict.detail}" if verdict.detail else note
            verdict.repairs = [*names, *verdict.repairs]
            verdict.prompt_ids = ids
        for k, v in sides.items():
            setattr(verdict, k, v)
        verdict.check = combine(c_check, p_check)
        if hold:
            verdict.detail = (f"completion: waits for {provider}'s counting offset for "
                              f"{form} answers (ours {completion}, provider {theirs_c})")
        if dp and p_check not in PROMPT_MISMATCHES and p_note:
            note = f"prompt: provider {theirs_p}, ours {prompt} ({dp:+d}: {p_note})"
            verdict.detail = f"{verdict.detail}; {note}" if verdict.detail else note
        return verdict

    def _evaluate(self, provider: str, form: str, final: bool = False) -> None:
        """The evidence rule on one form; what it adopts or splits is carried out on the
        samples that wait for it or were judged at it."""
        f = self.form(provider, form)
        change = f.evaluate(final)
        if change == "adopted" or (final and f.offset is not None):
            self._resolve(provider, form, final)
        elif change == "split" or (final and f.split):
            for key, p_check in f.members.items():
                self._complete(key, _split_verdict(provider, form), p_check, True)
            f.members.clear()
            self._resolve(provider, form, final)

    def _resolve(self, provider: str, form: str, final: bool) -> None:
        """The samples waiting on this form: judged at its adopted offset (those another
        offset explains wait on, until the session ends), unverified when it split."""
        f = self.form(provider, form)
        for key in [k for k, o in self.open.items() if (o.provider, o.form) == (provider,
                                                                                 form)]:
            o = self.open[key]
            if f.split:
                v, unvouched = _split_verdict(provider, form), True
            else:
                v, unvouched = o.at(f.offset, f.forms), False
                if v.check == "mismatch" and not final:
                    continue  # the evidence may still turn: judged when it is final
            del self.open[key]
            if v.check in ("exact", "repaired"):
                f.members[key] = o.prompt_check
            self._complete(key, v, o.prompt_check, unvouched)

    def _complete(self, key: Any, v: Verdict, p_check: str, unvouched: bool) -> None:
        """A completion verdict given again: final with its prompt side, or waiting for it."""
        if p_check == "pending":
            self.decided[key] = (v, unvouched)
            self.shapes.pending_completion(key, v.check)
            return
        self.resolved.append(Resolution(key, combine(v.check, p_check), p_check, v.check, v,
                                        unvouched))

    def _emit(self) -> None:
        """Prompt sides judged again (their shape's rendering adopted): final samples."""
        for r in self.shapes.take_resolved():
            if r.key in self.open:  # its completion waits still
                self.open[r.key].prompt_check = r.prompt_check
                continue
            for f in self.forms.values():
                if r.key in f.members:
                    f.members[r.key] = r.prompt_check
            v, unvouched = self.decided.pop(r.key, (None, False))
            c = v.check if v is not None else r.completion_check
            if c in ("exact", "repaired") and r.prompt_check in PROMPT_MISMATCHES:
                for f in self.forms.values():
                    f.members.pop(r.key, None)
            self.resolved.append(Resolution(r.key, combine(c, r.prompt_check),
                                            r.prompt_check, c, v, unvouched))

    def take_resolved(self) -> list[Resolution]:
        """The samples judged again since the last call (both sides final)."""
        self._emit()
        out, self.resolved = self.resolved, []
        return out

    def settle(self) -> list[Resolution]:
        """The session ends: the evidence rule on every form with every answer it has
        (no fallback: a form no offset holds 80% of is split, its samples unverified), and
        every sample still waiting gets its final verdict."""
        for provider, form in sorted(self.forms):
            self._evaluate(provider, form, final=True)
        for key in [k for k, o in self.open.items()]:  # a form with no evidence at all
            o = self.open.pop(key)
            self._complete(key, _split_verdict(o.provider, o.form), o.prompt_check, True)
        for r in self.shapes.settle():
            self.shapes.resolved.append(r)
        return self.take_resolved()

    def seed(self, provider: str, prompt_delta: int | None, completion_delta: int,
             form: str = "plain", sampled: str = "canonical") -> None:
        """An earlier session's sample its counts vouched for (exact or repaired): its
        completion delta (after its repair) is evidence of its form's offset, so a resumed
        run does not learn it again. One stored in a `sampled` form (not "canonical") is
        evidence for the sampled-forms table; the plain one saw its canonical form, as many
        ids longer as the form's names drop markers (one each)."""
        del prompt_delta  # the prompt side records; it learns per request shape (seed_shape)
        if abs(completion_delta) > MAX_OFFSET:
            return
        f = self.form(provider, form)
        if sampled == "canonical":
            f.add({completion_delta: True})
        else:
            plain = completion_delta - len(sampled.split("+"))
            f.add({plain: True} if abs(plain) <= MAX_OFFSET else {},
                  {completion_delta: True})
        self._evaluate(provider, form)

    def learn_offset(self, provider: str, offset: int, form: str = "plain") -> None:
        """A form's completion offset measured beforehand (`specgen probe`): known at once,
        so its first answers are judged on arrival."""
        if abs(offset) > MAX_OFFSET:
            return
        f = self.form(provider, form)
        for _ in range(max(0, WARMUP - len(f.supports))):
            f.add({offset: True})
        self._evaluate(provider, form)

    def seed_open(self, provider: str, key: Any, *, theirs: int, delta: int, stored: int,
                  prompt_check: str, repairs: list[str], form: str = "plain") -> None:
        """An earlier session's sample stored with its completion side waiting (`stored`
        completion ids, its count `repairs`): its verdict stands at the offset it was stored
        for (the provider's count minus those ids); at another one it is a mismatch (the raw
        answer, to try other repairs with, is not kept)."""
        at = theirs - stored
        check = "repaired" if repairs else "exact"
        self.open[key] = _Open(provider, form, {
            o: Verdict(check, repairs=list(repairs)) if o == at else
            Verdict("mismatch", f"completion: ours {stored}, provider {theirs} (expected "
                                f"offset {o:+d})") for o in OFFSETS},
            prompt_check, theirs, delta)
        if abs(at) <= MAX_OFFSET:
            self.form(provider, form).add({at: not repairs})
        self._evaluate(provider, form)

    def seed_shape(self, provider: str, shape: str, delta: int, *, tools: bool,
                   key: Any = None, pending: bool = False,
                   completion_check: str = "exact") -> None:
        """A stored sample's prompt delta for its shape (a pending one is judged again)."""
        self.shapes.seed(provider, shape, delta, tools=tools, key=key, pending=pending,
                         completion_check=completion_check)

    def split_forms(self, provider: str) -> list[str]:
        """The forms of a provider whose answers split between offsets (unverified)."""
        return [form for (p, form), f in sorted(list(self.forms.items())) if p == provider
                and f.split]

    def state(self, provider: str) -> dict[str, Any]:
        """A provider's completion side: {"completion": {"state", "forms": {form: ...}}}."""
        forms = {form: f.to_json() for (p, form), f in sorted(list(self.forms.items()))
                 if p == provider}
        if self.unusable(provider):
            state = "unusable"
        elif any(f["state"] == "split" for f in forms.values()):
            state = "split"
        elif forms and all(f["state"] == "adopted" for f in forms.values()):
            state = "stable"
        else:
            state = "learning"
        return {"completion": {"state": state, "forms": forms,
                               "answers": sum(f["answers"] for f in forms.values())}}

    def unusable(self, provider: str) -> bool:
        """No offset and no repair explains at least half of its last answers (≥ 20):
        counts from another tokenizer, halves (DeepInfra)."""
        seen = self.unexplained.get(provider)
        return seen is not None and len(seen) >= UNUSABLE_AFTER and \
            sum(seen) / len(seen) >= UNUSABLE_SHARE

    def to_json(self) -> dict[str, Any]:
        shapes = self.shapes.to_json()
        # list(): one copy, taken at once (a large answer is judged in a worker thread while
        # the loop writes live.json)
        names = {p for p, _ in list(self.forms)} | set(list(self.unexplained))
        out = {p: self.state(p) for p in sorted(names)}
        for p, st in out.items():
            if self.unusable(p):
                st["counts_unusable"] = True
            if split := self.split_forms(p):
                st["unverified_forms"] = split
        for p, by_shape in shapes.items():
            out.setdefault(p, {})["prompt_shapes"] = by_shape
        return out


@dataclass(slots=True)
class _Open:
    """A sample whose completion side waits for its form's offset: its verdict under each
    offset, and its prompt side's."""

    provider: str
    form: str
    candidates: dict[int, Verdict]
    prompt_check: str
    theirs: int  # the provider's completion count
    delta: int  # provider − ours (before any repair)
    sampled: dict[int, Verdict] | None = None  # with the sampled forms (None: the same)

    def at(self, offset: int, forms: bool) -> Verdict:
        """Its verdict at the form's adopted offset, with the sampled forms if adopted so."""
        return (self.sampled if forms and self.sampled is not None
                else self.candidates)[offset]


@dataclass(slots=True)
class Resolution:
    """A sample's verdict given again: `count_check` and each side's, and `completion` the
    completion side's verdict (its repair's ids and message, when the offset chose one);
    `unvouched`: unverified because its form split (or the counts are unusable)."""

    key: Any
    count_check: str
    prompt_check: str
    completion_check: str
    completion: Verdict | None = None
    unvouched: bool = False


def _support(candidates: dict[int, Verdict]) -> dict[int, bool]:
    """The offsets an answer is right at ({offset: right there as answered})."""
    return {o: _as_answered(v) for o, v in candidates.items()
            if v.check in ("exact", "repaired")}


def _as_answered(v: Verdict) -> bool:
    """Right as the provider answered it: exact, or one of the forms the model may have
    sampled for the unchanged text (`sampled_form:*` alone: no transformation undone)."""
    return v.check == "exact" or bool(v.repairs) and all(
        r.startswith(SAMPLED_FORM + ":") for r in v.repairs)


def _split_verdict(provider: str, form: str) -> Verdict:
    return Verdict("unverified", f"{provider}'s counts of {form} answers split between "
                                 "offsets (no offset holds for 80% of them): they cannot "
                                 "vouch for it", unvouched=True, form=form)


def _completion_side(completion: int, theirs: int, dc: int, offset: int,
                     repair: Repair | None) -> Verdict:
    """The completion side's verdict for a provider counting with `offset`."""
    if dc == offset:
        return Verdict("exact")
    fixed = repair(theirs - offset) if repair is not None else None
    if fixed is None:
        return Verdict("mismatch", f"completion: ours {completion}, provider {theirs} "
                                   f"(expected offset {offset:+d})")
    if isinstance(fixed, Ambiguous):
        ways = " / ".join("+".join(n) or "as answered" for n in fixed.names)
        return Verdict("mismatch", f"completion: ours {completion}, provider {theirs} "
                                   f"(expected offset {offset:+d}: {len(fixed.names)} "
                                   f"repairs fit, {ways}; the count cannot tell which)")
    message, ids, names = fixed
    return Verdict("repaired", f"completion: ours {completion} -> {len(ids)} after "
                               f"{'+'.join(names)}, provider {theirs}", names, message, ids,
                   completion_repairs=list(names))
