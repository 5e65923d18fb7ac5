"""API answer -> the assistant message the model really sampled, or a quarantine reason.

The answer's fields are first joined back into the text the model sampled:
`reasoning + </think> + content` (tool-call marker text found in the reasoning field goes after
the `</think>`), then repaired and parsed like the renderer parses ids. Each fix is named in
`Normalized.repairs` (the engine counts them per provider); answers that cannot be trusted
raise `Quarantined(reason)`. docs/datasets.md lists every repair and reason.

Repairs (stable names):
  special_token_spaces    spaces a serving stack put around special tokens, removed (one on
                          each side of each marker, the inverse of a space-joined decode);
                          applied only when every marker in the answer is space-padded
  trailing_stop_token     a literal `<|im_end|>` / `[EOS]` (or the renderer's stop text) at
                          the end, removed
  think_in_content        reasoning and `</think>` found in `content` (no reasoning parser)
  think_tag_in_content    a literal `<think>` opening the text, removed (the prompt holds it)
  end_think_in_reasoning  `</think>` found inside the reasoning field
  tool_calls_from_content tool calls recovered from marker text in `content`
  tool_calls_from_reasoning  tool calls recovered from marker text in the reasoning field
  tool_call_id_restored   a server-made id (`call_...`) replaced by `functions.{name}:{k}`
  tool_call_id_renumbered a native id with the wrong k (renumbered per answer) corrected
  tool_call_id_stripped   whitespace around a tool-call id removed
Flags (prefixed `flag:`; nothing was changed, they are counted so a provider's habits show):
  flag:arguments_compact / flag:arguments_spaced  the JSON style of the call arguments; a
                          provider that re-serialises arguments shows a style share unlike the
                          others' (re-serialised arguments cannot be undone)
  flag:tool_call_id_unrestorable  a foreign id kept because k is unknown (no history given)

Quarantine reasons (stable strings): length, content_filter, incomplete, empty,
missing_tool_calls, bad_tool_arguments, unknown_tool, bad_tool_call_markup,
conflicting_tool_calls, unbalanced_reasoning, unexpected_reasoning, missing_reasoning,
stray_special_token.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .client.types import ChatResponse, RawToolCall
from .conversation import AssistantMessage, Message, Tool, ToolCall
from .quality.schema import schema_problem
from .render.base import Renderer, RenderError, first_difference
from .render.kimi import (
    CALL_ARG,
    CALL_BEGIN,
    CALL_END,
    END_THINK,
    IM_ASSISTANT,
    IM_END,
    IM_MIDDLE,
    IM_SYSTEM,
    IM_USER,
    SECTION_BEGIN,
    SECTION_END,
    THINK,
    KimiRenderer,
    tool_name_from_id,
)

QUARANTINE_REASONS = (
    "length", "content_filter", "incomplete", "empty", "missing_tool_calls",
    "bad_tool_arguments", "unknown_tool", "bad_tool_call_markup", "conflicting_tool_calls",
    "unbalanced_reasoning", "unexpected_reasoning", "missing_reasoning", "stray_special_token",
    "no_token_ids", "missing_stop_token", "unparseable", "prompt_mismatch", "count_mismatch",
)
_NATIVE_ID = re.compile(r"^functions\.(?P<name>.+):(?P<k>\d+)$")
_TOOL_MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_ARG, CALL_END)


class Quarantined(Exception):
    """The answer cannot be trusted; `reason` is one of QUARANTINE_REASONS."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(slots=True)
class Normalized:
    """The repaired assistant message and the names of the repairs made.

    `truncated`: the answer stopped at max_tokens (kept because on_length = "keep");
    `reasoning_closed`: False when it stopped inside the reasoning. A truncated answer's
    sampled ids are given by `sampled_completion_ids`.
    """

    message: AssistantMessage
    repairs: list[str] = field(default_factory=list)
    truncated: bool = False
    reasoning_closed: bool = True
    ids: list[int] | None = None  # token-in answers: the sampled ids, which are the sample


@dataclass(frozen=True, slots=True)
class _Dialect:
    """What the answer text of one renderer family may hold."""

    think: bool  # the model thinks (reasoning, then </think>)
    tool_markers: bool  # tool calls are marker text (Kimi)
    stop_texts: tuple[str, ...]
    frame_tokens: tuple[str, ...]  # never valid inside an answer
    no_reasoning: str | None  # the reasoning of an answer that returned none
    markers: tuple[str, ...] = ()  # the marker texts a decode may have space-padded
    # First characters of every marker, frame token and stop text: a text holding none of
    # them holds none of those strings, so most checks of a plain answer are one scan each.
    lead_chars: tuple[str, ...] = ()

    @classmethod
    def make(cls, think: bool, tool_markers: bool, stop_texts: tuple[str, ...],
             frame_tokens: tuple[str, ...], no_reasoning: str | None) -> _Dialect:
        extra = _TOOL_MARKERS if tool_markers else ()
        markers = (THINK, END_THINK, *extra, *stop_texts)
        lead = tuple(sorted({m[0] for m in (*markers, *frame_tokens, *_TOOL_MARKERS) if m}))
        return cls(think, tool_markers, stop_texts, frame_tokens, no_reasoning, markers, lead)

    def may_hold_markers(self, text: str) -> bool:
        """False only when `text` certainly holds no marker, frame token or stop text."""
        for ch in self.lead_chars:
            if ch in text:
                return True
        return False


@functools.lru_cache(maxsize=16)
def _kimi_dialect(think: bool) -> _Dialect:
    return _Dialect.make(think, True, (IM_END, "[EOS]"),
                         (IM_USER, IM_ASSISTANT, IM_SYSTEM, IM_MIDDLE), "" if think else None)


def _dialect(renderer: Renderer) -> _Dialect:
    if isinstance(renderer, KimiRenderer):
        return _kimi_dialect(bool(renderer.has_thinking and renderer.thinking))
    # Other templates: reasoning is accepted when it comes (the template decides how to
    # render it), tool calls only as structured calls.
    tok = renderer.tokenizer
    stops = tuple(sorted({tok.id_to_special[i] for i in renderer.stop_token_ids
                          if i in tok.id_to_special}))
    return _Dialect.make(True, False, stops, (), None)


def normalize(
    resp: ChatResponse,
    *,
    tools: list[Tool] | None,
    renderer: Renderer,
    on_length: str = "drop",
    messages: Sequence[Message] | None = None,
) -> Normalized:
    """The assistant message the model sampled for `resp`, with the repairs made.

    `messages` (the request's history) lets server-rewritten tool-call ids be restored to
    `functions.{name}:{k}`: k continues the count of tool calls in the history.
    Raises Quarantined.
    """
    d = _dialect(renderer)
    repairs: list[str] = []
    truncated = _check_finish(resp, on_length)

    # 1. Spaces around special tokens (each field is decoded on its own).
    reasoning_field, spaced_r = _unspace(resp.reasoning or "", d)
    content_field, spaced_c = _unspace(resp.content or "", d)
    spaced = spaced_r or spaced_c
    if spaced:
        repairs.append("special_token_spaces")

    # 2. Join the fields back into one text, as sampled.
    text, inserted_end = _join(reasoning_field, content_field, d, repairs)

    # 3. Stop text left at the end.
    stripped = False
    while True:
        for stop in d.stop_texts:
            if text.endswith(stop):
                text = text[: -len(stop)]
                stripped = True
                break
        else:
            break
    if stripped:
        repairs.append("trailing_stop_token")

    # 4. Reasoning.
    reasoning, rest, closed = _split_reasoning(text, d, reasoning_field, inserted_end,
                                               truncated, repairs)

    # 5. Tool calls.
    content, marker_calls = _split_tool_section(rest, d)
    plain_content = not d.may_hold_markers(content)
    plain_reasoning = not reasoning or not d.may_hold_markers(reasoning)
    if marker_calls is not None and "tool_calls_from_reasoning" not in repairs:
        repairs.append("tool_calls_from_content")
    calls = _tool_calls(marker_calls, resp.tool_calls, messages, d, spaced, repairs)

    # 6. Checks.
    if not (plain_content and plain_reasoning):
        for frame in d.frame_tokens + d.stop_texts:
            if frame in content or (reasoning and frame in reasoning):
                raise Quarantined("stray_special_token", f"{frame} inside the answer")
    _check_calls(calls, tools)
    if calls:
        repairs.append("flag:arguments_compact" if _compact(calls) else "flag:arguments_spaced")
    if not d.think and reasoning:
        raise Quarantined("unexpected_reasoning", "reasoning came back with thinking off")
    reasoning_tokens = _reasoning_tokens(resp)
    if d.think and not reasoning and reasoning_tokens:
        raise Quarantined("missing_reasoning",
                          f"{reasoning_tokens} reasoning tokens billed but none returned")
    if d.think and inserted_end and not content and reasoning and reasoning_tokens:
        n = len(renderer.tokenizer.encode(reasoning))
        # The answer itself went into the reasoning field. Some slack: providers count
        # reasoning tokens their own way (with or without the think tags, or estimated).
        if n > reasoning_tokens + max(2, reasoning_tokens // 50):
            raise Quarantined("unbalanced_reasoning",
                              f"</think> dropped: the reasoning holds {n} tokens, the provider "
                              f"counted {reasoning_tokens} reasoning tokens")
    if not content and not calls:
        if resp.finish_reason == "tool_calls":
            raise Quarantined("missing_tool_calls", "finish_reason tool_calls, no calls")
        if not reasoning:
            raise Quarantined("empty", "no content, reasoning or tool calls")
        if not truncated:
            raise Quarantined("empty", "reasoning but no answer (content dropped, or </think> "
                                       "dropped so the answer is inside the reasoning)")
    if not reasoning:
        reasoning = d.no_reasoning
    message = AssistantMessage(content=content, reasoning=reasoning, tool_calls=tuple(calls))
    return Normalized(message, repairs, truncated=truncated, reasoning_closed=closed)


def normalize_ids(
    resp: ChatResponse,
    *,
    tools: list[Tool] | None,
    renderer: Renderer,
    prompt_ids: Sequence[int],
    on_length: str = "drop",
) -> Normalized:
    """A token-in answer (`[endpoint] mode = "tokens"`): the sampled ids are the sample; the
    message for the next turn is parsed from them by the renderer's own parser.

    The server's own witnesses are checked: prompt ids it echoes must be the ones sent, and
    its usage counts must count these ids. Raises Quarantined."""
    truncated = _check_finish(resp, on_length)
    ids = resp.completion_token_ids
    if not ids:
        raise Quarantined("no_token_ids" if ids is None else "empty",
                          "the server returned no sampled ids")
    vocab = getattr(getattr(renderer, "tokenizer", None), "vocab_size", None)
    if isinstance(vocab, int) and vocab > 0 and max(ids) >= vocab:
        bad = next(i for i, t in enumerate(ids) if t >= vocab)
        raise Quarantined("ids_out_of_vocab", f"sampled id {ids[bad]} at position {bad} is "
                          f"outside the tokenizer's vocabulary ({vocab} ids): another model "
                          "or tokenizer served it")
    echoed = resp.prompt_token_ids
    if echoed is not None and list(echoed) != list(prompt_ids):
        at = first_difference(echoed, prompt_ids)
        raise Quarantined("prompt_mismatch", f"the server's prompt ids differ from the ones "
                          f"sent at token {at} ({len(echoed)} vs {len(prompt_ids)} ids)")
    usage = resp.usage or {}
    for key, ours in (("prompt_tokens", len(prompt_ids)), ("completion_tokens", len(ids))):
        theirs = usage.get(key)
        if isinstance(theirs, int) and not isinstance(theirs, bool) and theirs != ours:
            raise Quarantined("count_mismatch", f"usage.{key} {theirs}, ids {ours}")
    stops = renderer.stop_token_ids
    repairs = ["stop_token_appended"] if resp.stop_appended else []
    if not truncated and ids[-1] not in stops:
        if not isinstance(resp.stop_reason, str):
            raise Quarantined("missing_stop_token", "finish_reason stop, but the ids end "
                              "without a stop token and the server named none")
        repairs.append("stop_string")  # cut at a sampling.stop string: no stop token
    if any(i in stops for i in ids[:-1]):
        raise Quarantined("stray_special_token", "a stop token inside the answer")
    try:
        message = renderer.parse_completion(ids)
    except RenderError as exc:
        raise Quarantined("unparseable", str(exc)) from None
    _check_calls(message.tool_calls, tools)
    closed = not truncated or message.reasoning is None or bool(message.content
                                                                or message.tool_calls)
    return Normalized(message, repairs, truncated=truncated, reasoning_closed=closed,
                      ids=list(ids))


def sampled_completion_ids(
    renderer: Renderer, norm: Normalized, *, context: Sequence[Message] | None = None,
    tools: Sequence[Tool] | None = None,
) -> list[int]:
    """Ids the model sampled for a normalised answer: `completion_ids`, less the stop token
    (and the `</think>`) a truncated answer never reached."""
    if not norm.truncated:
        return renderer.completion_ids(norm.message, context=context, tools=tools)
    text = renderer.completion_text(norm.message, context=context, tools=tools)
    for stop in _dialect(renderer).stop_texts:
        if text.endswith(stop):
            text = text[: -len(stop)]
            break
    if not norm.reasoning_closed and text.endswith(END_THINK):
        text = text[: -len(END_THINK)]
    return renderer.encode_completion(text, context=context, tools=tools)


# -- steps ---------------------------------------------------------------------------------

def _check_finish(resp: ChatResponse, on_length: str) -> bool:
    reason = resp.finish_reason
    if reason == "length":
        if on_length == "drop":
            raise Quarantined("length", "stopped at max_tokens")
        return True
    if reason == "content_filter":
        raise Quarantined("content_filter", "the provider filtered the answer")
    if reason is None or reason == "error":
        raise Quarantined("incomplete", f"finish_reason {reason!r}")
    return False


def _join(reasoning: str, content: str, d: _Dialect, repairs: list[str]) -> tuple[str, bool]:
    """(sampled text, whether a `</think>` was inserted at the field boundary)."""
    if not reasoning:
        return content, False
    if not d.may_hold_markers(reasoning):
        return reasoning + END_THINK + content, True
    if d.tool_markers:
        cut = _first_index(reasoning, (SECTION_BEGIN, CALL_BEGIN))
        if cut is not None:
            repairs.append("tool_calls_from_reasoning")
            head, section = reasoning[:cut], reasoning[cut:]
            if END_THINK in head:
                return head + section + content, False
            return head + END_THINK + section + content, True
    if END_THINK in reasoning:
        repairs.append("end_think_in_reasoning")
        return reasoning + content, False
    return reasoning + END_THINK + content, True


def _unspace(text: str, d: _Dialect) -> tuple[str, bool]:
    """Undo a space-joined decode of one field: when every marker occurrence is padded with a
    space (or touches an end of the text) and at least one such space is there, remove one on
    each side of each marker (`' <think> ok </think> 1'` -> `'<think>ok</think>1'`)."""
    if not text or not d.may_hold_markers(text):
        return text, False
    pattern, padded_pattern = _marker_patterns(d.markers)
    found = list(pattern.finditer(text))
    if not found:
        return text, False
    padded = 0
    for m in found:
        before = m.start() == 0 or text[m.start() - 1] == " "
        after = m.end() == len(text) or text[m.end()] == " "
        if not (before and after):
            return text, False
        padded += (m.start() > 0) + (m.end() < len(text))
    if not padded:
        return text, False
    return padded_pattern.sub(r"\1", text), True


@functools.lru_cache(maxsize=64)
def _marker_patterns(markers: tuple[str, ...]) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(any marker, any marker with one optional space on each side), longest first; built
    once per marker set rather than per answer (re.escape per call was ~70 us an answer)."""
    alt = "|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True))
    return re.compile(alt), re.compile(" ?(" + alt + ") ?")


def _split_reasoning(
    text: str, d: _Dialect, reasoning_field: str, inserted_end: bool, truncated: bool,
    repairs: list[str],
) -> tuple[str | None, str, bool]:
    """(reasoning, rest, reasoning_closed)."""
    opened = text.startswith(THINK)
    if opened:
        text = text[len(THINK):]
        repairs.append("think_tag_in_content")
    opens = text.count(THINK)
    closes = text.count(END_THINK)
    if not d.think:
        if opens or closes:
            raise Quarantined("unexpected_reasoning", "think markers with thinking off")
        return None, text, True
    if opens or closes > 1:
        raise Quarantined("unbalanced_reasoning", f"{opens} {THINK} and {closes} {END_THINK}")
    if closes == 0:
        if truncated:  # stopped before </think>: everything so far is reasoning
            return text, "", False
        if opened:
            raise Quarantined("unbalanced_reasoning", f"{THINK} never closed")
        return "", text, True  # reasoning hidden by the provider, or empty
    reasoning, _, rest = text.partition(END_THINK)
    if not reasoning_field:
        repairs.append("think_in_content")
    closed = True
    if inserted_end and truncated and not rest:
        closed = False  # stopped inside the reasoning: the model never wrote </think>
    return reasoning, rest, closed


def _split_tool_section(text: str, d: _Dialect) -> tuple[str, list[ToolCall] | None]:
    """(content, tool calls from marker text or None when there is none)."""
    if not d.tool_markers or not d.may_hold_markers(text):
        return text, None
    start = _first_index(text, (SECTION_BEGIN, CALL_BEGIN))
    if start is None:
        for marker in (SECTION_END, CALL_ARG, CALL_END):
            if marker in text:
                raise Quarantined("bad_tool_call_markup", f"stray {marker}")
        return text, None
    content, section = text[:start], text[start:]
    if section.startswith(SECTION_BEGIN):
        section = section[len(SECTION_BEGIN):]
    end = section.find(SECTION_END)
    if end >= 0:
        inner, after = section[:end], section[end + len(SECTION_END):]
    else:
        inner, after = section, ""
    if after.strip():
        raise Quarantined("bad_tool_call_markup", f"text after the tool calls: {after[:40]!r}")
    calls: list[ToolCall] = []
    pos = 0
    while pos < len(inner):
        if inner[pos:].strip() == "":
            break
        if not inner.startswith(CALL_BEGIN, pos):
            raise Quarantined("bad_tool_call_markup", f"text between tool calls: {inner[pos:pos + 40]!r}")
        arg = inner.find(CALL_ARG, pos)
        stop = inner.find(CALL_END, pos)
        if arg < 0 or stop < 0 or stop < arg:
            raise Quarantined("bad_tool_call_markup", "unterminated tool call")
        call_id = inner[pos + len(CALL_BEGIN): arg]
        args = inner[arg + len(CALL_ARG): stop]
        for marker in _TOOL_MARKERS:
            if marker in call_id or marker in args:
                raise Quarantined("bad_tool_call_markup", f"{marker} inside a tool call")
        calls.append(ToolCall(id=call_id, name=tool_name_from_id(call_id), arguments=args))
        pos = stop + len(CALL_END)
    if not calls:
        raise Quarantined("bad_tool_call_markup", "empty tool-call section")
    return content, calls


def _tool_calls(
    marker_calls: list[ToolCall] | None, raw: Sequence[RawToolCall],
    messages: Sequence[Message] | None, d: _Dialect, spaced: bool, repairs: list[str],
) -> list[ToolCall]:
    if marker_calls is not None:
        if raw and len(raw) != len(marker_calls):
            raise Quarantined("conflicting_tool_calls",
                              f"{len(raw)} structured calls, {len(marker_calls)} in the text")
        return marker_calls  # the model's own text: ids and arguments verbatim
    calls = []
    for c in sorted(raw, key=lambda c: c.index):
        call_id, args = c.id, c.arguments
        if call_id != call_id.strip():
            call_id = call_id.strip()
            repairs.append("tool_call_id_stripped")
        if spaced and len(args) > 2 and args.startswith(" ") and args.endswith(" "):
            args = args[1:-1]
        calls.append(ToolCall(id=call_id, name=c.name, arguments=args))
    if d.tool_markers and calls:
        calls = _native_ids(calls, messages, repairs)
    return calls


def _native_ids(calls: list[ToolCall], messages: Sequence[Message] | None,
                repairs: list[str]) -> list[ToolCall]:
    k0 = None if messages is None else sum(
        len(m.get("tool_calls") or ()) for m in messages if m.get("role") == "assistant"
    )
    out = []
    for j, c in enumerate(calls):
        m = _NATIVE_ID.match(c.id)
        if k0 is None:
            if not (m and m["name"] == c.name):
                repairs.append("flag:tool_call_id_unrestorable")
            out.append(c)
            continue
        want = f"functions.{c.name}:{k0 + j}"
        if c.id != want:
            repairs.append("tool_call_id_renumbered" if m and m["name"] == c.name
                           else "tool_call_id_restored")
            c = ToolCall(id=want, name=c.name, arguments=c.arguments)
        out.append(c)
    return out


def _check_calls(calls: Sequence[ToolCall], tools: list[Tool] | None) -> None:
    schemas = {(t.get("function") or {}).get("name"): (t.get("function") or {}).get("parameters")
               for t in tools or () if isinstance(t, dict)}
    for c in calls:
        if c.name not in schemas:
            where = "the request declared no tools" if not tools else "not a declared tool"
            raise Quarantined("unknown_tool", f"{c.name!r}: {where}")
        try:
            value = json.loads(c.arguments)
        except ValueError as exc:
            raise Quarantined("bad_tool_arguments", f"{c.name}: {exc}") from None
        if not isinstance(value, dict):
            raise Quarantined("bad_tool_arguments", f"{c.name}: arguments are not a JSON object")
        problem = schema_problem(value, schemas[c.name])
        if problem is not None:
            raise Quarantined("schema_mismatch", f"{c.name}: {problem}")


def _compact(calls: Sequence[ToolCall]) -> bool:
    """True when the arguments use compact JSON separators (`{"a":1}`)."""
    for c in calls:
        if '":' in c.arguments and '": ' not in c.arguments:
            return True
    return False


def _reasoning_tokens(resp: ChatResponse) -> int:
    details = resp.usage.get("completion_tokens_details") or {}
    try:
        return int(details.get("reasoning_tokens") or 0)
    except (TypeError, ValueError):
        return 0


def _first_index(text: str, needles: Sequence[str]) -> int | None:
    found = [i for i in (text.find(n) for n in needles) if i >= 0]
    return min(found) if found else None
