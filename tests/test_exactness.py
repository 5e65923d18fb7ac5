"""Exactness residue of issue 24, each against the official Kimi templates (tests/official_kimi.py,
the template rendered with jinja as transformers does, encoded by tiktoken) on the exact inputs:

* integers beyond 64 bits in dataset rows stay integers (tokenize, the sources, the request);
* reasoning under `thinking` is read like `reasoning_content` / `reasoning` by the native
  renderers (K2.5, K2-Thinking);
* a literal end-of-turn string inside an answer: every renderer keeps the text (the `hf` one
  no longer cuts there) and `specgen tokenize` warns.
"""

from __future__ import annotations

import json

import pytest

from official_kimi import OfficialKimi
from specgen import jsonexact
from specgen.commands.tokenize import tokenize_lines
from specgen.render import get_renderer
from specgen.render.base import stray_stop_ids
from test_official_kimi_diff import k25_dir, official_k2_thinking, official_k25, tok  # noqa: F401

BIG = 10**20  # orjson reads it as 1e+20
NEG = -(2**63) - 1  # just below int64: orjson reads a float too
HUGE = 2**70

TOOLS = [{"type": "function", "function": {
    "name": "reserve", "description": "Reserve an id range",
    "parameters": {"type": "object", "properties": {
        "start": {"type": "integer", "default": HUGE},
        "count": {"type": "integer", "default": 3}}, "required": ["start"]}}}]


def big_int_row() -> dict:
    return {"id": "big", "tools": TOOLS, "messages": [
        {"role": "user", "content": "Reserve from 10^20."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "functions.reserve:0", "type": "function",
             "function": {"name": "reserve", "arguments": {"start": BIG, "count": NEG}}}]}]}


# -- (a) integers beyond 64 bits -------------------------------------------------------------

def test_jsonexact_keeps_every_integer() -> None:
    text = json.dumps({"a": BIG, "b": NEG, "c": [HUGE, 1.5, "12345678901234567890123"]})
    assert jsonexact.loads(text) == json.loads(text)
    assert jsonexact.loads(text.encode())["a"] == BIG and type(jsonexact.loads(text)["b"]) is int
    assert json.loads(jsonexact.dumps({"x": HUGE, "y": "é"})) == {"x": HUGE, "y": "é"}
    with pytest.raises(jsonexact.JSONDecodeError):
        jsonexact.loads(b'{"a": 100000000000000000000')


def test_tokenize_keeps_big_integers_like_the_official_template(tok, official_k25) -> None:  # noqa: F811
    row = big_int_row()
    line = json.dumps(row).encode()
    out: list[bytes] = []
    summary = tokenize_lines(get_renderer("kimi-k2.5", tok), [line], out.append)
    assert summary.samples == 1 and summary.invalid == 0
    ids = json.loads(out[0])["input_ids"]
    want = official_k25.ids(row["messages"], row["tools"], add_generation_prompt=False)
    assert ids == want
    text = tok.decode(ids)
    assert str(BIG) in text and str(NEG) in text and str(HUGE) in text
    assert "1e+20" not in text


def test_dataset_rows_and_the_request_keep_big_integers(tmp_path) -> None:
    from specgen.client.chat import _encode
    from specgen.config import DatasetConfig
    from specgen.sources import iter_rows

    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps(big_int_row()) + "\n")
    (row,) = list(iter_rows(DatasetConfig(name="d", path=path, format="openai")))
    assert row.error is None, row.error
    conv = row.conversation
    default = conv.tools[0]["function"]["parameters"]["properties"]["start"]["default"]
    assert default == HUGE and type(default) is int
    args = conv.messages[1]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(args) == {"start": BIG, "count": NEG}
    body = _encode({"messages": conv.messages, "tools": conv.tools})  # what is sent
    assert str(HUGE).encode() in body and json.loads(body)["tools"] == conv.tools
    from specgen.store import pack_json, unpack_json

    assert unpack_json(pack_json(conv.to_json())) == json.loads(json.dumps(conv.to_json()))


# -- (b) reasoning under `thinking` -----------------------------------------------------------

def _with_reasoning(key: str | None) -> list[dict]:
    call = {"id": "functions.reserve:0", "type": "function",
            "function": {"name": "reserve", "arguments": "{\"start\": 1}"}}
    answer = {"role": "assistant", "content": "Reserving.", "tool_calls": [call]}
    if key:
        answer[key] = "The user wants a range; call reserve."
    return [{"role": "user", "content": "Reserve one."}, answer,
            {"role": "tool", "tool_call_id": "functions.reserve:0", "content": "ok"}]


@pytest.mark.parametrize("name", ["kimi-k2.5", "kimi-k2-thinking"])
def test_thinking_key_is_reasoning_in_the_native_renderers(tok, official_k25,  # noqa: F811
                                                           official_k2_thinking, name) -> None:  # noqa: F811
    official: OfficialKimi = official_k25 if name == "kimi-k2.5" else official_k2_thinking
    tools = TOOLS if name == "kimi-k2.5" else None
    native = get_renderer(name, tok)
    without = native.prompt_ids(_with_reasoning(None), tools)
    results = {}
    for key in ("reasoning_content", "reasoning", "thinking"):
        msgs = _with_reasoning(key)
        ours = native.prompt_ids(msgs, tools)  # the history turn keeps its reasoning
        assert ours == official.ids(msgs, tools, add_generation_prompt=True), key
        sample = native.sample(msgs[:2], tools)  # the sampled turn: reasoning masked in
        assert sample.input_ids == official.ids(msgs[:2], tools, add_generation_prompt=False)
        results[key] = (ours, sample.input_ids)
    assert results["thinking"] == results["reasoning_content"] == results["reasoning"]
    assert results["thinking"][0] != without  # the reasoning did not vanish


# -- (c) a literal end-of-turn string inside an answer -----------------------------------------

def test_literal_end_of_turn_is_kept_by_every_renderer(tok, official_k25, k25_dir) -> None:  # noqa: F811
    msgs = [{"role": "user", "content": "Quote the token."},
            {"role": "assistant", "content": "It is written <|im_end|> and then the text goes on."}]
    want = official_k25.ids(msgs, add_generation_prompt=False, thinking=False)
    template = (k25_dir / "chat_template.jinja").read_text(encoding="utf-8")
    hf = get_renderer("hf", tok, template=template, chat_template_kwargs={"thinking": False})
    native = get_renderer("kimi-k2.5", tok, thinking=False)
    for r in (hf, native):
        sample = r.sample(msgs)
        assert sample.input_ids == want, type(r).__name__
        assert tok.decode(sample.input_ids).endswith("then the text goes on.<|im_end|>")
        assert len(stray_stop_ids(sample, r.stop_token_ids)) == 1
        warned: list[str] = []
        summary = tokenize_lines(r, [json.dumps({"messages": msgs}).encode()], lambda b: None,
                                 report=warned.append, source="x.jsonl")
        assert summary.samples == 1 and summary.stray_stops == 1
        assert len(warned) == 1 and "x.jsonl:1" in warned[0] and "end-of-turn" in warned[0]


def test_hf_cut_drops_only_what_the_template_writes_after_its_stop(tok) -> None:  # noqa: F811
    """A ChatML-like template writes "\\n" after each `<|im_end|>`: the sample ends at the
    template's own stop (the "\\n" was never sampled), after the literal one in the text."""
    template = ("{% for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>"
                "{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}")
    hf = get_renderer("hf", tok, template=template, chat_template_kwargs={})
    content = "a <|im_end|> b"
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": content}]
    sample = hf.sample(msgs)
    assert tok.decode(sample.input_ids[sample.n_prompt:]) == content + "<|im_end|>"
    plain = hf.sample([msgs[0], {"role": "assistant", "content": "a b"}])
    assert tok.decode(plain.input_ids[plain.n_prompt:]) == "a b<|im_end|>"
    assert not stray_stop_ids(plain, hf.stop_token_ids)


# -- (d) a long run that reaches special-token text --------------------------------------------

def split_special_ids(official: OfficialKimi, text: str) -> list[int]:
    """transformers' tokenize() of the Kimi tokenizer (what `tokenizer(text,
    add_special_tokens=False)` and apply_chat_template run, and so vLLM and SGLang): the added
    tokens split off first (leftmost, then longest), the tokenizer's own encode on each text
    between them."""
    return official.encode_sampled(text)


def test_long_run_into_special_text_whole_and_split_special(tok, official_k25) -> None:  # noqa: F811
    """A >25,000-character run right before `<|im_end|>`: the whole-string encode cuts inside
    the special token's text (it becomes plain pieces); split_special keeps the token.
    `[target] encode` picks either for the prompt, each equal to its reference on the exact
    text; the completion is encoded as sampled in both."""
    head = official_k25.render([{"role": "user", "content": ""}], add_generation_prompt=True)
    n = 25_000 - head.index("<|im_end|>") - 4  # the 25,001st character: inside <|im_end|>
    msgs = [{"role": "user", "content": "x" * n},
            {"role": "assistant", "content": "y" * 25_010}]
    prompt_text = official_k25.render(msgs[:1], add_generation_prompt=True)
    full_text = official_k25.render(msgs, add_generation_prompt=False)
    whole_want = official_k25.encode(prompt_text)
    split_want = split_special_ids(official_k25, prompt_text)
    im_end = tok.special_tokens["<|im_end|>"]
    assert im_end in split_want and im_end not in whole_want  # the cut broke the token
    # The completion is what the model sampled after the prompt: in either mode its ids are
    # the completion text encoded on its own, special tokens split off (docs/renderers.md).
    assert full_text.startswith(prompt_text)
    sampled = split_special_ids(official_k25, full_text[len(prompt_text):])
    assert sampled[-1] == im_end
    for mode, want in (("whole", whole_want), ("split_special", split_want)):
        native = get_renderer("kimi-k2.5", tok.with_encode(mode))
        assert native.prompt_ids(msgs[:1]) == want, mode
        assert native.sample(msgs).input_ids == want + sampled, mode
    assert tok.with_encode("whole") is tok and tok.encode_mode == "whole"


def test_encode_key_in_the_config_and_tokenize(tmp_path, k25_dir) -> None:  # noqa: F811
    import tomllib

    from specgen.config import ConfigError, parse_config
    from specgen.tokenizer import load_tokenizer

    (tmp_path / "d.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    text = ('run_dir = "r"\n[target]\nmodel = "moonshotai/kimi-k2.5"\ntokenizer = "demo"\n{}'
            '[endpoint]\nbase_url = "http://h/v1"\n[[dataset]]\nname = "d"\npath = "d.jsonl"\n')
    load = lambda extra: parse_config(tomllib.loads(text.format(extra)), tmp_path / "r.toml")  # noqa: E731
    whole, split = load(""), load('encode = "split_special"\n')
    assert whole.target.encode == "whole" and split.target.encode == "split_special"
    assert load('encode = "whole"\n').global_result_hash() == whole.global_result_hash()
    assert split.global_result_hash() != whole.global_result_hash()
    with pytest.raises(ConfigError, match="split_special"):
        load('encode = "split"\n')
    assert load_tokenizer(k25_dir, "split_special").encode_mode == "split_special"


def test_specgen_run_keeps_big_integers_end_to_end(tmp_path, k25_dir, official_k25) -> None:  # noqa: F811
    """`specgen run` (a process, the simulator) on rows whose tool schema default and tool-call
    arguments hold integers beyond 64 bits: the request stored is the data, and the prompt ids
    of every sample are the official template's on it."""
    from specgen.store import unpack_ids, unpack_json
    from test_engine_support import WEATHER_TOOL, count, run_cli, write_config, write_jsonl

    tool = json.loads(json.dumps(WEATHER_TOOL))
    tool["function"]["parameters"]["properties"]["n"] = {"type": "integer", "default": HUGE}
    rows = [{"id": f"b{i}", "tools": [tool], "messages": [
        {"role": "user", "content": f"Weather in city {i}, n = {BIG}?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "functions.get_weather:0", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": f"c{i}", "n": BIG}}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"}]} for i in range(3)]
    write_jsonl(tmp_path / "a.jsonl", rows)
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}])
    path.write_text(path.read_text().replace('tokenizer = "demo"',
                                             f"tokenizer = {json.dumps(str(k25_dir))}"))
    out = run_cli(path)
    assert out.returncode == 0, out.stderr[-2000:]
    run_dir = tmp_path / "run-dir"
    assert count(run_dir, "SELECT COUNT(*) FROM results") == 3
    import sqlite3

    conn = sqlite3.connect(run_dir / "state.sqlite")
    for blob, ids, n_prompt in conn.execute("SELECT request, input_ids, n_prompt FROM results"):
        request = unpack_json(blob)
        default = request["tools"][0]["function"]["parameters"]["properties"]["n"]["default"]
        assert default == HUGE and type(default) is int
        args = request["messages"][1]["tool_calls"][0]["function"]["arguments"]
        assert json.loads(args)["n"] == BIG
        want = official_k25.ids(request["messages"], request["tools"], add_generation_prompt=True)
        assert list(unpack_ids(ids))[:n_prompt] == want
