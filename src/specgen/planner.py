"""Turn planning: which assistant messages of a conversation become API requests, in order.

A *turn* is the answer to one user message: the assistant messages (and the tool results
between them) that follow it. A plain chat turn is one assistant message; a tool-using turn is
a tool loop. `turns` picks which turns are regenerated:

* `last`  -- the final turn (earlier turns are the dataset's own, as history);
* `first` -- the first turn only;
* `all`   -- every turn in order, on-policy: later requests carry the model's own earlier
  answers (reasoning and tool calls included) instead of the dataset's.

Every assistant message of a chosen turn is one request (one sample). When the model calls
tools, the dataset's recorded results are reused under the dataset's `tool_results` policy:

* `strict`   -- the calls equal the recorded ones as a multiset (name, parsed arguments);
* `name`     -- each call takes the result of a recorded call with the same function name
  (the default; arguments may differ);
* `position` -- as `name`, then the calls left take the results left in order.

Calls are paired one by one: exact matches first, then by name, then (`position`) by order.
The results get the model's call ids and follow the model's call order; every request records
how each reused result in its history was matched (`TurnRequest.tool_matches`). A call count
other than the dataset's ends the conversation with `tool_count_mismatch` (also a call where
the dataset answered, or an answer where it called), unpaired calls with
`tool_name_mismatch` (`tool_arguments_mismatch` under `strict` when only arguments differ),
and a paired call whose result the dataset lacks with `no_recorded_result`; the answers so
far are kept. A conversation that ends with a user or tool message has an open final turn at
index `len(messages)` (prompt-only rows are this case).

`next_request` is a pure function of the conversation, the answers so far and the policy, so
resume needs no planner state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .conversation import AssistantMessage, Conversation, Message, Tool, ToolCall
from .sources.arguments import arguments_equal

TURN_MODES = ("last", "all", "first")
TOOL_RESULT_POLICIES = ("strict", "name", "position")
DEFAULT_TOOL_RESULTS = "name"
MATCH_KINDS = ("exact", "name", "position")  # how a reused result was paired, best first

# End reasons (stable strings, stored as conversations.end_reason).
TOOL_COUNT_MISMATCH = "tool_count_mismatch"  # another number of calls than the dataset's
TOOL_NAME_MISMATCH = "tool_name_mismatch"  # a call no recorded call of its name is left for
TOOL_ARGUMENTS_MISMATCH = "tool_arguments_mismatch"  # strict: same names, other arguments
NO_RECORDED_RESULT = "no_recorded_result"  # paired calls the dataset has no result for
# Reasons of stores written before the policies existed (still read, never written).
TOOL_MISMATCH = "tool_mismatch"
NO_TOOL_RESULT = "no_tool_result"
# The model's answer left the dataset's recorded tool loop: expected on-policy (turns = "all"),
# the samples before it kept; any other end (a quarantine, a failure) is not.
TOOL_LOOP_ENDS = frozenset({TOOL_COUNT_MISMATCH, TOOL_NAME_MISMATCH, TOOL_ARGUMENTS_MISMATCH,
                            NO_RECORDED_RESULT, TOOL_MISMATCH, NO_TOOL_RESULT})


@dataclass(slots=True)
class TurnRequest:
    """One request: regenerate original message index `turn` given `messages` as history.
    `tool_matches`: how each reused tool result in `messages` was matched, in order."""

    turn: int
    messages: list[Message]
    tools: list[Tool] | None
    tool_matches: tuple[str, ...] = ()


@dataclass(slots=True)
class End:
    """The conversation is finished: `reason` None when normally, else why it stopped early."""

    reason: str | None = None


Pairing = list[tuple[ToolCall, int, str]]  # (model call, recorded call index, match kind)


def next_request(
    conv: Conversation, answers: dict[int, AssistantMessage], turns: str,
    tool_results: str = DEFAULT_TOOL_RESULTS,
) -> TurnRequest | End:
    """The next request of a conversation given the answers so far (keyed by turn)."""
    if turns not in TURN_MODES:
        raise ValueError(f"turns must be one of {', '.join(TURN_MODES)}, not {turns!r}")
    if tool_results not in TOOL_RESULT_POLICIES:
        raise ValueError(f"tool_results must be one of {', '.join(TOOL_RESULT_POLICIES)}, "
                         f"not {tool_results!r}")
    msgs = conv.messages
    chosen = set(_chosen_turn_indices(msgs, turns))
    last_chosen = max(chosen) if chosen else -1
    history: list[Message] = []
    matches: list[str] = []
    i = 0
    n = len(msgs)
    while i <= n:
        if i in chosen:
            if i not in answers:
                return TurnRequest(turn=i, messages=history, tools=conv.tools,
                                   tool_matches=tuple(matches))
            answer = answers[i]
            history.append(answer_message(answer))
            if i == n:
                return End(NO_RECORDED_RESULT if answer.tool_calls else None)
            expected = [ToolCall.from_openai(c) for c in msgs[i].get("tool_calls") or ()]
            results, j = _tool_results(msgs, i + 1)
            if not expected and not answer.tool_calls:
                i += 1
                continue
            pairing = match_tool_calls(answer.tool_calls, expected, tool_results)
            if isinstance(pairing, str):
                return End(pairing)
            replies = _replies(pairing, expected, results)
            if replies is None:
                return End(NO_RECORDED_RESULT)
            history += replies
            matches += [kind for _call, _k, kind in pairing]
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
    made: Sequence[ToolCall], expected: Sequence[ToolCall],
    policy: str = DEFAULT_TOOL_RESULTS,
) -> Pairing | str:
    """Pair each call the model made (in its order) with a recorded call under `policy`:
    exact matches (name and parsed arguments) first, then (`name`, `position`) the same
    name, then (`position`) the calls left in order. Returns the pairs, or the end reason
    when a call stays unpaired."""
    if len(made) != len(expected):
        return TOOL_COUNT_MISMATCH
    paired: list[tuple[int, str] | None] = [None] * len(made)
    free = list(range(len(expected)))
    _pair(made, expected, paired, free, "exact",
          lambda c, e: c.name == e.name and arguments_equal(c.arguments, e.arguments))
    if policy != "strict":
        _pair(made, expected, paired, free, "name", lambda c, e: c.name == e.name)
    if policy == "position":
        _pair(made, expected, paired, free, "position", lambda c, e: True)
    if any(p is None for p in paired):
        same_names = sorted(c.name for c in made) == sorted(e.name for e in expected)
        return TOOL_ARGUMENTS_MISMATCH if same_names else TOOL_NAME_MISMATCH
    return [(call, p[0], p[1]) for call, p in zip(made, paired, strict=True) if p is not None]


def _pair(made: Sequence[ToolCall], expected: Sequence[ToolCall],
          paired: list[tuple[int, str] | None], free: list[int], kind: str,
          fits: Callable[[ToolCall, ToolCall], bool]) -> None:
    """Give each unpaired call (in order) the first free recorded call that `fits` it."""
    for m, call in enumerate(made):
        if paired[m] is not None:
            continue
        for pos, k in enumerate(free):
            if fits(call, expected[k]):
                paired[m] = (k, kind)
                del free[pos]
                break


def _replies(pairing: Pairing, expected: Sequence[ToolCall],
             results: list[Message]) -> list[Message] | None:
    """The recorded results of the paired calls under the model's call ids, in its order;
    None when one is missing. Results are found by call id, else by position."""
    by_id = {m.get("tool_call_id"): m for m in results}
    out = []
    for call, k, _kind in pairing:
        result = by_id.get(expected[k].id) or (results[k] if k < len(results) else None)
        if result is None:
            return None
        out.append({**result, "tool_call_id": call.id})
    return out


def weakest_match(kinds: Sequence[str]) -> str | None:
    """The least trusted of a sample's tool-result matches (exact < name < position), None
    when it reused none: what a filter on the sample needs."""
    ranked = [MATCH_KINDS.index(k) for k in kinds if k in MATCH_KINDS]
    return MATCH_KINDS[max(ranked)] if ranked else None


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
