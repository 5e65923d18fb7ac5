"""The request body: tools as a parameter, history reasoning, dialects, sampling, no secrets."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from specgen.config import parse_config
from specgen.planner import TurnRequest, next_request
from specgen.request import build_request, dialect, reasoning_object, request_message
from specgen.sources import iter_rows

FIX = Path(__file__).parent / "fixtures" / "datasets"


def config(tmp_path, **over):
    raw = {
        "run_dir": "run",
        "target": {"model": "moonshotai/kimi-k2.5", "tokenizer": "demo"},
        "endpoint": {"base_url": "https://openrouter.ai/api/v1",
                     "provider": {"only": ["moonshotai"], "quantizations": ["int4", "fp8"]}},
        "sampling": {"temperature": 0.6, "top_p": 0.95, "max_tokens": 4000},
        "dataset": [{"name": "glaive", "path": str(FIX / "glaive.jsonl"), "max_tokens": 900},
                    {"name": "plain", "path": str(FIX / "prompt.json")}],
    }
    for key, value in over.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_config(raw, tmp_path / "run.toml")


@pytest.fixture
def glaive_conv():
    from specgen.config import DatasetConfig

    return next(iter_rows(DatasetConfig(name="g", path=FIX / "glaive.jsonl"))).conversation


def test_openrouter_body_has_tools_parameter_and_routing(tmp_path, glaive_conv):
    cfg = config(tmp_path)
    req = next_request(glaive_conv, {}, "last")
    body = build_request(cfg, cfg.datasets[0], req)
    assert body["model"] == "moonshotai/kimi-k2.5"
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather", "get_time"]
    # the tool dump is not in the system text: tools travel only as the parameter
    system = body["messages"][0]["content"]
    assert "get_weather" not in system and "{" not in system
    assert body["max_tokens"] == 900  # the dataset's override
    assert (body["temperature"], body["top_p"]) == (0.6, 0.95)
    assert "top_k" not in body and "seed" not in body
    assert body["reasoning"] == {"enabled": True}
    assert body["provider"] == {"only": ["moonshotai"], "quantizations": ["int4", "fp8"]}
    assert body["usage"] == {"include": True}
    assert body["transforms"] == [] and "models" not in body  # no compression, no fallback
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "return_token_ids" not in body and "chat_template_kwargs" not in body
    orjson.dumps(body)  # plain JSON


def test_plain_dataset_uses_run_max_tokens_and_no_tools(tmp_path):
    cfg = config(tmp_path)
    conv = next(iter_rows(cfg.datasets[1])).conversation
    body = build_request(cfg, cfg.datasets[1], next_request(conv, {}, "last"))
    assert body["max_tokens"] == 4000 and "tools" not in body
    assert body["messages"] == [{"role": "user", "content": "Write a haiku about rain."}]


def test_history_assistant_turns_carry_reasoning_and_tool_calls(tmp_path):
    cfg = config(tmp_path)
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "think",
         "tool_calls": [{"id": "functions.f:0", "type": "function",
                         "function": {"name": "f", "arguments": '{"a":1}'}}]},
        {"role": "tool", "tool_call_id": "functions.f:0", "content": "r", "name": "f"},
        {"role": "assistant", "content": "plain, no reasoning", "weight": 0},
        {"role": "user", "content": "again", "name": "bob"},
    ]
    tools = [{"type": "function", "function": {"name": "f"}}]
    body = build_request(cfg, cfg.datasets[1], TurnRequest(turn=5, messages=msgs, tools=tools))
    m = body["messages"]
    assert m[1] == {"role": "assistant", "content": "", "reasoning_content": "think",
                    "reasoning": "think",
                    "tool_calls": [{"id": "functions.f:0", "type": "function",
                                    "function": {"name": "f", "arguments": '{"a":1}'}}]}
    assert m[2] == {"role": "tool", "content": "r", "tool_call_id": "functions.f:0"}
    assert m[3] == {"role": "assistant", "content": "plain, no reasoning"}  # unknown keys dropped
    assert m[4] == {"role": "user", "content": "again", "name": "bob"}
    # a tool-call turn without reasoning still carries an (empty) reasoning field
    no_r = request_message({"role": "assistant", "content": None, "tool_calls": msgs[1]["tool_calls"]})
    assert no_r["reasoning_content"] == "" and no_r["content"] == ""


def test_local_servers_get_the_openai_dialect(tmp_path, glaive_conv):
    cfg = config(tmp_path, endpoint={"base_url": "http://127.0.0.1:8000/v1",
                                     "return_token_ids": True, "stream": False},
                 sampling={"reasoning": False, "top_k": 20, "seed": 7, "stop": ["END"],
                           "extra": {"repetition_penalty": 1.05}})
    req = next_request(glaive_conv, {}, "last")
    body = build_request(cfg, cfg.datasets[0], req)
    for key in ("provider", "usage", "reasoning", "stream_options", "transforms"):
        assert key not in body
    assert body["chat_template_kwargs"] == {"thinking": False, "enable_thinking": False}
    assert body["return_token_ids"] is True and body["stream"] is False
    assert (body["top_k"], body["seed"], body["stop"]) == (20, 7, ["END"])
    assert body["repetition_penalty"] == 1.05 and body["model"] == "moonshotai/kimi-k2.5"
    assert "tools" in body
    hist = build_request(cfg, cfg.datasets[0], TurnRequest(2, [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "r"}], None))
    # both names: vLLM reads `reasoning`, SGLang `reasoning_content`
    assert hist["messages"][1] == {"role": "assistant", "content": "a", "reasoning_content": "r",
                                   "reasoning": "r"}


def test_base_url_override_picks_the_dialect(tmp_path, glaive_conv):
    cfg = config(tmp_path, endpoint={"base_url": ["https://openrouter.ai/api/v1",
                                                  "http://10.0.0.2:30000/v1"]})
    req = next_request(glaive_conv, {}, "last")
    assert "provider" in build_request(cfg, cfg.datasets[0], req)
    assert "provider" not in build_request(cfg, cfg.datasets[0], req,
                                           base_url="http://10.0.0.2:30000/v1")


@pytest.mark.parametrize("url, kind", [
    ("sim", "openrouter"), ("https://openrouter.ai/api/v1", "openrouter"),
    ("https://eu.openrouter.ai/api/v1", "openrouter"), ("http://localhost:8000/v1", "openai"),
    ("https://notopenrouter.ai/v1", "openai"),
])
def test_dialect(url, kind):
    assert dialect(url) == kind


def test_reasoning_object():
    assert reasoning_object(True) == {"enabled": True}
    assert reasoning_object(False) == {"enabled": False}
    assert reasoning_object({"effort": "high"}) == {"effort": "high"}


def test_no_secret_in_the_body(tmp_path, glaive_conv, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-v1-SECRET")
    cfg = config(tmp_path)
    body = build_request(cfg, cfg.datasets[0], next_request(glaive_conv, {}, "last"))
    assert b"SECRET" not in orjson.dumps(body)


def test_configured_dialect_wins_over_the_url(tmp_path, glaive_conv):
    cfg = config(tmp_path, endpoint={"base_url": "http://127.0.0.1:9/v1", "dialect": "openrouter"})
    body = build_request(cfg, cfg.datasets[0], next_request(glaive_conv, {}, "last"))
    assert "provider" in body and "chat_template_kwargs" not in body
    cfg = config(tmp_path, endpoint={"dialect": "openai"})
    body = build_request(cfg, cfg.datasets[0], next_request(glaive_conv, {}, "last"))
    assert "provider" not in body and body["chat_template_kwargs"]["thinking"] is True
