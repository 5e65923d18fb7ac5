"""Turn planning with scripted answers: last / first / all, prompt-only rows, tool loops."""

from __future__ import annotations

import pytest

from specgen.conversation import AssistantMessage, Conversation, ToolCall
from specgen.planner import (
    NO_RECORDED_RESULT,
    TOOL_ARGUMENTS_MISMATCH,
    TOOL_COUNT_MISMATCH,
    TOOL_NAME_MISMATCH,
    End,
    TurnRequest,
    next_request,
    planned_turns,
)
from specgen.sources import row_to_conversation

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {}}}
         for n in ("get_weather", "get_time")]


def chat() -> Conversation:
    return Conversation(id="c", messages=[
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "u3"},
        {"role": "assistant", "content": "a3"},
    ])


def run(conv, turns, answer_for, tool_results="name"):
    """Drive the planner to its end; answer_for(turn, request) gives each answer."""
    answers: dict[int, AssistantMessage] = {}
    requests = []
    while True:
        step = next_request(conv, answers, turns, tool_results)
        if isinstance(step, End):
            return requests, step
        assert step.turn not in answers
        requests.append(step)
        answers[step.turn] = answer_for(step.turn, step)


def plain(text, reasoning=None):
    return lambda turn, req: AssistantMessage(content=f"{text}{turn}", reasoning=reasoning)


def roles(req: TurnRequest):
    return [m["role"] for m in req.messages]


def test_last_regenerates_only_the_final_turn_with_dataset_history():
    reqs, end = run(chat(), "last", plain("m"))
    assert end == End(None)
    (req,) = reqs
    assert req.turn == 6
    assert [m.get("content") for m in req.messages] == ["sys", "u1", "a1", "u2", "a2", "u3"]
    assert req.messages[2]["reasoning_content"] == "r1"  # the dataset's own turn, as it is
    assert req.tools is None


def test_first_regenerates_only_the_first_turn():
    reqs, end = run(chat(), "first", plain("m"))
    assert [r.turn for r in reqs] == [2] and end == End(None)
    assert roles(reqs[0]) == ["system", "user"]


def test_all_is_on_policy_with_the_models_reasoning_in_history():
    reqs, end = run(chat(), "all", plain("m", reasoning="think"))
    assert [r.turn for r in reqs] == [2, 4, 6] and end == End(None)
    last = reqs[2].messages
    assert [m.get("content") for m in last] == ["sys", "u1", "m2", "u2", "m4", "u3"]
    assert last[2] == {"role": "assistant", "content": "m2", "reasoning_content": "think"}
    assert planned_turns(chat(), "all") == [2, 4, 6]


def test_the_planner_is_a_pure_function_of_its_inputs():
    conv = chat()
    answers = {2: AssistantMessage(content="x", reasoning="")}
    a = next_request(conv, answers, "all")
    b = next_request(conv, dict(answers), "all")
    assert a == b and a.turn == 4
    assert conv.messages == chat().messages  # nothing mutated


def test_prompt_only_rows_are_one_request_with_every_message():
    conv = Conversation(id="p", messages=[{"role": "system", "content": "s"},
                                          {"role": "user", "content": "q"}])
    for turns in ("last", "first", "all"):
        reqs, end = run(conv, turns, plain("m"))
        assert [r.turn for r in reqs] == [2] and roles(reqs[0]) == ["system", "user"]
        assert end == End(None)


def test_trailing_user_message_is_an_open_final_turn():
    conv = Conversation(id="o", messages=[
        {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"}])
    assert [r.turn for r in run(conv, "all", plain("m"))[0]] == [1, 3]
    assert [r.turn for r in run(conv, "last", plain("m"))[0]] == [3]
    assert [r.turn for r in run(conv, "first", plain("m"))[0]] == [1]


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="turns must be one of"):
        next_request(chat(), {}, "middle")


# -- tool loops ----------------------------------------------------------------------------

def tool_conv() -> Conversation:
    """u, a(call weather Paris), tool, a(answer), u, a(two calls), tool, tool, a(answer)."""
    row = {"messages": [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
        {"role": "assistant", "content": "It is 21C."},
        {"role": "user", "content": "and weather+time in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_2", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            {"id": "call_3", "function": {"name": "get_time", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "27C"},
        {"role": "tool", "tool_call_id": "call_3", "content": "14:05"},
        {"role": "assistant", "content": "27C at 14:05."}], "tools": TOOLS}
    return row_to_conversation(row, "openai")


def call(name, args, k):
    return ToolCall(id=f"functions.{name}:{k}", name=name, arguments=args)


def model_following_the_dataset(turn, req):
    """Calls what the dataset called (other argument style, own ids), else answers."""
    script = {
        1: [call("get_weather", '{"city":"Paris"}', 0)],
        5: [call("get_time", "{\"city\": \"Rome\"}", 1), call("get_weather", '{"city": "Rome"}', 2)],
    }
    if turn in script:
        return AssistantMessage(content="", reasoning="need data", tool_calls=tuple(script[turn]))
    return AssistantMessage(content=f"answer{turn}", reasoning="done")


def test_tool_loop_all_reuses_results_under_the_models_ids():
    reqs, end = run(tool_conv(), "all", model_following_the_dataset)
    assert [r.turn for r in reqs] == [1, 3, 5, 8] and end == End(None)
    assert all(r.tools == TOOLS for r in reqs)
    second = reqs[1].messages
    assert second[1]["tool_calls"][0]["function"]["arguments"] == '{"city":"Paris"}'  # model's own
    assert second[1]["reasoning_content"] == "need data"
    assert second[2] == {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "21C"}
    last = reqs[3].messages
    # parallel calls matched as a multiset: results follow the model's call order and ids
    assert [(m["tool_call_id"], m["content"]) for m in last[-2:]] == [
        ("functions.get_time:1", "14:05"), ("functions.get_weather:2", "27C")]
    assert last[3] == {"role": "assistant", "content": "answer3", "reasoning_content": "done"}


def test_tool_loop_last_regenerates_the_whole_final_loop():
    reqs, end = run(tool_conv(), "last", model_following_the_dataset)
    assert [r.turn for r in reqs] == [5, 8] and end == End(None)
    # the earlier turn is the dataset's own (native ids from the source)
    assert reqs[0].messages[1]["tool_calls"][0]["id"] == "functions.get_weather:0"
    assert reqs[0].messages[3] == {"role": "assistant", "content": "It is 21C."}


def test_first_stops_after_the_first_loop():
    reqs, end = run(tool_conv(), "first", model_following_the_dataset)
    assert [r.turn for r in reqs] == [1, 3] and end == End(None)


@pytest.mark.parametrize("tool_results", ["strict", "name", "position"])
def test_tool_loop_all_matches_exactly_under_every_policy(tool_results):
    reqs, end = run(tool_conv(), "all", model_following_the_dataset, tool_results)
    assert [r.turn for r in reqs] == [1, 3, 5, 8] and end == End(None)
    assert [r.tool_matches for r in reqs] == [(), ("exact",), ("exact",),
                                               ("exact", "exact", "exact")]


# (the model's calls at turn 1, end reason under strict / name / position; None: continues)
SINGLE_CALL_CASES = [
    ([call("get_time", '{"city": "Paris"}', 0)],  # other function
     (TOOL_NAME_MISMATCH, TOOL_NAME_MISMATCH, None)),
    ([call("get_weather", '{"city": "Lyon"}', 0)],  # other argument value
     (TOOL_ARGUMENTS_MISMATCH, None, None)),
    ([call("get_weather", '{"city": "Paris", "unit": "c"}', 0)],  # extra optional field
     (TOOL_ARGUMENTS_MISMATCH, None, None)),
    ([call("get_weather", '{"city": "Paris"}', 0), call("get_weather", '{"city": "Paris"}', 1)],
     (TOOL_COUNT_MISMATCH,) * 3),  # more calls than recorded
    ([], (TOOL_COUNT_MISMATCH,) * 3),  # answered where the dataset called a tool
]


@pytest.mark.parametrize("made,reasons", SINGLE_CALL_CASES)
@pytest.mark.parametrize("policy", [0, 1, 2])
def test_single_call_against_the_recorded_call(made, reasons, policy):
    tool_results = ("strict", "name", "position")[policy]
    conv = tool_conv()
    answers = {1: AssistantMessage(content="" if made else "no tools", tool_calls=tuple(made))}
    step = next_request(conv, answers, "all", tool_results)
    if reasons[policy] is not None:
        assert step == End(reasons[policy])
        return
    kind = "position" if made[0].name != "get_weather" else "name"
    assert step.turn == 3 and step.tool_matches == (kind,)
    # the recorded result, under the model's id, after the model's own call
    assert step.messages[1]["tool_calls"][0]["function"]["arguments"] == made[0].arguments
    assert step.messages[2] == {"role": "tool", "tool_call_id": made[0].id, "content": "21C"}


def parallel_answers(*calls):
    """Answers of tool_conv under "all" up to turn 5, which makes `calls`."""
    return {1: model_following_the_dataset(1, None), 3: AssistantMessage(content="fine"),
            5: AssistantMessage(content="", tool_calls=tuple(calls))}


def test_parallel_calls_by_name_take_the_results_of_their_names():
    made = (call("get_time", '{"city": "Roma"}', 1), call("get_weather", '{"city": "Roma"}', 2))
    step = next_request(tool_conv(), parallel_answers(*made), "all", "name")
    assert step.turn == 8 and step.tool_matches == ("exact", "name", "name")
    assert [(m["tool_call_id"], m["content"]) for m in step.messages[-2:]] == [
        ("functions.get_time:1", "14:05"), ("functions.get_weather:2", "27C")]
    assert next_request(tool_conv(), parallel_answers(*made), "all", "strict") == End(
        TOOL_ARGUMENTS_MISMATCH)


def test_parallel_calls_with_another_count_end_under_every_policy():
    made = (call("get_weather", '{"city": "Rome"}', 1),)
    for policy in ("strict", "name", "position"):
        assert next_request(tool_conv(), parallel_answers(*made), "all", policy) == End(
            TOOL_COUNT_MISMATCH)


def test_an_unknown_function_ends_by_name_and_pairs_by_position():
    made = (call("get_weather", '{"city": "Rome"}', 1), call("get_news", '{"q": "x"}', 2))
    assert next_request(tool_conv(), parallel_answers(*made), "all", "name") == End(
        TOOL_NAME_MISMATCH)
    step = next_request(tool_conv(), parallel_answers(*made), "all", "position")
    assert step.tool_matches == ("exact", "exact", "position")
    assert [(m["tool_call_id"], m["content"]) for m in step.messages[-2:]] == [
        ("functions.get_weather:1", "27C"), ("functions.get_news:2", "14:05")]


def test_position_pairs_what_is_left_in_order_after_exact_and_name():
    # recorded: weather(Rome) -> 27C, time(Rome) -> 14:05; the model: news, time, in that order
    made = (call("get_news", "{}", 1), call("get_time", '{"city": "Oslo"}', 2))
    step = next_request(tool_conv(), parallel_answers(*made), "all", "position")
    assert step.tool_matches == ("exact", "position", "name")  # in the model's call order
    assert [(m["tool_call_id"], m["content"]) for m in step.messages[-2:]] == [
        ("functions.get_news:1", "27C"), ("functions.get_time:2", "14:05")]


def test_exact_matches_are_preferred_over_name_matches():
    row = {"messages": [
        {"role": "user", "content": "weather in Rome and Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
            {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "content": "rome: 27C"}, {"role": "tool", "content": "paris: 21C"},
        {"role": "assistant", "content": "ok"}], "tools": TOOLS}
    conv = row_to_conversation(row, "openai")
    # the first call would take Rome's result by name; the exact pass gives it Paris's
    made = (call("get_weather", '{"city":"Paris"}', 0), call("get_weather", '{"city": "Milan"}', 1))
    for policy in ("name", "position"):
        step = next_request(conv, {1: AssistantMessage(content="", tool_calls=made)}, "all",
                            policy)
        assert step.tool_matches == ("exact", "name")
        assert [m["content"] for m in step.messages[2:]] == ["paris: 21C", "rome: 27C"]


def test_calling_a_tool_where_the_dataset_answered_is_a_count_mismatch():
    conv = tool_conv()
    answers = {1: model_following_the_dataset(1, None),
               3: AssistantMessage(content="", tool_calls=(call("get_time", "{}", 1),))}
    for policy in ("strict", "name", "position"):
        assert next_request(conv, answers, "all", policy) == End(TOOL_COUNT_MISMATCH)


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="tool_results must be one of"):
        next_request(tool_conv(), {}, "all", "loose")


def test_repeated_identical_calls_match_as_a_multiset():
    row = {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_time", "arguments": '{"city": "A"}'}},
            {"function": {"name": "get_time", "arguments": '{"city": "A"}'}},
            {"function": {"name": "get_time", "arguments": '{"city": "B"}'}}]},
        {"role": "tool", "content": "t1"}, {"role": "tool", "content": "t2"},
        {"role": "tool", "content": "t3"},
        {"role": "assistant", "content": "ok"}], "tools": TOOLS}
    conv = row_to_conversation(row, "openai")
    made = (call("get_time", '{"city": "B"}', 0), call("get_time", '{"city":"A"}', 1),
            call("get_time", "{'city': 'A'}", 2))
    step = next_request(conv, {1: AssistantMessage(content="", tool_calls=made)}, "all")
    assert step.turn == 5
    assert [(m["tool_call_id"], m["content"]) for m in step.messages[2:]] == [
        ("functions.get_time:0", "t3"), ("functions.get_time:1", "t1"),
        ("functions.get_time:2", "t2")]


def test_tool_call_on_a_prompt_only_row_ends_without_a_result():
    conv = Conversation(id="p", messages=[{"role": "user", "content": "q"}], tools=TOOLS)
    answers = {1: AssistantMessage(content="", tool_calls=(call("get_time", "{}", 0),))}
    assert next_request(conv, answers, "last") == End(NO_RECORDED_RESULT)


def test_dataset_ending_with_a_tool_result_has_an_open_turn():
    row = {"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "content": "noon"}], "tools": TOOLS}
    conv = row_to_conversation(row, "openai")
    answers = {1: AssistantMessage(content="", tool_calls=(call("get_time", "{}", 0),))}
    step = next_request(conv, answers, "last")
    assert step.turn == 3 and step.messages[-1]["content"] == "noon"


def test_dataset_call_without_recorded_result():
    conv = Conversation(id="x", tools=TOOLS, messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "functions.get_time:0", "type": "function",
             "function": {"name": "get_time", "arguments": "{}"}}]}])
    answers = {1: AssistantMessage(content="", tool_calls=(call("get_time", "{}", 0),))}
    assert next_request(conv, answers, "all") == End(NO_RECORDED_RESULT)


def test_glaive_row_plans_native_tool_calls():
    from pathlib import Path

    from specgen.config import DatasetConfig
    from specgen.sources import iter_rows

    path = Path(__file__).parent / "fixtures" / "datasets" / "glaive.jsonl"
    conv = next(iter_rows(DatasetConfig(name="g", path=path))).conversation
    step = next_request(conv, {}, "last")
    assert step.turn == 2 and [m["role"] for m in step.messages] == ["system", "user"]
    assert [t["function"]["name"] for t in step.tools] == ["get_weather", "get_time"]
    made = AssistantMessage(content="", reasoning="",
                            tool_calls=(call("get_weather", '{"city": "Paris"}', 0),))
    step = next_request(conv, {2: made}, "last")
    assert step.turn == 4
    assert step.messages[-1] == {"role": "tool", "content": '{"temp": 21, "sky": "clear"}',
                                 "tool_call_id": "functions.get_weather:0"}
