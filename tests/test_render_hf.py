"""The `hf` renderer: the real DeepSeek-V3 tokenizer with chat templates written for these tests.

Tokenizer dirs are built in a temp dir from deepseek-v3's tokenizer.json (plus added ChatML /
Llama-3 control tokens where a template needs them) and a `chat_template.jinja`.
"""

from __future__ import annotations

import json

import pytest

from conftest import model_path
from specgen.conversation import AssistantMessage, ToolCall
from specgen.render import NotPrefixExtendingError, RenderError, get_renderer
from specgen.render.hf import HFRenderer
from specgen.tokenizer import load_tokenizer

# A Qwen-style ChatML template: system + tools block, <think> reasoning, Hermes tool calls.
CHATML = """
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools><|im_end|>\\n' }}
{%- elif messages and messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
  {%- if message.role == 'system' and loop.first %}{% continue %}{% endif %}
  {%- if message.role in ['user', 'system'] %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
  {%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
    {%- if message.reasoning_content %}
{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}
    {%- elif ALWAYS_THINK_BLOCK and loop.last %}
{{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{{- message.content or '' }}
    {%- for tc in message.tool_calls or [] %}
{{- '\\n<tool_call>\\n{"name": "' + tc.function.name + '", "arguments": ' + (tc.function.arguments | tojson) + '}\\n</tool_call>' }}
    {%- endfor %}
{{- '<|im_end|>\\n' }}
  {%- elif message.role == 'tool' %}
{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
  {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""

# A Llama-3-style template: bos, header tokens, trimmed content, <|eot_id|>, role alternation.
LLAMA = """
{{- bos_token }}
{%- for message in messages %}
  {%- if message.role == 'assistant' and loop.index0 > 0 and messages[loop.index0 - 1].role == 'assistant' %}
    {{- raise_exception('Conversation roles must alternate user/assistant') }}
  {%- endif %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

# A DeepSeek-R1-style template on DeepSeek's own tokens: the prompt opens <think>.
DEEPSEEK = """
{{- bos_token }}
{%- for m in messages %}
  {%- if m.role == 'user' %}{{ '<｜User｜>' + m.content }}
  {%- elif m.role == 'assistant' %}{{ '<｜Assistant｜><think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' + m.content + '<｜end▁of▁sentence｜>' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}
"""


def make_dir(root, template, *, special=(), added=(), config=None):
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(model_path("deepseek-v3") / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    root.mkdir()
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(config or {}))
    (root / "chat_template.jinja").write_text(template)
    return load_tokenizer(root)


@pytest.fixture(scope="module")
def chatml_tok(tmp_path_factory):
    return make_dir(tmp_path_factory.mktemp("t") / "chatml", CHATML.replace("ALWAYS_THINK_BLOCK", "false"),
                    special=["<|im_start|>", "<|im_end|>"], added=["<tool_call>", "</tool_call>"],
                    config={"eos_token": "<|im_end|>"})


@pytest.fixture(scope="module")
def llama_tok(tmp_path_factory):
    return make_dir(tmp_path_factory.mktemp("t") / "llama", LLAMA,
                    special=["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                    config={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})


@pytest.fixture(scope="module")
def deepseek_tok(tmp_path_factory):
    cfg = json.loads((model_path("deepseek-v3") / "tokenizer_config.json").read_text())
    return make_dir(tmp_path_factory.mktemp("t") / "ds", DEEPSEEK, config=cfg)


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather (météo)",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def test_chatml_sample_masks_exactly_the_sampled_part(chatml_tok):
    r = get_renderer("hf", chatml_tok)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"}]
    s = r.sample(msgs)
    prompt = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
              "<|im_start|>assistant\n")
    assert chatml_tok.decode(s.input_ids[:s.n_prompt]) == prompt
    # the "\n" the template writes after <|im_end|> is not sampled
    assert chatml_tok.decode(s.input_ids[s.n_prompt:]) == "<think>\ngreet\n</think>\n\nHello!<|im_end|>"
    assert s.input_ids[-1] == chatml_tok.token_id("<|im_end|>")
    assert s.input_ids[:s.n_prompt] == r.prompt_ids(msgs[:-1])
    assert r.parse_completion(s.input_ids[s.n_prompt:]) == AssistantMessage(content="Hello!", reasoning="greet")
    assert chatml_tok.token_id("<|im_end|>") in r.stop_token_ids


def test_chatml_tools_and_tool_calls(chatml_tok):
    r = get_renderer("hf", chatml_tok, parse_tool_arguments=True)
    msgs = [{"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": "", "reasoning": "use the tool", "tool_calls": [CALL]}]
    text = r.render_text(msgs, TOOLS, add_generation_prompt=False)
    assert '\n{"type": "function", "function": {"name": "get_weather", "description": "Weather (météo)"' in text
    s = r.sample(msgs, TOOLS)
    completion = chatml_tok.decode(s.input_ids[s.n_prompt:])
    # `reasoning` is handed to the template as reasoning_content; arguments parsed, then tojson'd
    assert completion == ('<think>\nuse the tool\n</think>\n\n\n<tool_call>\n{"name": "get_weather", '
                          '"arguments": {"city": "Paris"}}\n</tool_call><|im_end|>')
    assert r.parse_completion(s.input_ids[s.n_prompt:]) == AssistantMessage(
        content="", reasoning="use the tool",
        tool_calls=(ToolCall(id="", name="get_weather", arguments='{"city": "Paris"}'),))
    # the default is transformers': the arguments string as given (the template tojson's it)
    raw = HFRenderer(chatml_tok)
    assert '"arguments": "{\\"city\\": \\"Paris\\"}"' in raw.render_text(msgs, TOOLS, add_generation_prompt=False)


def test_prompt_that_is_not_a_prefix_raises_a_clear_error(chatml_tok):
    # this template's thinking-off prompt adds an empty think block its assistant render lacks
    r = get_renderer("hf", chatml_tok, thinking=False)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]
    with pytest.raises(RenderError, match="not a prefix.*differ at character"):
        r.sample(msgs)
    assert r.sample(msgs[:1]).input_ids == r.prompt_ids(msgs[:1])  # prompt-only still works


def test_thinking_flag_reaches_the_template(tmp_path):
    tok = make_dir(tmp_path / "q3", CHATML.replace("ALWAYS_THINK_BLOCK", "true"),
                   special=["<|im_start|>", "<|im_end|>"], config={"eos_token": "<|im_end|>"})
    r = get_renderer("hf", tok, thinking=False)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]
    s = r.sample(msgs)
    assert tok.decode(s.input_ids[:s.n_prompt]).endswith("assistant\n<think>\n\n</think>\n\n")
    assert tok.decode(s.input_ids[s.n_prompt:]) == "Hello!<|im_end|>"


def test_chatml_all_turns_and_its_refusal(chatml_tok):
    r = get_renderer("hf", chatml_tok)
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    s = r.sample_all_turns(msgs)
    assert chatml_tok.decode(s.input_ids) == r.render_text(msgs, add_generation_prompt=False)[:-1]
    masked = chatml_tok.decode([i for i, m in zip(s.input_ids, s.loss_mask, strict=True) if m])
    assert masked == "b<|im_end|>d<|im_end|>"
    with_reasoning = [msgs[0], {**msgs[1], "reasoning_content": "r"}, *msgs[2:]]
    s = r.sample_all_turns(with_reasoning)  # this template keeps reasoning in history
    assert "<think>\nr\n</think>" in chatml_tok.decode(s.input_ids)


def test_llama_style_bos_trim_and_eot(llama_tok):
    r = get_renderer("hf", llama_tok)
    msgs = [{"role": "user", "content": "  hi  "}, {"role": "assistant", "content": " Hello! "}]
    s = r.sample(msgs)
    assert s.input_ids[0] == llama_tok.token_id("<|begin_of_text|>")
    assert llama_tok.decode(s.input_ids[:s.n_prompt]) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert llama_tok.decode(s.input_ids[s.n_prompt:]) == "Hello!<|eot_id|>"
    assert r.parse_completion(s.input_ids[s.n_prompt:]) == AssistantMessage(content="Hello!")
    # each turn's prompt extends the previous one: the all-turns form is accepted
    more = [*msgs, {"role": "user", "content": "again"}, {"role": "assistant", "content": "Hi again"}]
    assert sum(r.sample_all_turns(more).loss_mask) == len(r.completion_ids(more[1], context=more[:1])) + len(
        r.completion_ids(more[3], context=more[:3]))


def test_raise_exception_becomes_a_render_error(llama_tok):
    r = get_renderer("hf", llama_tok)
    bad = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"},
           {"role": "assistant", "content": "b"}]
    with pytest.raises(RenderError, match="roles must alternate"):
        r.sample(bad)


def test_deepseek_prompt_opens_think_and_parser_reads_reasoning(deepseek_tok):
    r = get_renderer("hf", deepseek_tok)
    msgs = [{"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "2", "reasoning_content": "easy: 1+1=2"}]
    s = r.sample(msgs)
    assert s.input_ids[:s.n_prompt][-2:] == [deepseek_tok.token_id("<think>"), deepseek_tok.encode("\n")[0]]
    assert deepseek_tok.decode(s.input_ids[s.n_prompt:]) == "easy: 1+1=2\n</think>\n\n2<｜end▁of▁sentence｜>"
    assert r.parse_completion(s.input_ids[s.n_prompt:]) == AssistantMessage(content="2", reasoning="easy: 1+1=2")
    assert deepseek_tok.token_id("<｜end▁of▁sentence｜>") in r.stop_token_ids
    # completion_text without context renders after one empty user message
    assert r.completion_text(msgs[1]) == "easy: 1+1=2\n</think>\n\n2<｜end▁of▁sentence｜>"


def test_sandbox_blocks_mutation_and_internals(deepseek_tok):
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(RenderError, match="chat template raised"):
        HFRenderer(deepseek_tok, template="{{ messages.append(1) }}").render_text(
            msgs, add_generation_prompt=True)
    internals = HFRenderer(deepseek_tok, template="[{{ 'x'.__class__ }}]")
    assert internals.render_text(msgs, add_generation_prompt=True) == "[]"
    with pytest.raises(RenderError, match="chat template"):
        HFRenderer(deepseek_tok, template="{{ messages[0].content.nope() }}").render_text(
            msgs, add_generation_prompt=True)


def test_hf_environment_helpers(deepseek_tok):
    t = ("{{ tools | tojson }}|{{ tools | tojson(indent=1, sort_keys=true) }}|"
         "{{ strftime_now('%Y') | length }}|{% generation %}G{% endgeneration %}|"
         "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.content }}"
         "{% break %}{% endfor %}|{{ thinking }}{{ enable_thinking }}|{{ eos_token }}")
    r = HFRenderer(deepseek_tok, template=t, thinking=False)
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"}]
    out = r.render_text(msgs, [{"b": "é", "a": 1}], add_generation_prompt=True)
    assert out == '[{"b": "é", "a": 1}]|[\n {\n  "a": 1,\n  "b": "é"\n }\n]|4|G|b|FalseFalse|<｜end▁of▁sentence｜>'


def test_missing_template_and_syntax_errors(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "tokenizer.json").symlink_to(model_path("deepseek-v3") / "tokenizer.json")
    tok = load_tokenizer(tmp_path / "t")
    with pytest.raises(RenderError, match="no chat template"):
        get_renderer("hf", tok)
    with pytest.raises(RenderError, match="does not compile"):
        HFRenderer(tok, template="{% for %}")


def test_no_stop_token_in_completion_keeps_the_rest(deepseek_tok):
    r = HFRenderer(deepseek_tok, template="{% for m in messages %}[{{ m.content }}]{% endfor %}")
    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    s = r.sample(msgs)
    assert deepseek_tok.decode(s.input_ids[s.n_prompt:]) == "[a]"


def test_all_turns_refused_for_templates_that_rewrite_history(deepseek_tok):
    t = ("{% for m in messages %}{% if m.role == 'user' %}U:{{ m.content }}{% else %}"
         "A:{{ m.content if loop.last else '[hidden]' }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}A:{% endif %}")
    r = HFRenderer(deepseek_tok, template=t)
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
            {"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}]
    assert deepseek_tok.decode(r.sample(msgs).input_ids) == "U:qA:[hidden]<｜end▁of▁sentence｜>U:q2A:b<｜end▁of▁sentence｜>"
    with pytest.raises(NotPrefixExtendingError, match="assistant turn at message 3 .* message 1"):
        r.sample_all_turns(msgs)
