"""Response normalisation on hand-made answers: each quirk repaired (ids equal the truth) or
quarantined with its reason."""

from __future__ import annotations

import pytest

from specgen.client.types import ChatResponse, RawToolCall
from specgen.conversation import AssistantMessage, ToolCall
from specgen.normalize import (
    QUARANTINE_REASONS,
    Quarantined,
    normalize,
    sampled_completion_ids,
)
from specgen.render import get_renderer

TOOLS = [{"type": "function", "function": {
    "name": n, "description": f"{n} of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}} for n in ("get_weather", "get_time")]
SB, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CB, CA, CE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
HISTORY = [  # two tool calls before this turn: the next native k is 2
    {"role": "user", "content": "q"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "functions.get_time:0", "type": "function",
         "function": {"name": "get_time", "arguments": "{}"}},
        {"id": "functions.get_time:1", "type": "function",
         "function": {"name": "get_time", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "functions.get_time:0", "content": "a"},
    {"role": "tool", "tool_call_id": "functions.get_time:1", "content": "b"},
]


@pytest.fixture(scope="module")
def r(demo_tokenizer):
    return get_renderer("kimi-k2.5", demo_tokenizer, thinking=True)


def resp(content=None, reasoning=None, calls=(), finish="stop", usage=None):
    return ChatResponse(
        content=content, reasoning=reasoning, reasoning_field="reasoning" if reasoning else None,
        tool_calls=[RawToolCall(index=i, id=c[0], name=c[1], arguments=c[2])
                    for i, c in enumerate(calls)],
        finish_reason=finish, native_finish_reason=finish, provider="p", model="m", id="gen",
        usage=usage or {})


def section(*calls):
    return SB + "".join(f"{CB}{cid}{CA}{args}{CE}" for cid, args in calls) + SE


PLAIN = AssistantMessage(content="Hello there.", reasoning="Let me think.")
CALL = AssistantMessage(content="", reasoning="Need the weather.", tool_calls=(
    ToolCall("functions.get_weather:2", "get_weather", '{"city": "Paris"}'),))
TWO = AssistantMessage(content="Checking both.", reasoning="Two lookups.", tool_calls=(
    ToolCall("functions.get_weather:2", "get_weather", '{"city": "Rome"}'),
    ToolCall("functions.get_time:3", "get_time", '{"city":"Rome"}')))


def check(r, truth, answer, *, repairs=(), tools=TOOLS, messages=HISTORY):
    norm = normalize(answer, tools=tools, renderer=r, messages=messages)
    assert norm.message == truth
    assert r.completion_ids(norm.message) == r.completion_ids(truth)
    for name in repairs:
        assert name in norm.repairs, norm.repairs
    return norm


def quarantined(r, answer, reason, **kw):
    with pytest.raises(Quarantined) as info:
        normalize(answer, tools=kw.pop("tools", TOOLS), renderer=r, **kw)
    assert info.value.reason == reason, info.value
    assert reason in QUARANTINE_REASONS
    return info.value


# -- clean answers -------------------------------------------------------------------------

def test_clean_answers_need_no_repair(r):
    norm = check(r, PLAIN, resp("Hello there.", "Let me think."))
    assert norm.repairs == []
    calls = [("functions.get_weather:2", "get_weather", '{"city": "Paris"}')]
    norm = check(r, CALL, resp("", "Need the weather.", calls, finish="tool_calls"))
    assert norm.repairs == ["flag:arguments_spaced"]


def test_reasoning_content_field_is_read_too(r):
    a = resp("Hello there.")
    a.reasoning, a.reasoning_field = "Let me think.", "reasoning_content"
    check(r, PLAIN, a)


# -- reasoning -----------------------------------------------------------------------------

def test_think_in_content(r):
    check(r, PLAIN, resp("Let me think.</think>Hello there."), repairs=["think_in_content"])


def test_literal_think_tag_opening_the_content(r):
    check(r, PLAIN, resp("<think>Let me think.</think>Hello there."),
          repairs=["think_tag_in_content", "think_in_content"])


def test_end_think_inside_the_reasoning_field(r):
    check(r, PLAIN, resp("", "Let me think.</think>Hello there."),
          repairs=["end_think_in_reasoning"])


def test_unbalanced_reasoning_markers(r):
    quarantined(r, resp("a</think>b</think>c"), "unbalanced_reasoning")
    quarantined(r, resp("<think>never closed"), "unbalanced_reasoning")
    quarantined(r, resp("a <think> b", "r"), "unbalanced_reasoning")


def test_reasoning_without_an_answer_is_empty_or_a_dropped_end_think(r):
    # content dropped: the reasoning is all there is
    quarantined(r, resp("", "Let me think."), "empty")
    # </think> dropped: the reasoning field holds more tokens than the provider counted
    n = len(r.tokenizer.encode("Let me think."))
    quarantined(r, resp(None, "Let me think.Hello there.",
                        usage={"completion_tokens_details": {"reasoning_tokens": n}}),
                "unbalanced_reasoning")


def test_dropped_end_think_before_tool_calls_with_content_is_caught_by_the_count(r):
    n = len(r.tokenizer.encode("Two lookups."))
    calls = [("functions.get_weather:2", "get_weather", '{"city": "Rome"}')]
    quarantined(r, resp(None, "Two lookups.Checking both.", calls, finish="tool_calls",
                        usage={"completion_tokens_details": {"reasoning_tokens": n}}),
                "unbalanced_reasoning", messages=HISTORY)


def test_missing_and_unexpected_reasoning(r, demo_tokenizer):
    quarantined(r, resp("Hello there.", usage={"completion_tokens_details": {"reasoning_tokens": 9}}),
                "missing_reasoning")
    # no reasoning at all and none billed: an empty reasoning
    check(r, AssistantMessage(content="Hi.", reasoning=""), resp("Hi."))
    off = get_renderer("kimi-k2.5", demo_tokenizer, thinking=False)
    quarantined(off, resp("Hi.", "thinking anyway"), "unexpected_reasoning")
    quarantined(off, resp("x</think>Hi."), "unexpected_reasoning")
    norm = normalize(resp("Hi."), tools=None, renderer=off)
    assert norm.message == AssistantMessage(content="Hi.", reasoning=None)
    instruct = get_renderer("kimi-k2-instruct", demo_tokenizer)
    quarantined(instruct, resp("Hi.", "r"), "unexpected_reasoning")


# -- stop tokens and spaces ----------------------------------------------------------------

@pytest.mark.parametrize("tail", ["<|im_end|>", "[EOS]", "<|im_end|>[EOS]"])
def test_trailing_stop_text_is_removed(r, tail):
    check(r, PLAIN, resp("Hello there." + tail, "Let me think."), repairs=["trailing_stop_token"])


def test_stop_text_inside_the_answer_is_quarantined(r):
    quarantined(r, resp("Hello<|im_end|> there.", "r"), "stray_special_token")
    quarantined(r, resp("Hi <|im_user|>user", "r"), "stray_special_token")


def test_spaces_around_special_tokens_are_undone(r):
    # how a space-joining decoder writes reasoning</think>content<|im_end|> into content
    check(r, PLAIN, resp("Let me think. </think> Hello there. <|im_end|>"),
          repairs=["special_token_spaces", "think_in_content", "trailing_stop_token"])
    # a space the model wrote itself survives (two spaces -> one)
    truth = AssistantMessage(content=" Hello", reasoning="Let me think.")
    check(r, truth, resp("Let me think. </think>  Hello <|im_end|>"))
    # a leading space before a marker opening the text
    check(r, PLAIN, resp(" <think> Let me think. </think> Hello there."))


def test_unpadded_markers_mean_no_space_repair(r):
    # a padded trailing stop marker alone counts as the spaced decode
    norm = check(r, AssistantMessage(content="a", reasoning="r"), resp("a <|im_end|>", "r"))
    assert "special_token_spaces" in norm.repairs
    truth = AssistantMessage(content="a  b", reasoning="r")
    norm = check(r, truth, resp("a  b<|im_end|>", "r"))
    assert "special_token_spaces" not in norm.repairs


# -- tool calls ----------------------------------------------------------------------------

def test_tool_calls_as_marker_text_in_content(r):
    text = "Two lookups.</think>Checking both." + section(
        ("functions.get_weather:2", '{"city": "Rome"}'), ("functions.get_time:3", '{"city":"Rome"}'))
    check(r, TWO, resp(text + "<|im_end|>"), repairs=["tool_calls_from_content", "think_in_content"])
    check(r, TWO, resp("Checking both." + section(
        ("functions.get_weather:2", '{"city": "Rome"}'), ("functions.get_time:3", '{"city":"Rome"}')),
        "Two lookups."), repairs=["tool_calls_from_content"])


def test_tool_calls_as_spaced_marker_text(r):
    spaced = (f"Checking both. {SB} {CB} functions.get_weather:2 {CA} {{\"city\": \"Rome\"}} {CE} "
              f"{CB} functions.get_time:3 {CA} {{\"city\":\"Rome\"}} {CE} {SE} <|im_end|>")
    check(r, TWO, resp(spaced, "Two lookups."),
          repairs=["special_token_spaces", "tool_calls_from_content", "trailing_stop_token"])


def test_marker_ids_are_the_models_own_and_kept(r):
    # the text is what the model sampled: its id is kept even if k looks off
    truth = AssistantMessage(content="", reasoning="r", tool_calls=(
        ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}'),))
    norm = check(r, truth, resp(section(("functions.get_weather:0", '{"city": "Paris"}')), "r"))
    assert not any(x.startswith("tool_call_id") for x in norm.repairs)


def test_tool_calls_in_the_reasoning_field(r):
    text = "Need the weather." + section(("functions.get_weather:2", '{"city": "Paris"}'))
    check(r, CALL, resp(None, text), repairs=["tool_calls_from_reasoning"])
    check(r, CALL, resp(None, text + "<|im_end|>"), repairs=["tool_calls_from_reasoning"])


def test_server_made_ids_are_restored(r):
    calls = [("call_Zx81kq", "get_weather", '{"city": "Rome"}'),
             ("call_k2", "get_time", '{"city":"Rome"}')]
    norm = check(r, TWO, resp("Checking both.", "Two lookups.", calls), repairs=["tool_call_id_restored"])
    renumbered = [("functions.get_weather:0", "get_weather", '{"city": "Rome"}'),
                  ("functions.get_time:1", "get_time", '{"city":"Rome"}')]
    norm = check(r, TWO, resp("Checking both.", "Two lookups.", renumbered))
    assert norm.repairs.count("tool_call_id_renumbered") == 2
    # without the history k is unknown: the id stays and is flagged
    norm = normalize(resp("Checking both.", "Two lookups.", calls), tools=TOOLS, renderer=r)
    assert norm.message.tool_calls[0].id == "call_Zx81kq"
    assert "flag:tool_call_id_unrestorable" in norm.repairs
    padded = [(" functions.get_weather:2 ", "get_weather", '{"city": "Paris"}')]
    check(r, CALL, resp("", "Need the weather.", padded), repairs=["tool_call_id_stripped"])


def test_arguments_are_never_reserialised_and_their_style_is_flagged(r):
    args = '{"city":"Paris" }'
    norm = normalize(resp("", "r", [("functions.get_weather:2", "get_weather", args)]),
                     tools=TOOLS, renderer=r, messages=HISTORY)
    assert norm.message.tool_calls[0].arguments == args
    assert "flag:arguments_compact" in norm.repairs


@pytest.mark.parametrize("args", ['{"city": ', "[1, 2]", "'{\"city\": 1}'"])
def test_bad_tool_arguments(r, args):
    quarantined(r, resp("", "r", [("functions.get_weather:2", "get_weather", args)]),
                "bad_tool_arguments")


def test_unknown_tool(r):
    quarantined(r, resp("", "r", [("functions.launch:0", "launch", "{}")]), "unknown_tool")
    # raw tool-call text when the request had no tools
    quarantined(r, resp(section(("functions.get_weather:0", "{}")), "r"), "unknown_tool", tools=None)


@pytest.mark.parametrize("text", [
    SB + CB + "functions.get_weather:0",  # unterminated
    SB + CB + "functions.get_weather:0" + CA + "{}" + CE + SE + "more text",
    SB + "junk" + CB + "functions.get_weather:0" + CA + "{}" + CE + SE,
    SB + SE,
    "text " + CE,
])
def test_bad_tool_call_markup(r, text):
    quarantined(r, resp(text, "r"), "bad_tool_call_markup")


def test_structured_and_text_calls_disagreeing(r):
    calls = [("call_1", "get_weather", "{}")]
    text = section(("functions.get_weather:2", "{}"), ("functions.get_time:3", "{}"))
    quarantined(r, resp(text, "r", calls), "conflicting_tool_calls")


def test_finish_tool_calls_without_calls(r):
    quarantined(r, resp("", "r", finish="tool_calls"), "missing_tool_calls")


# -- finish reasons ------------------------------------------------------------------------

def test_length_drop_and_keep(r):
    quarantined(r, resp("Hello", "Let me think.", finish="length"), "length")
    quarantined(r, resp("Hello", "r", finish="content_filter"), "content_filter")
    quarantined(r, resp("Hello", "r", finish=None), "incomplete")
    # kept: stopped inside the content
    norm = normalize(resp("Hello", "Let me think.", finish="length"), tools=None, renderer=r,
                     on_length="keep")
    assert norm.truncated and norm.reasoning_closed
    truth_text = "Let me think.</think>Hello"
    assert sampled_completion_ids(r, norm) == r.tokenizer.encode(truth_text)
    # kept: stopped inside the reasoning (no </think>, no stop token)
    norm = normalize(resp(None, "Let me th", finish="length"), tools=None, renderer=r,
                     on_length="keep")
    assert not norm.reasoning_closed and norm.message.reasoning == "Let me th"
    assert sampled_completion_ids(r, norm) == r.tokenizer.encode("Let me th")
    # a parser-less server truncated inside the reasoning: the text is reasoning
    norm = normalize(resp("Let me th", finish="length"), tools=None, renderer=r, on_length="keep")
    assert norm.message == AssistantMessage(content="", reasoning="Let me th")
    quarantined(r, resp("", finish="length"), "empty", on_length="keep")


def test_empty_answers(r):
    quarantined(r, resp("", None), "empty")
    quarantined(r, resp(None, None), "empty")
    quarantined(r, resp("<|im_end|>", None), "empty")


def test_hf_renderer_accepts_reasoning_and_structured_calls(demo_tokenizer):
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    hf = get_renderer("hf", demo_tokenizer, template=template)
    stop = demo_tokenizer.id_to_special[min(hf.stop_token_ids)]
    norm = normalize(resp("Hi" + stop, "hmm", [("call_1", "get_time", "{\"city\": \"Rome\"}")]), tools=TOOLS,
                     renderer=hf, messages=HISTORY)
    assert norm.message.content == "Hi" and norm.message.reasoning == "hmm"
    assert norm.message.tool_calls[0].id == "call_1"  # non-Kimi ids are left alone
    assert "trailing_stop_token" in norm.repairs
    norm = normalize(resp("Hi"), tools=None, renderer=hf)
    assert norm.message.reasoning is None
