"""The glaive function-calling parser on tricky rows, and the tolerant arguments parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from specgen.config import DatasetConfig
from specgen.sources import iter_rows, row_to_conversation
from specgen.sources.arguments import (
    ArgumentsError,
    arguments_equal,
    canonical_arguments,
    parse_arguments,
)
from specgen.sources.glaive import parse_function_call, split_function_definitions
from specgen.sources.messages import FormatError

FIX = Path(__file__).parent / "fixtures" / "datasets"


@pytest.fixture(scope="module")
def rows():
    return list(iter_rows(DatasetConfig(name="g", path=FIX / "glaive.jsonl")))


def names(tools):
    return [t["function"]["name"] for t in tools or ()]


def test_two_functions_become_tools_and_system_keeps_only_its_sentence(rows):
    c = rows[0].conversation
    assert names(c.tools) == ["get_weather", "get_time"]
    assert c.tools[0]["function"]["parameters"]["required"] == ["city"]
    assert c.messages[0] == {
        "role": "system",
        "content": "You are a helpful assistant with access to the following functions. "
                   "Use them if required"}
    assert "{" not in c.messages[0]["content"]
    assert c.messages[2]["tool_calls"] == [{
        "id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert c.messages[2]["content"] == ""
    assert c.messages[3] == {"role": "tool", "content": '{"temp": 21, "sky": "clear"}',
                             "tool_call_id": "functions.get_weather:0"}
    assert c.messages[4] == {"role": "assistant", "content": "It is 21 degrees and clear in Paris."}


def test_no_functions_keeps_the_system_text_and_has_no_tools(rows):
    c = rows[1].conversation
    assert c.tools is None
    assert c.messages[0]["content"] == "You are a helpful assistant, with no access to external functions."
    assert [m["role"] for m in c.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert all("<|endoftext|>" not in m["content"] for m in c.messages)


def test_several_calls_in_one_block_with_content_before_them(rows):
    c = rows[2].conversation
    call_msg = c.messages[2]
    assert call_msg["content"] == "Let me check both."
    assert [(x["id"], x["function"]["arguments"]) for x in call_msg["tool_calls"]] == [
        ("functions.get_weather:0", '{"city": "Tokyo"}'),
        ("functions.get_time:1", '{"city": "Tokyo"}')]
    assert [m["tool_call_id"] for m in c.messages[3:5]] == [
        "functions.get_weather:0", "functions.get_time:1"]


def test_apostrophe_inside_single_quoted_arguments(rows):
    args = rows[3].conversation.messages[2]["tool_calls"][0]["function"]["arguments"]
    assert args == '{"to": "Sam", "text": "I\'m late"}'


def test_python_literal_arguments_get_canonical_json(rows):
    args = rows[4].conversation.messages[2]["tool_calls"][0]["function"]["arguments"]
    assert args == '{"city": "Berlin", "unit": "f"}'


def test_object_arguments_and_calls_in_sequence_count_on(rows):
    c = rows[5].conversation
    assert c.messages[2]["tool_calls"][0]["id"] == "functions.get_weather:0"
    assert c.messages[4]["tool_calls"][0]["id"] == "functions.get_time:1"
    assert c.messages[5]["tool_call_id"] == "functions.get_time:1"
    assert c.messages[4]["tool_calls"][0]["function"]["arguments"] == '{"city": "Rome"}'


def test_broken_rows_have_lines_and_reasons(rows):
    bad = [(r.index, r.error.line, r.error.reason) for r in rows if r.error]
    assert [b[:2] for b in bad] == [(6, 7), (7, 8), (8, 9)]
    assert "payload unreadable" in bad[0][2]
    assert "calls tool 'book_flight'" in bad[1][2] and "declared: get_weather" in bad[1][2]
    assert "no 'chat' text" in bad[2][2]


def test_combined_sample_text_with_system_marker():
    row = {"sample": "SYSTEM: You can use -\n{\"name\": \"f\", \"parameters\": {}}\n\n\n"
                     "USER: hi\n\n\nASSISTANT: <functioncall> {\"name\": \"f\", \"arguments\": '{}'}\n\n\n"
                     "FUNCTION RESPONSE: ok\n\n\nASSISTANT: bye <|endoftext|>"}
    c = row_to_conversation(row, "glaive")
    assert names(c.tools) == ["f"]
    assert c.messages[0] == {"role": "system", "content": "You can use"}
    assert c.messages[2]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert c.messages[-1]["content"] == "bye"


def test_marker_words_inside_a_line_do_not_split_turns():
    row = {"chat": "USER: please write USER: and ASSISTANT: literally\n\n\nASSISTANT: ok USER: done"}
    c = row_to_conversation(row, "glaive")
    assert [m["content"] for m in c.messages] == [
        "please write USER: and ASSISTANT: literally", "ok USER: done"]


def test_text_before_the_first_turn_is_an_error():
    with pytest.raises(FormatError, match="outside a turn"):
        row_to_conversation({"chat": "hello\nUSER: hi"}, "glaive")


@pytest.mark.parametrize("payload, name, args", [
    ('{"name": "f", "arguments": \'{"a": 1}\'}', "f", '{"a": 1}'),
    ('{"name": "f", "arguments": "{\\"a\\": 1}"}', "f", '{"a": 1}'),
    ('{"name": "f", "arguments": {"a": [1, 2]}}', "f", {"a": [1, 2]}),
    ("{'name': 'f', 'arguments': {'a': True}}", "f", {"a": True}),
    ('{"arguments": \'{"q": "x"}\', "name": "g"}', "g", '{"q": "x"}'),
    ('{"name": "f", "arguments": \'{"a": "it\'s"}\'}', "f", '{"a": "it\'s"}'),
    ('{"name": "f"}', "f", {}),
])
def test_function_call_payloads(payload, name, args):
    assert parse_function_call(payload) == (name, args)


def test_function_call_payload_without_name():
    with pytest.raises(FormatError, match="no function name"):
        parse_function_call('{"arguments": {}}')


def test_definitions_with_trailing_text_and_non_function_braces():
    text, tools = split_function_definitions('Use these -\n{"name": "a"}\n{"name": "b"}\nBe nice.')
    assert names(tools) == ["a", "b"] and text == "Use these\n\nBe nice."
    text, tools = split_function_definitions("Reply in the form {answer}.")
    assert tools is None and text == "Reply in the form {answer}."
    text, tools = split_function_definitions("Tools -\n{'name': 'py', 'parameters': {}}")
    assert names(tools) == ["py"]


@pytest.mark.parametrize("text, value", [
    ('{"a": 1}', {"a": 1}),
    ("'{\"a\": 1}'", {"a": 1}),
    ('"{\\"a\\": 1}"', {"a": 1}),
    ("{'a': 'x', 'b': None, 'c': False,}", {"a": "x", "b": None, "c": False}),
    ("{'s': 'tab\\there', 'u': '\\u00e9'}", {"s": "tab\there", "u": "é"}),
    ("  ", {}),
    ("[1, 2.5, -3]", [1, 2.5, -3]),
])
def test_parse_arguments(text, value):
    assert parse_arguments(text) == value


@pytest.mark.parametrize("text", ["{'a': }", "{'a' 1}", "{'a': 'open", "{a: b c}"])
def test_parse_arguments_rejects_garbage(text):
    with pytest.raises(ArgumentsError):
        parse_arguments(text)


def test_arguments_equal_is_strict_on_types_and_loose_on_style():
    assert arguments_equal('{"a": 1, "b": [1, 2]}', '{"b":[1,2],"a":1}')
    assert arguments_equal('{"a": 1}', "{'a': 1.0}")
    assert not arguments_equal('{"a": true}', '{"a": 1}')
    assert not arguments_equal('{"a": "1"}', '{"a": 1}')
    assert not arguments_equal('{"a": 1}', '{"a": 1, "b": 2}')
    assert arguments_equal("not json at all", " not json at all ")
    assert not arguments_equal("not json", '{"a": 1}')


def test_canonical_arguments_keeps_json_verbatim():
    assert canonical_arguments('{"b":2,"a":1}') == '{"b":2,"a":1}'
    assert canonical_arguments("{'a': 'é'}") == '{"a": "é"}'
    assert canonical_arguments({"x": [1]}) == '{"x": [1]}'
    assert canonical_arguments('"{\\"a\\":1}"') == '{"a": 1}'
