"""Kimi renderers against the real K2 tokenizer files (skipped with a reason when absent).

Facts from ../shared/reference/kimi-k2-format.md. Choices for the items marked [unsure]:
  * K2.5 injects no default system prompt (switch: kimi.K25_DEFAULT_SYSTEM).
  * `// Default:` uses Python repr (see test_render_kimi_tools.py).
  * K2-Instruct writes tools with HF tojson's default separators, as the template in its
    tokenizer_config.json does (checked below against that template through the hf renderer).
"""

from __future__ import annotations

import pytest

from conftest import model_path
from specgen.conversation import AssistantMessage, ToolCall
from specgen.render import NotPrefixExtendingError, get_renderer, kimi
from specgen.tokenizer import load_tokenizer

SPECIAL_IDS = {
    "[BOS]": 163584, "[EOS]": 163585, "<|im_end|>": 163586, "<|im_user|>": 163587,
    "<|im_assistant|>": 163588, "<|start_header_id|>": 163590, "<|end_header_id|>": 163591,
    "[EOT]": 163593, "<|im_system|>": 163594, "<|tool_calls_section_begin|>": 163595,
    "<|tool_calls_section_end|>": 163596, "<|tool_call_begin|>": 163597,
    "<|tool_call_argument_begin|>": 163598, "<|tool_call_end|>": 163599,
    "<|im_middle|>": 163601, "<|media_begin|>": 163602, "<|media_content|>": 163603,
    "<|media_end|>": 163604, "<|media_pad|>": 163605, "<think>": 163606, "</think>": 163607,
    "[UNK]": 163838, "[PAD]": 163839,
}
IM_END, THINK, END_THINK, IM_MIDDLE = 163586, 163606, 163607, 163601

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
                "city": {"type": "string", "description": "City name"},
            },
            "required": ["city"],
        },
    },
}
WEATHER_TS = (
    "# Tools\n\n## functions\nnamespace functions {\n"
    "// Current weather for a city.\n"
    "type get_weather = (_: {\n"
    "  // City name\n"
    "  city: string,\n"
    '  // Default: "c"\n'
    '  unit?: "c" | "f"\n'
    "}) => any;\n"
    "}\n"
)


def call(k, args='{"city": "Paris"}', name="get_weather"):
    return {"id": f"functions.{name}:{k}", "type": "function",
            "function": {"name": name, "arguments": args}}


@pytest.fixture(scope="module")
def k25(kimi_tokenizer):
    return get_renderer("kimi-k2.5", kimi_tokenizer)


@pytest.fixture(scope="module")
def k25_off(kimi_tokenizer):
    return get_renderer("kimi-k2.5", kimi_tokenizer, thinking=False)


@pytest.fixture(scope="module")
def instruct_tok():
    return load_tokenizer(model_path("kimi-k2-instruct"))


# -- tokenizer facts ------------------------------------------------------------------------------


def test_special_token_ids_and_vocab(kimi_tokenizer):
    for text, tid in SPECIAL_IDS.items():
        assert kimi_tokenizer.token_id(text) == tid, text
    assert kimi_tokenizer.id_to_special[163600] == "<|reserved_token_163600|>"
    assert kimi_tokenizer.vocab_size == 163840


def test_encode_facts(kimi_tokenizer):
    enc = kimi_tokenizer.encode
    assert enc("a<|im_end|>b") == [64, 163586, 65]
    assert enc("\n") == [198] and enc("\n\n") == [382]
    assert [enc(r) for r in ("user", "assistant", "system", "tool")] == [[2482], [69702], [14062], [20960]]
    assert kimi_tokenizer.encode_ordinary("a<|im_end|>b")[0] == 64
    assert 163586 not in kimi_tokenizer.encode_ordinary("a<|im_end|>b")


# -- generation prompts ---------------------------------------------------------------------------


def test_generation_prompts(kimi_tokenizer, k25, k25_off):
    msgs = [{"role": "user", "content": "hi"}]
    assert k25.prompt_ids(msgs)[-4:] == [163588, 69702, IM_MIDDLE, THINK]
    assert k25_off.prompt_ids(msgs)[-2:] == [THINK, END_THINK]
    assert k25.render_text(msgs, add_generation_prompt=True) == (
        "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    )  # no default system prompt for K2.5: the [unsure] choice
    thinking = get_renderer("kimi-k2-thinking", kimi_tokenizer)
    assert thinking.render_text(msgs, add_generation_prompt=True) == (
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
        "<|im_end|><|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|>"
    )
    assert thinking.prompt_ids(msgs)[-1] == IM_MIDDLE


def test_k25_default_system_switch(kimi_tokenizer, monkeypatch):
    monkeypatch.setattr(kimi, "K25_DEFAULT_SYSTEM", kimi.K2_THINKING_SYSTEM)
    r = get_renderer("kimi-k2.5", kimi_tokenizer)
    assert r.render_text([{"role": "user", "content": "x"}], add_generation_prompt=False).startswith(
        "<|im_system|>system<|im_middle|>You are Kimi")


# -- whole conversations --------------------------------------------------------------------------


def test_tools_conversation_exact_text_ids_and_mask(kimi_tokenizer, k25):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
         "tool_calls": [call(0)]},
    ]
    prompt = (
        f"<|im_system|>tool_declare<|im_middle|>{WEATHER_TS}<|im_end|>"
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
        "<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )
    completion = (
        "Need the tool.</think><|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
        "<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    )
    assert k25.render_text(msgs[:-1], [WEATHER], add_generation_prompt=True) == prompt
    assert k25.completion_text(msgs[-1]) == completion
    s = k25.sample(msgs, [WEATHER])
    assert s.input_ids == kimi_tokenizer.encode(prompt + completion)
    assert s.n_prompt == len(kimi_tokenizer.encode(prompt))
    assert s.loss_mask == [0] * s.n_prompt + [1] * (len(s.input_ids) - s.n_prompt)
    assert s.input_ids[s.n_prompt - 1] == THINK and s.input_ids[-1] == IM_END
    assert k25.parse_completion(s.input_ids[s.n_prompt:]) == AssistantMessage(
        content="", reasoning="Need the tool.",
        tool_calls=(ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}'),))


def test_tool_loop_keeps_reasoning_inside_the_loop_and_drops_it_after(k25):
    loop = [
        {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": "", "reasoning_content": "R1", "tool_calls": [call(0)]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "18C"},
        {"role": "assistant", "content": "", "reasoning_content": "R2",
         "tool_calls": [call(1, '{"city": "Rome"}')]},
        {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "24C"},
    ]
    text = k25.render_text(loop, [WEATHER], add_generation_prompt=True)
    assert "<think>R1</think>" in text and "<think>R2</think>" in text
    assert "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:1\n24C<|im_end|>" in text
    final = {"role": "assistant", "content": "Paris 18C, Rome 24C.", "reasoning_content": "R3"}
    done = [*loop, final, {"role": "user", "content": "Thanks"}]
    text = k25.render_text(done, [WEATHER], add_generation_prompt=True)
    # the finished turn is history now: every assistant message at or before it loses reasoning
    assert "R1" not in text and "R2" not in text and "R3" not in text
    assert text.count("<think></think>") == 3
    assert text.endswith("<|im_user|>user<|im_middle|>Thanks<|im_end|>"
                         "<|im_assistant|>assistant<|im_middle|><think>")


def test_reasoning_history_dropping_boundary_is_the_last_plain_assistant(k25):
    msgs = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "", "reasoning_content": "r2", "tool_calls": [call(0)]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "ok"},
    ]
    text = k25.render_text(msgs, add_generation_prompt=True)
    assert "<think></think>a1" in text and "<think>r2</think>" in text


def test_thinking_off_drops_reasoning_everywhere_and_samples_no_think(kimi_tokenizer, k25_off):
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [call(0)]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "ok"},
        {"role": "assistant", "content": "done", "reasoning_content": "ignored"},
    ]
    s = k25_off.sample(msgs)
    text = kimi_tokenizer.decode(s.input_ids)
    assert "<think>r</think>" not in text and "ignored" not in text
    assert kimi_tokenizer.decode(s.input_ids[s.n_prompt:]) == "done<|im_end|>"
    assert s.input_ids[s.n_prompt - 2:s.n_prompt] == [THINK, END_THINK]
    assert k25_off.parse_completion(s.input_ids[s.n_prompt:]) == AssistantMessage(content="done")


def test_cjk_and_emoji_round_trip(kimi_tokenizer, k25):
    msgs = [{"role": "user", "content": "你好，世界！天气怎么样？😀🎉 naïve café"},
            {"role": "assistant", "content": "今天晴朗 ☀️ 25°C", "reasoning_content": "用户问天气 🤔"}]
    s = k25.sample(msgs)
    assert kimi_tokenizer.decode(s.input_ids) == (
        k25.render_text(msgs[:-1], add_generation_prompt=True) + k25.completion_text(msgs[-1]))
    assert k25.parse_completion(s.input_ids[s.n_prompt:]) == AssistantMessage(
        content="今天晴朗 ☀️ 25°C", reasoning="用户问天气 🤔")


def test_tool_result_starting_with_newlines_is_encoded_as_one_piece(kimi_tokenizer, k25):
    body = "## Return of functions.f:0\n\n\nresult"
    one_piece = kimi_tokenizer.encode(body)
    two_pieces = kimi_tokenizer.encode("## Return of functions.f:0\n") + kimi_tokenizer.encode("\n\nresult")
    assert one_piece != two_pieces  # the reason it matters
    msgs = [{"role": "user", "content": "x"},
            {"role": "tool", "tool_call_id": "functions.f:0", "content": "\n\nresult"}]
    ids = k25.prompt_ids(msgs)
    start = ids.index(IM_MIDDLE, ids.index(163594)) + 1
    assert ids[start:start + len(one_piece)] == one_piece
    assert ids[start + len(one_piece)] == IM_END


def test_literal_special_token_text_in_user_content_becomes_control_ids(kimi_tokenizer, k25):
    msgs = [{"role": "user", "content": "say <|im_end|> or <think>hi</think>"}]
    ids = k25.prompt_ids(msgs)
    assert ids[:4] == [163587, 2482, IM_MIDDLE, kimi_tokenizer.encode("say")[0]]
    user_span = ids[3:ids.index(163588)]
    assert IM_END in user_span[:-1] and THINK in user_span and END_THINK in user_span
    assert kimi_tokenizer.decode(ids) == k25.render_text(msgs, add_generation_prompt=True)


def test_name_fields_replace_the_role_name(k25):
    msgs = [{"role": "system", "name": "rules", "content": "s"},
            {"role": "user", "name": "alice", "content": "u"},
            {"role": "assistant", "name": "bot", "content": "a"},
            {"role": "tool", "name": "get_weather", "tool_call_id": "t", "content": "r"}]
    text = k25.render_text(msgs, add_generation_prompt=True)
    assert text == (
        "<|im_system|>rules<|im_middle|>s<|im_end|><|im_user|>alice<|im_middle|>u<|im_end|>"
        "<|im_assistant|>bot<|im_middle|><think></think>a<|im_end|>"
        "<|im_system|>get_weather<|im_middle|>## Return of t\nr<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )


def test_content_parts_with_images(kimi_tokenizer, k25):
    msgs = [{"role": "user", "content": [
        {"type": "text", "text": "What is "},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "this?"},
    ]}]
    text = k25.render_text(msgs, add_generation_prompt=False)
    assert text == ("<|im_user|>user<|im_middle|>What is <|media_begin|>image<|media_content|>"
                    "<|media_pad|><|media_end|>\nthis?<|im_end|>")
    ids = kimi_tokenizer.encode(text)
    k = ids.index(163602)
    assert ids[k + 2:k + 6] == [163603, 163605, 163604, 198]


def test_tool_declaration_falls_back_to_json_for_unwritable_schemas(k25):
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/definitions/X"}}}}}
    text = k25.render_text([{"role": "user", "content": "x"}], [bad], add_generation_prompt=False)
    assert text.startswith('<|im_system|>tool_declare<|im_middle|>[{"function":{"name":"f",')


def test_k2_thinking_samples_its_own_think_and_uses_json_tools(kimi_tokenizer):
    r = get_renderer("kimi-k2-thinking", kimi_tokenizer, thinking=False)  # no off mode
    assert r.thinking is True
    msgs = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning_content": "r"}]
    s = r.sample(msgs, [WEATHER])
    assert kimi_tokenizer.decode(s.input_ids[s.n_prompt:]) == "<think>r</think>a<|im_end|>"
    assert r.parse_completion(s.input_ids[s.n_prompt:]) == AssistantMessage(content="a", reasoning="r")
    assert '<|im_middle|>[{"function":{"description":"Current weather' in kimi_tokenizer.decode(s.input_ids)


# -- K2-Instruct: native renderer == the real template through the hf renderer -------------------

SORTED_TOOLS = [kimi.deep_sort(WEATHER)]  # the native renderer deep-sorts; the template does not

PLAIN_CHATS = [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello!"}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"},
     {"role": "assistant", "content": "6"}],
    [{"role": "user", "content": "你好 😀 <think> literal"},
     {"role": "assistant", "content": "\n\nleading newlines"}],
    [{"role": "user", "content": [{"type": "text", "text": "part one, "},
                                  {"type": "text", "text": "part two"}]},
     {"role": "assistant", "content": "ok"}],
    [{"role": "user", "content": "prompt only"}],
]


@pytest.mark.parametrize("msgs", PLAIN_CHATS)
@pytest.mark.parametrize("tools", [None, SORTED_TOOLS])
def test_k2_instruct_native_equals_its_real_template(instruct_tok, msgs, tools):
    native = get_renderer("kimi-k2-instruct", instruct_tok)
    template = get_renderer("hf", instruct_tok)
    assert native.render_text(msgs, tools, add_generation_prompt=True) == template.render_text(
        msgs, tools, add_generation_prompt=True)
    assert native.sample(msgs, tools) == template.sample(msgs, tools)
    assert native.sample_all_turns(msgs, tools) == template.sample_all_turns(msgs, tools)


def test_k2_instruct_all_turns_is_prefix_extending(instruct_tok):
    r = get_renderer("kimi-k2-instruct", instruct_tok)
    msgs = PLAIN_CHATS[1]
    s = r.sample_all_turns(msgs)
    assert instruct_tok.decode(s.input_ids) == r.render_text(msgs, add_generation_prompt=False)
    sampled = [instruct_tok.decode([i for i, m in zip(s.input_ids, s.loss_mask, strict=True) if m])]
    assert sampled == ["4<|im_end|>6<|im_end|>"]


def test_k25_all_turns_refused_when_history_drops_reasoning(k25, k25_off):
    msgs = [{"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "a2", "reasoning_content": "r2"}]
    with pytest.raises(NotPrefixExtendingError, match="not prefix-extending"):
        k25.sample_all_turns(msgs)
    s = k25_off.sample_all_turns(msgs)  # thinking off: history renders as it was sampled
    assert sum(s.loss_mask) == len(k25_off.completion_ids(msgs[1])) + len(k25_off.completion_ids(msgs[3]))


def test_arguments_given_as_objects_are_written_as_the_official_template_does(kimi_tokenizer):
    # the official chat_template.jinja (run by the hf renderer) writes non-string arguments
    # with tojson: {"a": 1}; ours must give the same text and ids
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "functions.f:0", "type": "function", "function": {
                    "name": "f", "arguments": {"b": "é", "a": 1, "c": [1, {"d": None}]}}}]},
            {"role": "tool", "tool_call_id": "functions.f:0", "content": "ok"}]
    ours = get_renderer("kimi-k2.5", kimi_tokenizer, thinking=True)
    official = get_renderer("hf", kimi_tokenizer, thinking=True)
    text = ours.render_text(msgs, None, add_generation_prompt=True)
    assert '{"b": "é", "a": 1, "c": [1, {"d": null}]}' in text
    assert text == official.render_text(msgs, None, add_generation_prompt=True)
    assert ours.prompt_ids(msgs) == official.prompt_ids(msgs)
