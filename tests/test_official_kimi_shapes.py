"""Shapes where specgen and the official Kimi templates used to disagree (issue 34).

Each case renders the official template (tests/official_kimi.py: the files in
../shared/models loaded by path) and specgen's native renderer and compares ids, or checks that
both refuse with specgen's message naming the field.
"""

from __future__ import annotations

import json

import jinja2
import pytest

from conftest import model_path, models_root
from official_kimi import OfficialKimi
from specgen.render import RenderError, get_renderer
from specgen.render.validate import check_conversation
from specgen.tokenizer import load_tokenizer

IMAGE = {"type": "image_url", "image_url": {"url": "data:,"}}


@pytest.fixture(scope="module")
def k25_dir():
    path = model_path("kimi-k2.5")
    if not (path / "chat_template.jinja").exists():
        pytest.skip(f"official template not found in {path}")
    return path


@pytest.fixture(scope="module")
def tok(k25_dir):
    return load_tokenizer(k25_dir)


@pytest.fixture(scope="module")
def official(k25_dir, tmp_path_factory):
    """name -> (official harness, native renderer)."""
    k2i = model_path("kimi-k2-instruct")
    template = tmp_path_factory.mktemp("k2i") / "k2-instruct.jinja"
    template.write_text(json.loads((k2i / "tokenizer_config.json").read_text())["chat_template"])
    thinking = models_root() / "templates" / "kimi-k2-thinking.chat_template.jinja"
    return {
        "kimi-k2.5": OfficialKimi(k25_dir / "chat_template.jinja", k25_dir / "tiktoken.model",
                                  k25_dir / "tokenizer_config.json",
                                  k25_dir / "tool_declaration_ts.py"),
        "kimi-k2-thinking": OfficialKimi(thinking, k25_dir / "tiktoken.model",
                                         k25_dir / "tokenizer_config.json"),
        "kimi-k2-instruct": OfficialKimi(template, k2i / "tiktoken.model",
                                         k2i / "tokenizer_config.json"),
    }


@pytest.fixture(scope="module")
def k2i_tok():
    return load_tokenizer(model_path("kimi-k2-instruct"))


def native(name, tok, k2i_tok):
    return get_renderer(name, k2i_tok if name == "kimi-k2-instruct" else tok)


ALL = ["kimi-k2.5", "kimi-k2-thinking", "kimi-k2-instruct"]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("parts", [
    ["plain string part", {"type": "text", "text": "typed"}],
    ["an image of a cat", {"type": "text", "text": "typed"}],  # 'image' in a string part
    ["image_url", IMAGE, "x"],
])
def test_bare_strings_in_list_content(official, tok, k2i_tok, name, parts):
    msgs = [{"role": "user", "content": parts}]
    want = official[name].ids(msgs, add_generation_prompt=True)
    assert native(name, tok, k2i_tok).prompt_ids(msgs) == want


@pytest.mark.parametrize("name", ALL)
def test_an_image_in_an_assistant_message(official, tok, k2i_tok, name):
    msgs = [{"role": "user", "content": "draw"},
            {"role": "assistant", "content": [{"type": "text", "text": "here: "}, IMAGE]},
            {"role": "user", "content": "again"}]
    want = official[name].ids(msgs, add_generation_prompt=True)
    assert native(name, tok, k2i_tok).prompt_ids(msgs) == want


@pytest.mark.parametrize("name", ["kimi-k2.5", "kimi-k2-thinking"])
def test_an_image_in_the_sampled_assistant_turn(official, tok, k2i_tok, name):
    call = {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [{"role": "user", "content": "draw"},
            {"role": "assistant", "content": [IMAGE, "an image"], "tool_calls": [call]}]
    want = official[name].sample_ids(msgs)
    assert native(name, tok, k2i_tok).sample(msgs).input_ids == want


def weather(prop, **extra):
    return [{"type": "function", "function": {"name": "w", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "a": prop, "c": prop},
        **extra}}}]


@pytest.mark.parametrize("tools", [
    weather({"type": None}),
    weather({"type": {"kind": "x"}, "description": "odd"}),
    weather({"enum": "abc"}),
    weather({"type": "string", "enum": "abc"}),
    weather({"type": "string"}, required="city"),
    weather({"type": "integer", "minimum": 1}, required={"c": 1}),
    weather({"enum": 3}),  # not iterable: both fall back to JSON
    weather({"type": "string"}, required=[["city"]]),  # unhashable: JSON
    weather({"type": "string"}, properties=None),
])
def test_tool_schemas_the_typescript_encoder_still_writes(official, tok, tools):
    msgs = [{"role": "user", "content": "weather?"}]
    want = official["kimi-k2.5"].ids(msgs, tools, add_generation_prompt=True)
    assert get_renderer("kimi-k2.5", tok).prompt_ids(msgs, tools) == want


def test_the_typescript_forms_of_odd_schemas(tok):
    text = get_renderer("kimi-k2.5", tok).render_text(
        [{"role": "user", "content": "?"}], weather({"enum": "abc"}, required="c"),
        add_generation_prompt=True)
    assert 'c: "a" | "b" | "c"' in text and 'a?: "a" | "b" | "c"' in text  # required = {c,i,t,y}
    text = get_renderer("kimi-k2.5", tok).render_text(
        [{"role": "user", "content": "?"}], weather({"type": None}), add_generation_prompt=True)
    assert "a?: None" in text


def test_k2_instruct_writes_no_header_for_a_developer_message(official, k2i_tok, tok):
    msgs = [{"role": "system", "content": "sys"}, {"role": "developer", "content": "dev"},
            {"role": "user", "content": "hi"}]
    want = official["kimi-k2-instruct"].ids(msgs, add_generation_prompt=True)
    r = native("kimi-k2-instruct", tok, k2i_tok)
    assert r.prompt_ids(msgs) == want
    assert "developer" not in r.render_text(msgs, add_generation_prompt=True)


@pytest.mark.parametrize("name", ALL)
def test_a_history_call_without_arguments_is_refused(official, tok, k2i_tok, name):
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "functions.f:0", "type": "function", "function": {"name": "f"}}]},
            {"role": "tool", "tool_call_id": "functions.f:0", "content": "ok"}]
    if name != "kimi-k2-instruct":  # the original K2-Instruct template drops tool calls
        with pytest.raises((jinja2.TemplateError, TypeError)):
            official[name].ids(msgs, add_generation_prompt=True)
    with pytest.raises(RenderError, match=r"arguments is missing"):
        native(name, tok, k2i_tok).prompt_ids(msgs)
    with pytest.raises(RenderError, match=r"messages\[1\]\.tool_calls\[0\]\.function\.arguments: "
                                          r"missing"):
        check_conversation(msgs)


def test_a_custom_tool_call_is_refused_naming_the_missing_function(official, tok):
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "custom", "custom": {"name": "f", "input": "x"}}]}]
    with pytest.raises(Exception):  # noqa: B017 - jinja's UndefinedError
        official["kimi-k2.5"].ids(msgs, add_generation_prompt=True)
    with pytest.raises(RenderError, match="no function"):
        get_renderer("kimi-k2.5", tok).prompt_ids(msgs)
    with pytest.raises(RenderError) as err:
        check_conversation(msgs)
    assert "function: missing" in str(err.value) and "'custom'" in str(err.value)
    assert "null" not in str(err.value)
    msgs[1]["tool_calls"][0]["function"] = None
    with pytest.raises(RenderError, match="got null"):
        check_conversation(msgs)
