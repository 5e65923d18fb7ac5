"""The sampled forms of a Kimi tool-call / reasoning answer (issue 32 point 1).

The stacks' Kimi parsers (vLLM KimiK2ToolParser / KimiK2ReasoningParser, SGLang
KimiK2Detector) never require `<|tool_calls_section_end|>` and end reasoning at
`<|tool_calls_section_begin|>` when `</think>` is missing, so the same API answer can come from
several sampled id sequences (docs/renderers.md, "What the model samples"). The renderer lists
them (`completion_variants`) and parses each back from ids.
"""

from __future__ import annotations

import pytest

from specgen.render import get_renderer

SECTION_END, END_THINK, IM_END = 163596, 163607, 163586

CALL = {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.fixture(scope="module")
def tok(kimi_tokenizer):
    return kimi_tokenizer


@pytest.mark.parametrize("name", ["kimi-k2.5", "kimi-k2-thinking", "kimi-k2-instruct"])
def test_a_tool_call_answer_has_a_form_without_the_section_end(tok, name):
    r = get_renderer(name, tok)
    msg = {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]}
    ids = r.completion_variant_ids(msg)
    assert ids["canonical"] == r.completion_ids(msg)
    assert ids["canonical"][-2:] == [SECTION_END, IM_END]
    assert ids["no_section_end"] == ids["canonical"][:-2] + [IM_END]
    for form in ids.values():  # every form parses back to the same message
        assert r.parse_completion(form) == r.parse_completion(ids["canonical"])


@pytest.mark.parametrize("name", ["kimi-k2.5", "kimi-k2-thinking"])
def test_reasoning_into_tool_calls_has_forms_without_end_think(tok, name):
    r = get_renderer(name, tok, thinking=True)
    msg = {"role": "assistant", "content": "", "reasoning_content": "Need the weather.",
           "tool_calls": [CALL]}
    ids = r.completion_variant_ids(msg)
    assert set(ids) == {"canonical", "no_section_end", "no_think_end",
                        "no_think_end+no_section_end"}
    assert END_THINK in ids["canonical"] and END_THINK not in ids["no_think_end"]
    assert len(ids["no_think_end"]) == len(ids["canonical"]) - 1
    assert len(ids["no_think_end+no_section_end"]) == len(ids["canonical"]) - 2
    want = r.parse_completion(ids["canonical"])
    assert want.reasoning == "Need the weather." and want.tool_calls[0].name == "get_weather"
    for form in ids.values():
        assert r.parse_completion(form) == want


def test_plain_answers_and_answers_with_content_have_one_form(tok):
    r = get_renderer("kimi-k2.5", tok, thinking=True)
    assert list(r.completion_variants({"role": "assistant", "content": "hi",
                                       "reasoning_content": "r"})) == ["canonical"]
    # With content before the calls, a missing </think> would have put that content in the
    # reasoning field: the API answer shows </think> was sampled.
    forms = r.completion_variants({"role": "assistant", "content": "Checking.",
                                   "reasoning_content": "r", "tool_calls": [CALL]})
    assert list(forms) == ["canonical", "no_section_end"]
    off = get_renderer("kimi-k2.5", tok, thinking=False)
    assert list(off.completion_variants({"role": "assistant", "content": "",
                                         "tool_calls": [CALL]})) == ["canonical",
                                                                     "no_section_end"]


def test_other_renderers_have_one_form(tok):
    from specgen.render.hf import HFRenderer  # noqa: F401 - the base rule, through `hf`
    r = get_renderer("hf", tok, template="{% for m in messages %}{{ m['content'] }}<|im_end|>"
                     "{% endfor %}")
    msg = {"role": "assistant", "content": "hi"}
    assert r.completion_variant_ids(msg) == {"canonical": r.completion_ids(msg)}
