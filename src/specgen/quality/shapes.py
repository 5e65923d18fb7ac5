"""The prompt side of the count witness: how each provider renders each request shape.

A provider's `usage.prompt_tokens` differs from the official rendering of the request by a
constant *per provider and per request shape*: it declares tools its own way, or adds a hidden
system prompt (`../shared/reference/openrouter-api.md`, "Usage counts on real traffic"). The
drafter is trained on the official rendering, so that constant is the provider's rendering,
recorded on the sample, not a defect. What the prompt side catches is a delta that is *not*
the provider's constant for that shape: a dropped message, compressed context, another model.

The shape signature (`shape_signature`) is what decides a provider's rendering of a prompt:

* the tools block (sha256 of the `tools` list as canonical JSON: sorted keys, compact);
* whether the request has a system message;
* the thinking mode it was sent in (the template renders the two modes differently).

`sha256("tools=<json or none>|system=<0|1>|thinking=<0|1|->")`, first 16 hex digits. The
messages themselves are not in it: two conversations of one shape differ by their messages,
which both renderings count alike.

Per (provider, shape) the deltas (provider − ours) are kept, and each prompt side is judged:

* `exact` — delta 0: the provider rendered the official prompt (never a mismatch, whatever
  else it showed for the shape);
* `rendering` — the delta the provider showed for this shape: known once `CONFIRM` answers
  showed the same delta (or from a probe / an earlier session);
* `pending` — the shape's delta is not known yet: the sample is stored, not exported, and
  judged again when it is (`take_resolved`), or when the run ends (`settle`);
* `mismatch` — another delta than the known one, or a prompt shorter than ours by more than
  a counting offset when the request has no tools (nothing to render more compactly);
* `repaired` — a history the serving stack renders otherwise explains the count
  (`quality.repairs.prompt_repair`, judged by the caller);
* `unverified` — the answer reported no `prompt_tokens`, or a shape whose answers disagree
  with no delta ahead when the run ends.

`settle` at the end of a session gives every pending sample its final verdict: the shape's
most common delta (ahead of every other) is its rendering, the other deltas are mismatches; a
shape seen once keeps its delta as its rendering; a tie is `unverified`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

CONFIRM = 2  # answers showing the same delta before it is the shape's rendering
MAX_OFFSET = 2  # a counting rule (BOS, stop token) differs by a token or two


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
    deltas: Counter = field(default_factory=Counter)
    known: int | None = None
    pending: list[tuple[Any, int, str]] = field(default_factory=list)  # (key, delta, c-check)


class ShapeBook:
    """Per (provider, shape): the deltas seen, the known rendering, the samples pending."""

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

    def judge(self, provider: str, shape: str, delta: int, *, tools: bool, key: Any = None,
              completion_check: str = "exact") -> str:
        """The prompt side's verdict for a delta (provider − ours) of this shape; a `pending`
        one is kept (with `key` and its completion's verdict) to be judged again."""
        side = self._side(provider, shape, tools)
        if delta == 0:
            side.deltas[0] += 1
            self._maybe_known(side)
            return "exact"
        if not tools and delta < -MAX_OFFSET:
            return "mismatch"  # shorter than our prompt, nothing to render compactly
        side.deltas[delta] += 1
        if side.known is None:
            self._maybe_known(side)
        if side.known is not None:
            return _verdict(delta, side.known)
        side.pending.append((key, delta, completion_check))
        return "pending"

    def _maybe_known(self, side: ShapeSide) -> None:
        if side.known is not None:
            return
        delta, hits = side.deltas.most_common(1)[0]
        if hits >= CONFIRM:
            side.known = delta
            self._resolve(side, delta)

    def _resolve(self, side: ShapeSide, known: int | None) -> None:
        for key, delta, c_check in side.pending:
            verdict = "unverified" if known is None else _verdict(delta, known)
            self.resolved.append(Resolved(key, c_check, verdict))
        side.pending.clear()

    def take_resolved(self) -> list[Resolved]:
        out, self.resolved = self.resolved, []
        return out

    def seed(self, provider: str, shape: str, delta: int, *, tools: bool, key: Any = None,
             pending: bool = False, completion_check: str = "exact") -> None:
        """A delta known before this session (a probe, an earlier session's sample); a
        `pending` one is judged again like this session's."""
        side = self._side(provider, shape, tools)
        if pending and side.known is not None:  # known from the rows before it: judged now
            side.deltas[delta] += 1
            self.resolved.append(Resolved(key, completion_check, _verdict(delta, side.known)))
            return
        if pending and delta != 0:
            side.deltas[delta] += 1
            side.pending.append((key, delta, completion_check))
            self._maybe_known(side)
            return
        side.deltas[delta] += 1
        self._maybe_known(side)

    def learn(self, provider: str, shape: str, delta: int, *, tools: bool) -> None:
        """A shape's rendering measured beforehand (`specgen probe`): known at once."""
        side = self._side(provider, shape, tools)
        side.deltas[delta] += CONFIRM
        if side.known is None:
            side.known = delta
            self._resolve(side, delta)

    def settle(self) -> list[Resolved]:
        """Final verdicts of every pending sample (module docstring)."""
        for side in self.sides.values():
            if not side.pending:
                continue
            ranked = side.deltas.most_common(2)
            ahead = len(ranked) == 1 or ranked[0][1] > ranked[1][1]
            self._resolve(side, ranked[0][0] if ahead else None)
        return self.take_resolved()

    def to_json(self) -> dict[str, dict[str, Any]]:
        """{provider: {shape: {"delta", "answers", "pending"}}}."""
        out: dict[str, dict[str, Any]] = {}
        for (provider, shape), side in sorted(self.sides.items()):
            out.setdefault(provider, {})[shape] = {
                "delta": side.known, "answers": sum(side.deltas.values()),
                "pending": len(side.pending), "tools": side.tools}
        return out


def _verdict(delta: int, known: int) -> str:
    if delta == 0:
        return "exact"
    return "rendering" if delta == known else "mismatch"


def combine(completion_check: str, prompt_check: str) -> str:
    """The sample's count_check from the two sides' verdicts."""
    if "mismatch" in (completion_check, prompt_check):
        return "mismatch"
    if "pending" in (completion_check, prompt_check):
        return "pending"
    if "unverified" in (completion_check, prompt_check):
        return "unverified"
    if "repaired" in (completion_check, prompt_check):
        return "repaired"
    return "exact"
