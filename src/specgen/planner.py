"""Turn planning: which assistant messages of a conversation become API requests, in order.

A *turn* is the answer to one user message: the assistant messages (and the tool results
between them) that follow it. A plain chat turn is one assistant message; a tool-using turn is
a tool loop. `turns` picks which turns are regenerated:

* `last`  -- the final turn (earlier turns are the dataset's own, as history);
* `first` -- the first turn only;
* `all`   -- every turn in order, on-policy: later requests carry the model's own earlier
  answers (reasoning and tool calls included) instead of the dataset's.

Every assistant message of a chosen turn is one request (one sample). When the model calls
tools, the dataset's recorded results are reused if the calls match the dataset's calls as a
multiset (same function name, arguments equal after parsing); the results are given the
model's call ids and put in the model's call order. Otherwise the conversation ends with
`tool_mismatch` (answers so far are kept): also when the model calls a tool where the dataset
did not, or answers where the dataset called one. A conversation that ends with a user or tool
message has an open final turn at index `len(messages)` (prompt-only rows are this case).

`next_request` is a pure function of the conversation and the answers so far, so resume needs
no planner state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .conversation import AssistantMessage, Conversation, Message, Tool, ToolCall
from .sources.arguments import arguments_equal

TURN_MODES = ("last", "all", "first")

# End reasons (stable strings, stored as conversations.end_reason).
TOOL_MISMATCH = "tool_mismatch"
NO_TOOL_RESULT = "no_tool_result"  # the model called tools the dataset has no results for


@dataclass(slots=True)
class TurnRequest:
    """One request: regenerate original message index `turn` given `messages` as history."""

    turn: int
    messages: list[Message]
    tools: list[Tool] | None


@dataclass(slots=True)
class End:
    """The conversation is finished: `reason` None when normally, else why it stopped early."""

    reason: str | None = None


def next_request(
    conv: Conversation, answers: dict[int, AssistantMessage], turns: str
) -> TurnRequest | End:
    """The next request of a conversation given the answers so far (keyed by turn)."""
    if turns not in TURN_MODES:
        raise ValueError(f"turns must be one of {', '.join(TURN_MODES)}, not {turns!r}")
    msgs = conv.messages
    chosen = set(_chosen_turn_indices(msgs, turns))
    last_chosen = max(chosen) if chosen else -1
    history: list[Message] = []
    i = 0
    n = len(msgs)
    while i <= n:
        if i in chosen:
            if i not in answers:
                return TurnRequest(turn=i, messages=history, tools=conv.tools)
            answer = answers[i]
            history.append(answer_message(answer))
            if i == n:
                return End(NO_TOOL_RESULT if answer.tool_calls else None)
            recorded = msgs[i]
            expected = [ToolCall.from_openai(c) for c in recorded.get("tool_calls") or ()]
            results, j = _tool_results(msgs, i + 1)
            if not expected and not answer.tool_calls:
                i += 1
                continue
            if bool(expected) != bool(answer.tool_calls):
                return End(TOOL_MISMATCH)
            pairing = match_tool_calls(answer.tool_calls, expected)
            if pairing is None:
                return End(TOOL_MISMATCH)
            by_id = {m.get("tool_call_id"): m for m in results}
            for call, k in pairing:
                # Results are found by call id; positionally when the ids do not line up.
                result = by_id.get(expected[k].id) or (results[k] if k < len(results) else None)
                if result is None:
                    return End(NO_TOOL_RESULT)
                history.append({**result, "tool_call_id": call.id})
            i = j
            continue
        if i == n:
            break
        if i > last_chosen:
            break
        history.append(msgs[i])
        i += 1
    return End(None)


def answer_message(answer: AssistantMessage) -> Message:
    """The history form of a model answer (reasoning in `reasoning_content`, tool calls)."""
    return answer.to_openai()


def match_tool_calls(
    made: Sequence[ToolCall], expected: Sequence[ToolCall]
) -> list[tuple[ToolCall, int]] | None:
    """Pair each call the model made (in its order) with the index of an equal dataset call
    (same name, arguments equal after parsing; a multiset match); None when they differ."""
    if len(made) != len(expected):
        return None
    free = list(range(len(expected)))
    pairs = []
    for call in made:
        for pos, k in enumerate(free):
            exp = expected[k]
            if exp.name == call.name and arguments_equal(call.arguments, exp.arguments):
                pairs.append((call, k))
                del free[pos]
                break
        else:
            return None
    return pairs


def planned_turns(conv: Conversation, turns: str) -> list[int]:
    """Original indices that would be requested if every answer matched the dataset."""
    return sorted(_chosen_turn_indices(conv.messages, turns))


def _chosen_turn_indices(msgs: list[Message], turns: str) -> list[int]:
    groups = _turn_groups(msgs)
    if not groups:
        return []
    if turns == "last":
        return groups[-1]
    if turns == "first":
        return groups[0]
    return [i for g in groups for i in g]


def _turn_groups(msgs: list[Message]) -> list[list[int]]:
    """Assistant message indices grouped by the user message they answer; an open end
    (last message from the user or a tool) adds index len(msgs)."""
    groups: list[list[int]] = []
    new_turn = True
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role == "assistant":
            if new_turn or not groups:
                groups.append([])
                new_turn = False
            groups[-1].append(i)
        elif role != "tool":
            new_turn = True
    if msgs and msgs[-1].get("role") in ("user", "tool"):
        if msgs[-1].get("role") == "user" or not groups:
            groups.append([len(msgs)])
        else:
            groups[-1].append(len(msgs))
    return groups


def _tool_results(msgs: list[Message], start: int) -> tuple[list[Message], int]:
    """The tool messages from `start` on, and the index after them."""
    j = start
    while j < len(msgs) and msgs[j].get("role") == "tool":
        j += 1
    return msgs[start:j], j
