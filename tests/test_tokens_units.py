"""Token-in mode, piece by piece: the request bodies, the answer parsers of both engine shapes,
the stop-id rule, the normaliser of sampled ids and the local-engine default."""

from __future__ import annotations

import orjson
import pytest

from specgen.client.tokens import parse_token_completion
from specgen.client.types import ApiError
from specgen.config import ConfigError, parse_config
from specgen.conversation import AssistantMessage, ToolCall
from specgen.normalize import Quarantined, normalize_ids
from specgen.render import get_renderer
from specgen.request import build_token_request, is_local_url, local_engines, with_max_tokens
from test_request import FIX

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def config(tmp_path, **endpoint):
    raw = {
        "run_dir": "run",
        "target": {"model": "moonshotai/kimi-k2.5", "tokenizer": "demo"},
        "endpoint": {"base_url": "http://127.0.0.1:8000/v1", "mode": "tokens", **endpoint},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "max_tokens": 4000, "seed": 7},
        "dataset": [{"name": "plain", "path": str(FIX / "prompt.json"), "max_tokens": 900}],
    }
    return parse_config(raw, tmp_path / "run.toml")


@pytest.fixture
def renderer(demo_tokenizer):
    return get_renderer("kimi-k2.5", demo_tokenizer, thinking=True)


def test_vllm_body_sends_our_ids_and_keeps_the_stop_id(tmp_path):
    cfg = config(tmp_path)
    body = build_token_request(cfg, cfg.datasets[0], [5, 6, 7], {9, 3})
    assert body["prompt"] == [5, 6, 7] and body["model"] == "moonshotai/kimi-k2.5"
    assert body["max_tokens"] == 900 and body["temperature"] == 0.6 and body["seed"] == 7
    assert body["stop_token_ids"] == [3, 9]
    assert body["include_stop_str_in_output"] is True and body["return_token_ids"] is True
    assert body["skip_special_tokens"] is False
    assert "messages" not in body and "chat_template_kwargs" not in body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert with_max_tokens(body, 10)["max_tokens"] == 10 and body["max_tokens"] == 900


def test_sglang_body_uses_input_ids_and_sampling_params(tmp_path):
    cfg = config(tmp_path, token_api="sglang")
    body = build_token_request(cfg, cfg.datasets[0], [5, 6], {9})
    assert body["input_ids"] == [5, 6] and body["stream"] is False
    sp = body["sampling_params"]
    assert sp["max_new_tokens"] == 900 and sp["stop_token_ids"] == [9]
    assert sp["temperature"] == 0.6 and sp["sampling_seed"] == 7 and "seed" not in sp
    shrunk = with_max_tokens(body, 11)
    assert shrunk["sampling_params"]["max_new_tokens"] == 11 and sp["max_new_tokens"] == 900


def test_tokens_mode_is_refused_for_openrouter(tmp_path):
    with pytest.raises(ConfigError, match="only local engines"):
        config(tmp_path, base_url="https://openrouter.ai/api/v1")
    with pytest.raises(ConfigError, match="mode"):
        config(tmp_path, mode="text")


@pytest.mark.parametrize("url, local", [
    ("http://127.0.0.1:8000/v1", True), ("http://localhost:30000", True),
    ("http://10.1.2.3/v1", True), ("http://192.168.0.5:8000/v1", True),
    ("http://vllm-0:8000/v1", True), ("http://gpu.svc.cluster.local/v1", True),
    ("http://[::1]:8000/v1", True), ("https://api.together.xyz/v1", False),
    ("https://openrouter.ai/api/v1", False), ("http://8.8.8.8/v1", False), ("sim", False)])
def test_local_urls(url, local):
    assert is_local_url(url) is local


def test_local_engines_needs_every_url_local():
    assert local_engines(["http://127.0.0.1:1/v1", "http://10.0.0.2:1/v1"])
    assert not local_engines(["http://127.0.0.1:1/v1", "https://api.example.com/v1"])
    assert not local_engines([])


def vllm_body(ids, finish="stop", stop_reason=None, **extra):
    return orjson.dumps({"id": "cmpl-1", "object": "text_completion", "model": "m",
                         "choices": [{"index": 0, "text": "x", "finish_reason": finish,
                                      "stop_reason": stop_reason, "token_ids": ids}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 4}, **extra})


def test_vllm_answer_parsed_and_a_missing_stop_id_put_back():
    resp = parse_token_completion(vllm_body([1, 2, 9], stop_reason=9,
                                            prompt_token_ids=[4, 5, 6]), "vllm")
    assert resp.completion_token_ids == [1, 2, 9] and not resp.stop_appended
    assert resp.prompt_token_ids == [4, 5, 6] and resp.usage["completion_tokens"] == 4
    resp = parse_token_completion(vllm_body([1, 2, 3], stop_reason=9), "vllm")
    assert resp.completion_token_ids == [1, 2, 3, 9] and resp.stop_appended
    resp = parse_token_completion(vllm_body([1, 2, 3], finish="length"), "vllm")
    assert resp.completion_token_ids == [1, 2, 3] and resp.finish_reason == "length"


def test_sglang_answer_parsed_with_its_matched_stop():
    body = orjson.dumps({"text": "x", "output_ids": [1, 2], "meta_info": {
        "id": "r1", "finish_reason": {"type": "stop", "matched": 9}, "prompt_tokens": 5,
        "completion_tokens": 3}})
    resp = parse_token_completion(body, "sglang")
    assert resp.completion_token_ids == [1, 2, 9] and resp.stop_appended
    assert resp.usage == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert resp.finish_reason == "stop" and resp.id == "r1"


@pytest.mark.parametrize("body, words", [
    (b"", "empty"), (b"[1]", "JSON object"), (b'{"choices": []}', "choices"),
    (b'{"choices": [{"finish_reason": "stop"}]}', "return_token_ids"),
    (b'{"choices": [{"token_ids": [1, "a"]}]}', "token_ids"),
    (b'{"object": "error", "message": "boom"}', "boom")])
def test_bad_vllm_answers_are_classified(body, words):
    with pytest.raises(ApiError) as exc:
        parse_token_completion(body, "vllm")
    assert words in str(exc.value)
    assert exc.value.kind in ("invalid_response", "error_in_body")


def answer(ids, finish="stop", **kw):
    from specgen.client.types import ChatResponse

    return ChatResponse(content=None, reasoning=None, reasoning_field=None, tool_calls=[],
                        finish_reason=finish, native_finish_reason=None, provider=None,
                        model=None, id=None, completion_token_ids=list(ids), **kw)


def test_normalize_ids_parses_the_message_from_the_ids(renderer):
    msg = AssistantMessage(content="It is sunny.", reasoning="Let me look.", tool_calls=(
        ToolCall(id="functions.get_weather:0", name="get_weather",
                 arguments='{"city": "Paris"}'),))
    ids = renderer.completion_ids(msg, context=[], tools=TOOLS)
    prompt = [1, 2, 3]
    norm = normalize_ids(answer(ids, usage={"prompt_tokens": 3, "completion_tokens": len(ids)}),
                         tools=TOOLS, renderer=renderer, prompt_ids=prompt)
    assert norm.ids == ids and norm.repairs == []
    assert norm.message.tool_calls[0].arguments == '{"city": "Paris"}'
    assert norm.message.reasoning == "Let me look." and norm.message.content == "It is sunny."


def test_normalize_ids_catches_what_contradicts_the_servers_witness(renderer):
    ids = renderer.completion_ids(AssistantMessage(content="Hi.", reasoning="r"))
    with pytest.raises(Quarantined, match="prompt_mismatch"):
        normalize_ids(answer(ids, prompt_token_ids=[1, 2, 4]), tools=None, renderer=renderer,
                      prompt_ids=[1, 2, 3])
    with pytest.raises(Quarantined, match="count_mismatch"):
        normalize_ids(answer(ids, usage={"completion_tokens": len(ids) + 3}), tools=None,
                      renderer=renderer, prompt_ids=[1])
    with pytest.raises(Quarantined, match="missing_stop_token"):
        normalize_ids(answer(ids[:-1]), tools=None, renderer=renderer, prompt_ids=[1])
    with pytest.raises(Quarantined, match="length"):
        normalize_ids(answer(ids[:-1], finish="length"), tools=None, renderer=renderer,
                      prompt_ids=[1])
    kept = normalize_ids(answer(ids[:-1], finish="length"), tools=None, renderer=renderer,
                         prompt_ids=[1], on_length="keep")
    assert kept.truncated and kept.ids == ids[:-1]
    with pytest.raises(Quarantined, match="unknown_tool"):
        call = AssistantMessage(content="", reasoning="r", tool_calls=(ToolCall(
            id="functions.nope:0", name="nope", arguments="{}"),))
        normalize_ids(answer(renderer.completion_ids(call)), tools=TOOLS, renderer=renderer,
                      prompt_ids=[1])
