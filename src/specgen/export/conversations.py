"""Group stored samples by conversation and rebuild the regenerated conversations.

A conversation's samples come out of `Store.iter_results` consecutively (ordered by dataset
position, source row, turn). The regenerated conversation is the last sample's request (the
messages as sent, which already hold the earlier regenerated answers) followed by its answer.
Each earlier answer is put back in full (with its reasoning, which a request may omit for
history turns); an earlier sample whose answer is not part of the last request (the samples
are not one chain) becomes a conversation of its own, so no sample is ever dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..conversation import AssistantMessage, Message, Tool
from ..store import ResultRow


@dataclass(slots=True)
class RegeneratedConversation:
    """One exported conversation: prompt messages as sent + the model's answers."""

    id: str
    dataset: str
    conv_id: str
    messages: list[Message]
    tools: list[Tool] | None
    samples: list[ResultRow]  # the stored samples whose answers this conversation holds
    answer_positions: list[int]  # index in `messages` of each regenerated answer


def sample_id(dataset: str, conv_id: str, turn: int | None = None) -> str:
    """Stable id of an exported row: `dataset/conv_id` or `dataset/conv_id/turn`."""
    base = f"{dataset}/{conv_id}"
    return base if turn is None else f"{base}/{turn}"


def group_by_conversation(rows: Iterable[ResultRow]) -> Iterator[list[ResultRow]]:
    """Consecutive samples of one conversation, as lists (input must be in store order)."""
    group: list[ResultRow] = []
    for row in rows:
        if group and row.conversation != group[-1].conversation:
            yield group
            group = []
        group.append(row)
    if group:
        yield group


def _same_answer(sent: Message, stored: Message) -> bool:
    """True when a history message of a request is the stored answer (reasoning aside)."""
    if sent.get("role") != "assistant":
        return False
    a, b = AssistantMessage.from_openai(sent), AssistantMessage.from_openai(stored)
    return a.content == b.content and a.tool_calls == b.tool_calls


def regenerated_conversations(samples: list[ResultRow]) -> list[RegeneratedConversation]:
    """The regenerated conversation(s) of one conversation's samples (ordered by turn)."""
    last = samples[-1]
    messages: list[Message] = [dict(m) for m in last.request.get("messages") or []]
    chained: list[ResultRow] = []
    positions: list[int] = []
    separate: list[ResultRow] = []
    for s in samples[:-1]:
        pos = _position_in(messages, s)
        if pos is None:
            separate.append(s)
        else:
            messages[pos] = dict(s.message)
            chained.append(s)
            positions.append(pos)
    messages.append(dict(last.message))
    chained.append(last)
    positions.append(len(messages) - 1)
    out = [_single(s, with_turn=True) for s in separate]
    out.append(RegeneratedConversation(
        id=sample_id(last.dataset, last.conv_id) if not separate
        else sample_id(last.dataset, last.conv_id, last.turn),
        dataset=last.dataset, conv_id=last.conv_id, messages=messages,
        tools=last.request.get("tools") or None, samples=chained, answer_positions=positions,
    ))
    return out


def _position_in(messages: list[Message], s: ResultRow) -> int | None:
    """Where sample `s`'s answer sits in a later request's messages, if it is there."""
    n_sent = len(s.request.get("messages") or [])
    # The answer follows the messages sent for it: same index when the request replays the
    # conversation as it grows (the normal case).
    if n_sent < len(messages) and _same_answer(messages[n_sent], s.message):
        return n_sent
    return None


def _single(s: ResultRow, *, with_turn: bool) -> RegeneratedConversation:
    messages = [dict(m) for m in s.request.get("messages") or []] + [dict(s.message)]
    return RegeneratedConversation(
        id=sample_id(s.dataset, s.conv_id, s.turn if with_turn else None),
        dataset=s.dataset, conv_id=s.conv_id, messages=messages,
        tools=s.request.get("tools") or None, samples=[s], answer_positions=[len(messages) - 1],
    )


def openai_row(conv: RegeneratedConversation) -> dict[str, Any]:
    """`openai` export row: OpenAI-format messages (+ tools) with where the answers are."""
    row: dict[str, Any] = {"id": conv.id, "dataset": conv.dataset, "conv_id": conv.conv_id,
                           "messages": conv.messages}
    if conv.tools:
        row["tools"] = conv.tools
    row["regenerated"] = conv.answer_positions
    row["turns"] = [s.turn for s in conv.samples]
    # who served each answer (aligned with `turns`)
    row["providers"] = [s.provider for s in conv.samples]
    row["quantizations"] = [s.quantization for s in conv.samples]
    # the last request holds every reused tool result of the conversation (planner)
    row["tool_matches"] = conv.samples[-1].tool_matches
    if any(s.sampling for s in conv.samples):  # what each answer was sampled with
        row["sampling"] = [s.sampling for s in conv.samples]
    return row


def specforge_row(conv: RegeneratedConversation) -> dict[str, Any]:
    """SpecForge row `{"id", "conversations", "tools"?}`.

    Messages keep role, content, name, reasoning_content, tool_calls and tool_call_id, which is
    what SpecForge's parsers read. `tools` is written as a JSON string, a form SpecForge's
    loader parses itself: as nested objects, Arrow would unify the tool schemas of all rows
    into one struct and hand every tool the other rows' parameter names as nulls.
    """
    from .. import jsonexact

    keep = ("role", "content", "name", "reasoning_content", "tool_calls", "tool_call_id")
    msgs = []
    for m in conv.messages:
        out = {k: m[k] for k in keep if k in m and m[k] is not None}
        if "content" not in out:
            out["content"] = ""
        msgs.append(out)
    row: dict[str, Any] = {"id": conv.id, "conversations": msgs}
    if conv.tools:
        row["tools"] = jsonexact.dumps(conv.tools).decode()
    return row
