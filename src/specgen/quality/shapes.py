"""The prompt side of the count witness: it records and classifies, it does not decide.

A provider's `usage.prompt_tokens` differs from the official rendering of the request for
many reasons that say nothing of the sample (`../shared/reference/openrouter-api.md`, "Usage
counts on real traffic", "A larger sample"): it declares tools its own way (a constant per
provider and request shape, e.g. −85 or +9), it renders a conversation's history its own way
(earlier tool calls, tool results, reasoning: −574 … −618 at one provider for one system
prompt and tools block), it leaves out the template's default system prompt (Moonshot's
platform: −9 on every request without one). The drafter is trained on the official rendering,
so each of these is recorded on the sample (`prompt_delta`, `prompt_check`), not a defect.
Only evidence that the model saw *less* than the sample claims is a mismatch.

Each answer's prompt side is one of (`classify`, in this order):

* `implausible` — more than `max(ours, IMPLAUSIBLE_MIN)` tokens above ours: no rendering adds
  that much; a contradiction (mismatch);
* `exact` — delta 0;
* `shortfall` — fewer tokens than the least any stack could feed for these messages (the
  `floor`: our rendering with no tools block, no reasoning in the history, an empty system
  prompt, less `FLOOR_SLACK_PER_MESSAGE` per message): a dropped message or compressed context
  (mismatch);
* `default_system` — no system message and a shortfall the template's default system prompt
  explains;
* `history` — a conversation with earlier assistant or tool turns: its history rendered
  another way;
* `rendering` — any other delta of a single-turn prompt: the provider's rendering of the tools
  block or a system prompt of its own;
* `repaired` — a history a serving stack renders otherwise explains the count exactly
  (`quality.repairs.prompt_repair`, judged by the caller);
* `unverified` — the answer reported no `prompt_tokens`;
* `pending` — a single-turn prompt whose shape's rendering is not adopted yet (judged again
  when it is, or at the session's end: a shape whose deltas split adopts none, and its
  prompts are recorded as `rendering`).

The request shape (`shape_signature`) still groups prompts whose rendering should be one
constant: the tools block, whether there is a system message, the thinking mode. Per
(provider, shape) the deltas of single-turn prompts are counted, and the delta holding 80% of
them (at least `CONFIRM`) is the shape's rendering: shown in `status` and `probe.json`, and the
base a prompt repair is tried against.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

CONFIRM = 2  # single-turn answers showing the same delta before it is the shape's rendering
SHARE = 0.8  # ... and it holds for this share of them (the evidence rule)
SPLIT_AFTER = 10  # an adopted rendering is given up below SHARE once this many are in
MAX_OFFSET = 2  # a counting rule (BOS, stop token) differs by a token or two
IMPLAUSIBLE_MIN = 8192  # a delta above max(ours, this) is no rendering
FLOOR_SLACK_PER_MESSAGE = 8  # role markers and wrappers another stack may render shorter
# the prompt classes that make the sample a mismatch (the model did not see our prompt)
PROMPT_MISMATCHES = ("mismatch", "shortfall", "implausible")
# the prompt classes a sample can be exported under (ExportOptions.prompt_checks)
PROMPT_CHECKS = ("exact", "rendering", "default_system", "history", "repaired", "unverified",
                 "shortfall", "implausible", "mismatch", "unjudged")


def shape_signature(tools: list | None, messages: list[dict[str, Any]] | None,
                    thinking: bool | None) -> str:
    """The request shape of a prompt (module docstring)."""
    try:
        block = orjson.dumps(tools, option=orjson.OPT_SORT_KEYS).decode() if tools else "none"
    except TypeError:
        block = repr(tools)
    system = any(isinstance(m, dict) and m.get("role") == "system" for m in messages or ())
    mode = "-" if thinking is None else str(int(bool(thinking)))
    text = f"tools={block}|system={int(system)}|thinking={mode}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Resolved:
    """A pending sample judged again: its key (the task id) and the prompt side's verdict."""

    key: Any
    completion_check: str
    prompt_check: str


@dataclass(slots=True)
class ShapeSide:
    tools: bool = False
    deltas: Counter = field(default_factory=Counter)  # of its single-turn prompts
    known: int | None = None
    pending: list[tuple[Any, int, str]] = field(default_factory=list)  # (key, delta, c-check)


class ShapeBook:
    """Per (provider, shape): the single-turn deltas seen, the shape's rendering, the
    single-turn samples waiting for it."""

    def __init__(self) -> None:
        self.sides: dict[tuple[str, str], ShapeSide] = {}
        self.resolved: list[Resolved] = []

    def _side(self, provider: str, shape: str, tools: bool) -> ShapeSide:
        side = self.sides.get((provider, shape))
        if side is None:
            side = self.sides[(provider, shape)] = ShapeSide(tools=tools)
        return side

    def expected(self, provider: str, shape: str) -> int | None:
        side = self.sides.get((provider, shape))
        return side.known if side is not None else None

    def judge(self, provider: str, shape: str, delta: int, *, prompt: int, tools: bool,
              history: bool = False, system: bool = True,
              floor: Callable[[], int] | None = None,
              default_system: Callable[[], int] | None = None, key: Any = None,
              completion_check: str = "exact") -> tuple[str, str]:
        """The prompt side's class for a delta (provider − ours) and a note saying why
        (module docstring). A single-turn prompt's delta is its shape's evidence; one other
        than 0 waits (`pending`, with `key` and its completion's verdict) until the shape's
        rendering is adopted, and is a `shortfall` if it is below it."""
        check = classify(delta, prompt=prompt, tools=tools, history=history, system=system,
                         floor=floor, default_system=default_system)
        if history or check[0] in PROMPT_MISMATCHES or check[0] == "default_system":
            return check
        side = self._side(provider, shape, tools)
        side.deltas[delta] += 1
        self._maybe_known(side)
        if check[0] == "exact":
            return check
        if side.known is not None:
            return _single(delta, side.known)
        side.pending.append((key, delta, completion_check))
        return "pending", "this request shape's rendering is not known yet"

    def _maybe_known(self, side: ShapeSide, final: bool = False) -> None:
        """The evidence rule: the delta holding SHARE of the shape's single-turn prompts
        (CONFIRM of them at least, or any number at the end) is its rendering."""
        delta, hits = side.deltas.most_common(1)[0]
        total = sum(side.deltas.values())
        held = hits / total >= SHARE and (hits >= CONFIRM or final)
        if side.known is not None and not final and total < SPLIT_AFTER:
            pass  # adopted: it stands until SPLIT_AFTER answers can tell it does not hold
        else:
            side.known = delta if held else None
        if side.known is not None or final:
            for key, d, c_check in side.pending:
                # no rendering adopted (the shape's deltas split): nothing proves a
                # shortfall, so the delta is recorded as the provider's rendering
                check = _single(d, side.known)[0] if side.known is not None else "rendering"
                self.resolved.append(Resolved(key, c_check, check))
            side.pending.clear()

    def take_resolved(self) -> list[Resolved]:
        out, self.resolved = self.resolved, []
        return out

    def pending_completion(self, key: Any, completion_check: str) -> None:
        """A waiting sample's completion side was judged meanwhile."""
        for side in self.sides.values():
            for i, (k, d, _) in enumerate(side.pending):
                if k == key:
                    side.pending[i] = (k, d, completion_check)
                    return

    def seed(self, provider: str, shape: str, delta: int, *, tools: bool, key: Any = None,
             pending: bool = False, completion_check: str = "exact") -> None:
        """A single-turn delta known before this session (an earlier session's sample); a
        `pending` one is judged again like this session's."""
        side = self._side(provider, shape, tools)
        side.deltas[delta] += 1
        if pending and delta != 0:
            side.pending.append((key, delta, completion_check))
        elif pending:
            self.resolved.append(Resolved(key, completion_check, "exact"))
        self._maybe_known(side)

    def learn(self, provider: str, shape: str, delta: int, *, tools: bool) -> None:
        """A shape's rendering measured beforehand (`specgen probe`): known at once."""
        side = self._side(provider, shape, tools)
        side.deltas[delta] += max(CONFIRM, sum(side.deltas.values()) * 4)
        self._maybe_known(side)

    def settle(self) -> list[Resolved]:
        """The session ends: every waiting sample judged with every answer's evidence (a
        shape no delta holds 80% of adopts no rendering: its deltas are recorded as
        `rendering`, none is a shortfall)."""
        for side in self.sides.values():
            if side.pending:
                self._maybe_known(side, final=True)
        return self.take_resolved()

    def to_json(self) -> dict[str, dict[str, Any]]:
        """{provider: {shape: {"delta", "answers", "pending", "tools"}}}."""
        out: dict[str, dict[str, Any]] = {}
        for (provider, shape), side in sorted(self.sides.items()):
            out.setdefault(provider, {})[shape] = {
                "delta": side.known, "answers": sum(side.deltas.values()),
                "pending": len(side.pending), "tools": side.tools}
        return out


def _single(delta: int, known: int) -> tuple[str, str]:
    """A single-turn prompt's class against its shape's rendering: below it by more than a
    counting offset, the model saw less (nothing in a single turn renders shorter)."""
    if delta == 0:
        return "exact", ""
    if delta < known - MAX_OFFSET:
        return "shortfall", (f"{known - delta} fewer than this provider's rendering of this "
                             f"request shape ({known:+d}): a dropped or compressed message")
    return "rendering", "its rendering of this request shape"


def classify(delta: int, *, prompt: int, tools: bool, history: bool = False,
             system: bool = True, floor: Callable[[], int] | None = None,
             default_system: Callable[[], int] | None = None) -> tuple[str, str]:
    """(class, note) of a prompt delta (module docstring)."""
    bound = max(prompt, IMPLAUSIBLE_MIN)
    if delta > bound:
        return "implausible", f"{delta:+d} is more than any rendering adds (> {bound})"
    if delta == 0:
        return "exact", ""
    if delta < 0:
        least = floor() if floor is not None else None
        if least is None and not (tools or history) and system and delta < -MAX_OFFSET:
            least = prompt - MAX_OFFSET  # nothing a stack could render shorter
        if least is not None and prompt + delta < least:
            return "shortfall", (f"fewer than the {least} tokens any rendering of these "
                                 "messages holds: a dropped message or compressed context")
        if not system and default_system is not None and \
                delta >= -default_system() - MAX_OFFSET:
            return "default_system", "the template's default system prompt left out"
    if history:
        return "history", "the conversation's history rendered another way"
    return "rendering", "its rendering of the tools block or system prompt"


def combine(completion_check: str, prompt_check: str) -> str:
    """The sample's count_check from the two sides' verdicts: the completion side decides;
    the prompt side only by a mismatch (a shortfall, an implausible delta), a repair, or no
    count at all."""
    if completion_check == "mismatch" or prompt_check in PROMPT_MISMATCHES:
        return "mismatch"
    if "pending" in (completion_check, prompt_check):
        return "pending"
    if "unverified" in (completion_check, prompt_check):
        return "unverified"
    if "repaired" in (completion_check, prompt_check):
        return "repaired"
    return "exact"
