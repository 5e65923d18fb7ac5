"""Count-guided repairs: undo a known provider transformation, only when the provider's own
token count says so.

When a provider's `usage.completion_tokens` disagrees with the ids rebuilt from its answer,
one of a few documented transformations may explain the difference exactly (see
`../shared/reference/openrouter-api.md`, "What real Kimi providers send"):

* `arguments_spaced` — the provider re-serialised tool-call arguments compactly
  (`{"a":2,"b":3}`, Groq, Together) while the model wrote `{"a": 2, "b": 3}`;
* `arguments_compact` — the other way round;
* `content_whitespace` — whitespace the provider inserted around `</think>` or the tool-call
  section (leading / trailing whitespace of `content`);
* `duplicate_events` — a stream event repeated byte for byte (a relay retransmitting): the
  text it added again is taken out (`dedup_repair`, on the raw answer before normalising).

Each candidate (alone, and the argument styles together with the whitespace one) is rendered
to ids; a repair is taken only when exactly one candidate's length is what the provider
counted (two that fit are ambiguous and nothing is changed). Nothing is changed without the
witness agreeing.

The prompt side has one: `history_reserialized` — a vLLM/SGLang serving stack parses every
history tool call's `arguments` into an object before the chat template runs, and the template
writes it back with `tojson` (`{"a": 1}`), so the model saw the history re-serialised, not as
written (`../shared/reference/openrouter-api.md`, "Local engines"). `prompt_repair` takes it
when the provider's `prompt_tokens` is exactly the re-rendered prompt's length.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..conversation import AssistantMessage, Message, ToolCall

Render = Callable[[AssistantMessage], list[int]]
RenderPrompt = Callable[[list[Message]], list[int]]


def _restyle(calls: tuple[ToolCall, ...], compact: bool) -> tuple[ToolCall, ...] | None:
    seps = (",", ":") if compact else (", ", ": ")
    out, changed = [], False
    for call in calls:
        try:
            value = json.loads(call.arguments)
        except (TypeError, ValueError):
            return None
        text = json.dumps(value, ensure_ascii=False, separators=seps)
        changed |= text != call.arguments
        out.append(replace(call, arguments=text))
    return tuple(out) if changed else None


def candidates(message: AssistantMessage) -> list[tuple[list[str], AssistantMessage]]:
    """The messages the known transformations may have come from, with their names."""
    styles: list[tuple[str, AssistantMessage]] = []
    if message.tool_calls:
        for name, compact in (("arguments_spaced", False), ("arguments_compact", True)):
            calls = _restyle(message.tool_calls, compact)
            if calls is not None:
                styles.append((name, replace(message, tool_calls=calls)))
    out: list[tuple[list[str], AssistantMessage]] = [([n], m) for n, m in styles]
    # whitespace where providers insert it: after </think> (before the content, when there
    # is reasoning) and before the tool-call section (after the content, when there are
    # calls); each side its own candidate, so a model's own newlines elsewhere stay
    text = message.content
    sides = []
    if message.reasoning is not None:
        sides.append(text.lstrip())
    if message.tool_calls:
        sides.append(text.rstrip())
        if message.reasoning is not None:
            sides.append(text.strip())
    for stripped in dict.fromkeys(sides):
        if stripped != text:
            out.append((["content_whitespace"], replace(message, content=stripped)))
            out += [([n, "content_whitespace"], replace(m, content=stripped))
                    for n, m in styles]
    return out


def count_repair(message: AssistantMessage, target: int, render: Render
                 ) -> tuple[AssistantMessage, list[int], list[str]] | None:
    """The repaired message, its ids and the repair names, when exactly one known
    transformation makes the ids `target` long; else None. Two transformations that both
    fit are ambiguous: the count cannot tell them apart, so nothing is repaired."""
    found: list[tuple[AssistantMessage, list[int], list[str]]] = []
    for names, candidate in candidates(message):
        ids = render(candidate)
        if len(ids) == target and all(ids != f[1] for f in found):
            found.append((candidate, ids, names))
    return found[0] if len(found) == 1 else None


SAMPLED_FORM = "sampled_form"  # repair name prefix: `sampled_form:<variant name>`
Variants = Callable[[AssistantMessage], dict[str, list[int]]]


@dataclass(frozen=True, slots=True)
class Ambiguous:
    """Two or more repairs make the ids the counted length with different ids: the count
    explains the answer but cannot tell which ids the model sampled (`names` of each)."""

    names: tuple[tuple[str, ...], ...]


def form_repair(message: AssistantMessage, target: int, variants: Variants
                ) -> tuple[AssistantMessage, list[int], list[str]] | Ambiguous | None:
    """`count_repair` joined with the forms the model may have sampled (`Renderer.
    completion_variant_ids`: a Kimi tool-call answer without `<|tool_calls_section_end|>`,
    a content-less reasoning turn without `</think>`): every known transformation of the
    message (and the message itself) in every sampled form, the unchanged message's
    canonical form excepted (that one is `exact`). A fit is taken only when exactly one id
    sequence is `target` long (`Ambiguous` when more are); a non-canonical form is named
    `sampled_form:<name>`."""
    found: dict[tuple[int, ...], tuple[AssistantMessage, list[str]]] = {}
    for names, candidate in [([], message), *candidates(message)]:
        for form, ids in variants(candidate).items():
            if len(ids) != target or (form == "canonical" and not names):
                continue
            tag = [] if form == "canonical" else [f"{SAMPLED_FORM}:{form}"]
            found.setdefault(tuple(ids), (candidate, [*names, *tag]))
    if len(found) > 1:
        return Ambiguous(tuple(tuple(n) for _, n in found.values()))
    if not found:
        return None
    ids, (fixed, names) = next(iter(found.items()))
    return fixed, list(ids), names


def sampled_form(repairs: list[str]) -> str:
    """The sampled form a stored sample's repairs name (`count:sampled_form:<name>`), or
    "canonical"."""
    for r in repairs:
        name = r.removeprefix("count:")
        if name.startswith(SAMPLED_FORM + ":"):
            return name[len(SAMPLED_FORM) + 1:]
    return "canonical"


def prompt_repair(candidates: list[tuple[str, list[Message]]], target: int,
                  render: RenderPrompt) -> tuple[list[int], list[str], list[Message]] | None:
    """The prompt the model saw when its serving stack rebuilt the history: of the
    `candidates` (name, messages as one stack renders them), the one whose prompt is exactly
    `target` ids long, when exactly one id sequence is; its ids, [name] and messages."""
    found: dict[tuple[int, ...], tuple[str, list[Message]]] = {}
    for name, messages in candidates:
        ids = render(messages)
        if len(ids) == target:
            found.setdefault(tuple(ids), (name, messages))
    if len(found) != 1:
        return None
    ids, (name, messages) = next(iter(found.items()))
    return list(ids), [name], messages


MAX_DEDUP_SINGLES = 8  # runs of repeated events tried one at a time at most (then: all)


def _cut(text: str | None, spans: list[tuple[int, int]]) -> str | None:
    """`text` without the `spans` (offset, length): one pass, however many there are."""
    if text is None or not spans:
        return text
    parts, at = [], 0
    for offset, length in sorted(spans):
        if offset < at:  # overlapping spans: the part already cut
            offset, length = at, max(0, offset + length - at)
        parts.append(text[at:offset])
        at = offset + length
    parts.append(text[at:])
    return "".join(parts)


def _runs(resp: Any) -> list[tuple[str, int, int]]:
    """The first span of each run of repeated events: spans of one field that follow each
    other with the same text. Taking out any one span of a run gives the same text (the
    run's pieces are all equal), so one candidate per run says all they can."""
    texts = {"content": resp.content or "", "reasoning": resp.reasoning or ""}
    out: list[tuple[str, int, int]] = []
    last: tuple[str, int, int] | None = None
    for span in sorted(resp.duplicates or ()):
        field, offset, length = span
        if (last is not None and last[0] == field and last[1] + last[2] == offset
                and last[2] == length and texts[field][last[1]:offset]
                == texts[field][offset:offset + length]):
            last = span  # the same run goes on
            continue
        out.append(span)
        last = span
    return out


def dedup_candidates(resp: Any) -> list[Any]:
    """The answer without the text of repeated stream events: each run of them with one
    event taken out (a retransmission), when there are at most `MAX_DEDUP_SINGLES` runs, then
    every repeat taken out (a relay doubling events). Each candidate is normalised and
    rendered by the witness, so their number is bounded: a repetition loop of 64k identical
    events is two candidates, not 64k."""
    spans = list(resp.duplicates or ())
    if not spans:
        return []
    runs = _runs(resp)
    choices = [[span] for span in runs] if len(runs) <= MAX_DEDUP_SINGLES else []
    if len(spans) > 1 or not choices:
        choices.append(spans)
    out = []
    for chosen in choices:
        content = _cut(resp.content, [(o, n) for f, o, n in chosen if f == "content"])
        reasoning = _cut(resp.reasoning, [(o, n) for f, o, n in chosen if f == "reasoning"])
        out.append(replace(resp, content=content, reasoning=reasoning, duplicates=[]))
    return out


def dedup_repair(resp: Any, target: int,
                 rebuild: Callable[[Any], tuple[AssistantMessage, list[int]] | None],
                 reasoning_ids: Callable[[str], int] | None = None,
                 ) -> tuple[AssistantMessage, list[int], list[str]] | None:
    """The message and ids of the answer without its repeated events' text, when exactly one
    such candidate is `target` ids long (`rebuild` normalises and renders one; None when it
    does not normalise).

    Several that fit (the model repeated a piece itself, elsewhere) are told apart by a second
    witness when the provider gives one: its `completion_tokens_details.reasoning_tokens`
    says whether the repeat to take out is in the reasoning or the content
    (`reasoning_ids(text)`: our count of a reasoning text); still several, nothing is
    changed."""
    found: list[tuple[AssistantMessage, list[int], list[str]]] = []
    texts: list[str] = []
    for candidate in dedup_candidates(resp):
        rebuilt = rebuild(candidate)
        if rebuilt is not None and len(rebuilt[1]) == target and all(
                rebuilt[1] != f[1] for f in found):
            found.append((rebuilt[0], rebuilt[1], ["duplicate_events"]))
            texts.append(candidate.reasoning or "")
    if len(found) == 1:
        return found[0]
    details = (resp.usage or {}).get("completion_tokens_details")
    theirs = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if len(found) < 2 or reasoning_ids is None or isinstance(theirs, bool) \
            or not isinstance(theirs, int):
        return None
    backed = [f for f, text in zip(found, texts, strict=True) if reasoning_ids(text) == theirs]
    if len(backed) != 1:
        return None
    message, ids, _ = backed[0]
    return message, ids, ["duplicate_events", "reasoning_count"]
