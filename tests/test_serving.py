"""Serving dialects: how a stack renders history before the template runs."""

from __future__ import annotations

import json
import subprocess
import sys

from specgen.render import get_renderer
from specgen.render.serving import history_as_served

CALL = {"id": "functions.f:0", "type": "function",
        "function": {"name": "f", "arguments": '{"a":1,"b":"é"}'}}
CONV = [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "functions.f:0", "content": "ok"},
        {"role": "assistant", "content": "done",
         "tool_calls": [{**CALL, "id": "functions.f:1"}]}]


def test_vllm_and_sglang_rewrite_history_arguments_transformers_does_not():
    assert history_as_served(CONV, "transformers") is None
    for stack in ("vllm", "sglang"):
        served = history_as_served(CONV, stack)
        # parsed into an object: every renderer writes it as the template's tojson does
        assert served[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1, "b": "é"}
        assert CONV[1]["tool_calls"][0]["function"]["arguments"] == '{"a":1,"b":"é"}'
    plain = [{"role": "user", "content": "hi"}]
    assert history_as_served(plain, "vllm") is None


def test_tokenize_serving_vllm_equals_the_official_template_fed_parsed_arguments(
        tmp_path, models_dir, kimi_tokenizer):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "c", "messages": CONV}) + "\n")
    out = {}
    for stack in ("transformers", "vllm"):
        dst = tmp_path / f"{stack}.jsonl"
        done = subprocess.run([sys.executable, "-m", "specgen", "tokenize", "--tokenizer",
                               str(models_dir / "kimi-k2.5"), "--serving", stack, str(src),
                               "-o", str(dst)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        out[stack] = json.loads(dst.read_text())
    assert out["vllm"]["input_ids"] != out["transformers"]["input_ids"]
    # what vLLM does: parse the history arguments, then the official template (tojson)
    official = get_renderer("hf", kimi_tokenizer, thinking=True)
    parsed = [*CONV[:3]]
    parsed[1] = {**CONV[1], "tool_calls": [{**CALL, "function": {
        "name": "f", "arguments": {"a": 1, "b": "é"}}}]}
    ours = get_renderer("kimi-k2.5", kimi_tokenizer, thinking=True)
    want = official.prompt_ids(parsed) + ours.completion_ids(CONV[3], context=parsed)
    assert out["vllm"]["input_ids"] == want
    refused = subprocess.run([sys.executable, "-m", "specgen", "tokenize", "--tokenizer", "demo",
                              "--serving", "vllm", "--all-turns", str(src), "-o",
                              str(tmp_path / "x.jsonl")], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "--all-turns" in refused.stderr
