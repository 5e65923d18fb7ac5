"""Invariants every renderer must keep, checked on generated conversations (hypothesis).

For each renderer: decoding a sample's ids gives exactly the rendered text; the prompt part is
the generation-prompt render; BPE never merges across a special token and the text between two
special tokens is encoded as one piece (so template-joined pieces like
`## Return of {id}\\n{content}` are one piece); parsing the sampled ids gives the message back;
prefix-extending formats have each turn's prompt as a prefix of the next.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specgen.conversation import AssistantMessage
from specgen.render import get_renderer
from specgen.render.hf import HFRenderer

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)

STRUCTURAL = ["<|im_end|>", "<think>", "</think>", "<|tool_calls_section_begin|>",
              "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
              "<|tool_call_end|>", "[EOS]"]
OTHER_SPECIAL = ["<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "[BOS]",
                 "<|media_pad|>", "<|start_header_id|>"]
WORDS = ["hello", "world", " the", "Paris", "weather", "42", "3.14", "json", "naïve", "Ünïcödé"]

piece = st.one_of(
    st.sampled_from(WORDS),
    st.text(st.characters(exclude_categories=["Cs"], max_codepoint=0x1FAFF), max_size=12),
    st.sampled_from(["你好", "世界", "天气怎么样", "😀", "🎉👍🏽", "☀️", "ä", "ß"]),
    st.sampled_from([" ", "  ", "\n", "\n\n", "\t", "\r\n", " \n "]),
)


def text_with(specials):
    return st.lists(st.one_of(piece, st.sampled_from(specials)) if specials else piece,
                    max_size=8).map("".join)


any_text = text_with(STRUCTURAL + OTHER_SPECIAL)  # user/system/tool text: anything goes
answer_text = text_with(OTHER_SPECIAL)  # what an assistant writes: no structural markers

names = st.sampled_from(["get_weather", "search", "run_code", "f"])
arguments = st.dictionaries(st.sampled_from(["city", "q", "n", "flag"]),
                            st.one_of(st.integers(-5, 99), st.booleans(), st.sampled_from(WORDS)),
                            max_size=3).flatmap(
    lambda d: st.sampled_from([(", ", ": "), (",", ":")]).map(
        lambda sep: json.dumps(d, separators=sep, ensure_ascii=False)))

TOOLS = [{"type": "function", "function": {
    "name": n, "description": f"Tool {n}.", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "n": {"type": "integer", "default": 1}}, "required": ["city"]}}}
    for n in ("get_weather", "search")]


@st.composite
def conversations(draw, *, tool_calls_last=True, names_on_assistant=True):
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(any_text)})
    k = 0
    for _ in range(draw(st.integers(1, 3))):
        user = {"role": "user", "content": draw(any_text)}
        if draw(st.integers(0, 5)) == 0:
            user["name"] = draw(st.sampled_from(["alice", "bob"]))
        if draw(st.integers(0, 5)) == 0:
            user["content"] = [{"type": "text", "text": user["content"]},
                               {"type": "image_url", "image_url": {"url": "data:,"}}]
        msgs.append(user)
        for _ in range(draw(st.integers(0, 2))):  # a tool loop
            calls = []
            for _ in range(draw(st.integers(1, 2))):
                name = draw(names)
                calls.append({"id": f"functions.{name}:{k}", "type": "function",
                              "function": {"name": name, "arguments": draw(arguments)}})
                k += 1
            msgs.append({"role": "assistant", "content": draw(answer_text), "tool_calls": calls,
                         "reasoning_content": draw(answer_text)})
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "content": draw(any_text)})
        final = {"role": "assistant", "content": draw(answer_text)}
        if draw(st.booleans()):
            final["reasoning_content"] = draw(answer_text)
        if names_on_assistant and draw(st.integers(0, 5)) == 0:
            final["name"] = "bot"
        msgs.append(final)
    if tool_calls_last and draw(st.booleans()):
        name = draw(names)
        msgs.append({"role": "user", "content": draw(any_text)})
        msgs.append({"role": "assistant", "content": draw(answer_text), "reasoning_content": draw(answer_text),
                     "tool_calls": [{"id": f"functions.{name}:{k}", "type": "function",
                                     "function": {"name": name, "arguments": draw(arguments)}}]})
    elif draw(st.integers(0, 3)) == 0:
        msgs.append({"role": "user", "content": draw(any_text)})  # prompt-only sample
    tools = draw(st.sampled_from([None, TOOLS]))
    return msgs, tools


# A ChatML-like template over the Kimi control tokens, with a "\n" after each <|im_end|> that the
# model does not sample, so the hf stop-token cut is exercised.
HF_TEMPLATE = """
{%- if tools %}<|im_system|>tools<|im_middle|>{{ tools | tojson }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- set c = m.content if m.content is string else (m.content | map(attribute='text') | map('default', '') | join('')) %}
{%- if m.role == 'assistant' %}<|im_assistant|>assistant<|im_middle|><think>{{ m.reasoning_content or '' }}</think>{{ c }}
{%- for tc in m.tool_calls or [] %}[{{ tc.function.name }} {{ tc.function.arguments | tojson }}]{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_system|>tool<|im_middle|>{{ m.tool_call_id }}: {{ c }}<|im_end|>
{% else %}<|im_user|>{{ m.role }}<|im_middle|>{{ c }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}
"""

NATIVE = [("kimi-k2.5", True), ("kimi-k2.5", False), ("kimi-k2-thinking", True), ("kimi-k2-instruct", True)]
PREFIX_EXTENDING = {("kimi-k2.5", False), ("kimi-k2-instruct", True), ("hf", True)}


def make(name, thinking, tok):
    if name == "hf":
        return HFRenderer(tok, thinking=thinking, template=HF_TEMPLATE)
    return get_renderer(name, tok, thinking=thinking)


def check_no_merge_across_specials(tok, text, ids):
    """ids == the text split at special-token text, each plain segment encoded on its own."""
    specials = sorted(tok.special_tokens, key=len, reverse=True)
    expected, pos, seg_start = [], 0, 0
    while pos < len(text):
        hit = next((s for s in specials if text.startswith(s, pos)), None) if text[pos] in "<[" else None
        if hit is None:
            pos += 1
            continue
        expected += tok.encode_ordinary(text[seg_start:pos]) + [tok.special_tokens[hit]]
        pos = seg_start = pos + len(hit)
    expected += tok.encode_ordinary(text[seg_start:])
    assert ids == expected


def normal(m: AssistantMessage, renderer) -> AssistantMessage:
    """What the format can carry back: reasoning only where the model samples it."""
    keeps = getattr(renderer, "has_thinking", True) and renderer.thinking
    reasoning = (m.reasoning or "") if keeps else None
    if renderer.name == "hf":
        reasoning = (m.reasoning or "").strip("\n")
        return AssistantMessage(content=m.content.lstrip("\n"), reasoning=reasoning)
    return AssistantMessage(content=m.content, reasoning=reasoning, tool_calls=m.tool_calls)


def check_invariants(renderer, msgs, tools):
    tok = renderer.tokenizer
    s = renderer.sample(msgs, tools)
    last_is_assistant = msgs[-1]["role"] == "assistant"
    context = msgs[:-1] if last_is_assistant else msgs
    prompt_text = renderer.render_text(context, tools, add_generation_prompt=True)
    prompt = s.input_ids[:s.n_prompt]
    # the prompt part is what the generation-prompt render gives, mask 0 on it, 1 after
    assert prompt == renderer.prompt_ids(context, tools) == tok.encode(prompt_text)
    assert s.loss_mask == [0] * s.n_prompt + [1] * (len(s.input_ids) - s.n_prompt)
    completion = s.input_ids[s.n_prompt:]
    if last_is_assistant:
        text = renderer.completion_text(msgs[-1], context=context, tools=tools)
        assert completion == tok.encode(text) and completion
        assert completion[-1] in renderer.stop_token_ids
        parsed = renderer.parse_completion(completion)
        assert normal(parsed, renderer) == normal(AssistantMessage.from_openai(msgs[-1]), renderer)
    else:
        text = ""
        assert completion == []
    # decoding gives exactly the rendered text; no merge across special tokens
    assert tok.decode(s.input_ids) == prompt_text + text
    check_no_merge_across_specials(tok, prompt_text, prompt)
    check_no_merge_across_specials(tok, text, completion)


@pytest.mark.parametrize(("name", "thinking"), [*NATIVE, ("hf", True)])
@SETTINGS
@given(data=st.data())
def test_invariants_demo_tokenizer(demo_tokenizer, name, thinking, data):
    renderer = make(name, thinking, demo_tokenizer)
    msgs, tools = data.draw(conversations(tool_calls_last=name != "hf"))
    check_invariants(renderer, msgs, tools)


@pytest.mark.parametrize(("name", "thinking"), [("kimi-k2.5", True), ("kimi-k2.5", False)])
@settings(SETTINGS, max_examples=15)
@given(data=st.data())
def test_invariants_real_kimi_tokenizer(kimi_tokenizer, name, thinking, data):
    msgs, tools = data.draw(conversations())
    check_invariants(get_renderer(name, kimi_tokenizer, thinking=thinking), msgs, tools)


@pytest.mark.parametrize(("name", "thinking"), sorted(PREFIX_EXTENDING))
@SETTINGS
@given(data=st.data())
def test_prefix_extension(demo_tokenizer, name, thinking, data):
    renderer = make(name, thinking, demo_tokenizer)
    msgs, tools = data.draw(conversations(names_on_assistant=False))
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    prompts = [renderer.prompt_ids(msgs[:i], tools) for i in turns]
    for (i, a), b in zip(zip(turns, prompts, strict=True), prompts[1:], strict=False):
        done = a + renderer.completion_ids(msgs[i], context=msgs[:i], tools=tools)
        assert b[:len(done)] == done
    s = renderer.sample_all_turns(msgs, tools)
    masked = sum(len(renderer.completion_ids(msgs[i], context=msgs[:i], tools=tools)) for i in turns)
    assert sum(s.loss_mask) == masked
    if turns:
        last = turns[-1]
        full = renderer.sample(msgs[:last + 1], tools)
        assert s.input_ids == full.input_ids  # the last forward pass holds every turn


def test_tool_result_is_one_piece_in_every_kimi_renderer(demo_tokenizer):
    msgs = [{"role": "user", "content": "x"},
            {"role": "tool", "tool_call_id": "functions.f:0", "content": "\n\n  result"}]
    body = demo_tokenizer.encode("## Return of functions.f:0\n\n\n  result")
    for name, thinking in NATIVE:
        ids = make(name, thinking, demo_tokenizer).prompt_ids(msgs)
        header = max(i for i, t in enumerate(ids) if t == demo_tokenizer.token_id("<|im_system|>"))
        k = ids.index(demo_tokenizer.token_id("<|im_middle|>"), header)
        assert ids[k + 1:k + 1 + len(body)] == body, name
