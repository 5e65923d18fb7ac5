"""`specgen sim` as a real process on an ephemeral port, driven with plain HTTP.

One "lab" simulator holds a clean provider plus one provider per quirk and one per fault (each
at rate 1); a request picks one with `provider.only`, so every quirk and fault is exercised
deterministically without fallbacks.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest

from specgen.conversation import AssistantMessage
from specgen.render import get_renderer
from specgen.render.kimi import END_THINK, IM_END, SECTION_BEGIN
from specgen.sim.config import FaultRates, QuirkRates
from specgen.tokenizer import load_tokenizer
from test_sim_support import CHAT, MODEL, SimProcess, sse_events

QUIRKS = [name for name, _ in QuirkRates().items()]
FAULTS = [name for name, _ in FaultRates().items()]
USER = [{"role": "user", "content": "What is the weather like in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name", "minLength": 2, "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "hourly": {"type": "boolean"},
        "fields": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    }, "required": ["city", "days"]}}}


def tag(kind: str, name: str) -> str:
    return f"{kind}-{name.replace('_', '-')}"


def lab_config() -> str:
    parts = ["""
seed = 0
keepalive_interval_s = 0.1
retry_after_s = 7
slow_first_byte_s = 3

[length]
distribution = "lognormal"
tokens = 120
sigma = 0.5
min = 20
max = 400

[tool_calls]
rate = 0.7

[[providers]]
name = "Clean"
tag = "clean/bf16"
quantization = "bf16"
prompt_price_per_m = 0.6
completion_price_per_m = 2.5
cache_read_price_per_m = 0.15
cache_hit_rate = 0.5

[[providers]]
name = "Latent"
tag = "latent"
latency_s = 0.35
tokens_per_second = 20000

[[providers]]
name = "Spaces"
tag = "q-spaces-think"
quirks = { spaces_around_special = 1.0, think_in_content = 1.0, im_end_in_content = 1.0 }

[[providers]]
name = "Content"
tag = "reasoning-content"
reasoning_field = "reasoning_content"
"""]
    for q in QUIRKS:
        parts.append(f'[[providers]]\nname = "Q {q}"\ntag = "{tag("q", q)}"\n'
                     f"quirks = {{ {q} = 1.0 }}\n")
    for f in FAULTS:
        parts.append(f'[[providers]]\nname = "F {f}"\ntag = "{tag("f", f)}"\n'
                     f"faults = {{ {f} = 1.0 }}\n")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    sim = SimProcess(tmp_path_factory.mktemp("lab"), lab_config())
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("demo")


@pytest.fixture(scope="module")
def k25(tok):
    return {t: get_renderer("kimi-k2.5", tok, thinking=t) for t in (True, False)}


def only(t: str) -> dict:
    return {"provider": {"only": [t]}, "return_token_ids": True}


# -- endpoints -------------------------------------------------------------------------------
def test_models_endpoints_and_key(lab):
    status, models = lab.get("/api/v1/models")
    assert status == 200 and models["data"][0]["id"] == MODEL
    status, eps = lab.get(f"/api/v1/models/{MODEL}/endpoints")
    assert status == 200
    by_tag = {e["tag"]: e for e in eps["data"]["endpoints"]}
    clean = by_tag["clean/bf16"]
    assert clean["provider_name"] == "Clean" and clean["quantization"] == "bf16"
    assert clean["pricing"]["prompt"] == "0.0000006" and clean["pricing"]["completion"] == "0.0000025"
    assert clean["pricing"]["input_cache_read"] == "0.00000015"
    assert "tools" in clean["supported_parameters"] and clean["context_length"] > 0
    assert lab.get("/api/v1/models/nobody/nothing/endpoints")[0] == 404
    status, key = lab.get("/api/v1/key")
    assert status == 200 and key["data"]["limit"] is None and "usage" in key["data"]


def test_bad_requests_are_400(lab):
    status, _, raw = lab.request("POST", CHAT, b"{not json")
    assert status == 400 and "JSON" in json.loads(raw)["error"]["message"]
    assert lab.chat({"model": "nobody/nothing", "messages": USER})[0] == 400
    assert lab.chat({"messages": []})[0] == 400
    assert lab.chat({"messages": USER, "tools": [{"type": "function"}]})[0] == 400
    assert lab.chat({"messages": USER, "max_tokens": 0})[0] == 400
    status, body, _ = lab.chat({"messages": USER, "provider": {"only": ["clean"], "colour": 1}})
    assert status == 400 and "colour" in body["error"]["message"]
    status, body, _ = lab.chat({"messages": USER, "provider": {"quantizations": ["fp5"]}})
    assert status == 400 and "quantizations" in body["error"]["message"]


# -- answers ---------------------------------------------------------------------------------
def test_nonstream_shape_usage_cost_and_true_ids(lab, tok, k25):
    for i in range(6):
        status, body, _ = lab.chat({"messages": USER + [{"role": "user", "content": f"#{i}"}],
                                    **only("clean/bf16")})
        assert status == 200
        assert body["provider"] == "Clean" and body["model"] == MODEL + "-20260127"
        assert body["object"] == "chat.completion" and body["id"].startswith("gen-")
        choice = body["choices"][0]
        msg = choice["message"]
        ids, pids = choice["token_ids"], body["prompt_token_ids"]
        messages = USER + [{"role": "user", "content": f"#{i}"}]
        assert pids == k25[True].prompt_ids(messages)
        # The fields are what the ids parse to, and canonical ids re-tokenise to themselves.
        parsed = k25[True].parse_completion(ids)
        assert parsed.reasoning == msg["reasoning"] and parsed.content == msg["content"]
        assert tok.encode(tok.decode(ids)) == ids
        assert choice["finish_reason"] == choice["native_finish_reason"] == "stop"
        assert ids[-1] == tok.token_id(IM_END)
        usage = body["usage"]
        assert usage["prompt_tokens"] == len(pids) and usage["completion_tokens"] == len(ids)
        assert usage["total_tokens"] == len(pids) + len(ids)
        n_reasoning = ids.index(tok.token_id(END_THINK))
        assert usage["completion_tokens_details"]["reasoning_tokens"] == n_reasoning
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        want = (len(pids) - cached) * 0.6e-6 + cached * 0.15e-6 + len(ids) * 2.5e-6
        assert abs(usage["cost"] - want) < 1e-12
        assert body["specgen_sim"]["quirks"] == []


def test_true_ids_only_when_asked(lab):
    status, body, _ = lab.chat({"messages": USER, "provider": {"only": ["clean"]}})
    assert status == 200
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    assert "specgen_sim" not in body
    status, body, _ = lab.chat({"messages": USER, "provider": {"only": ["clean"]}},
                               headers={"X-Specgen-Return-Token-Ids": "1"})
    assert "prompt_token_ids" in body and "token_ids" in body["choices"][0]


def test_v1_alias_and_reasoning_field(lab):
    status, _, raw = lab.request("POST", "/v1/chat/completions",
                                 {"model": MODEL, "messages": USER, **only("reasoning-content")})
    msg = json.loads(raw)["choices"][0]["message"]
    assert status == 200 and "reasoning_content" in msg and "reasoning" not in msg


def test_thinking_off_and_excluded_reasoning(lab, tok, k25):
    status, body, _ = lab.chat({"messages": USER, "reasoning": {"enabled": False},
                                **only("clean")})
    ids = body["choices"][0]["token_ids"]
    assert tok.token_id(END_THINK) not in ids
    assert body["prompt_token_ids"] == k25[False].prompt_ids(USER)
    assert body["choices"][0]["message"]["reasoning"] is None
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    status, body, _ = lab.chat({"messages": USER, "reasoning": {"exclude": True}, **only("clean")})
    assert body["choices"][0]["message"]["reasoning"] is None
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def test_max_tokens_is_exact_and_finishes_with_length(lab):
    for n in (1, 5, 17):
        status, body, _ = lab.chat({"messages": USER, "max_tokens": n, **only("clean")})
        choice = body["choices"][0]
        assert len(choice["token_ids"]) == n == body["usage"]["completion_tokens"]
        assert choice["finish_reason"] == choice["native_finish_reason"] == "length"


def test_stop_string_cuts_text_keeps_the_token(lab, tok):
    status, body, _ = lab.chat({"messages": USER, "stop": ["."], "max_tokens": 400,
                                **only("clean")})
    choice = body["choices"][0]
    msg = choice["message"]
    assert choice["finish_reason"] == "stop" and "." not in (msg["reasoning"] or "")
    assert msg["content"] == ""
    assert tok.decode(choice["token_ids"]).endswith(".") or "." in tok.decode(
        choice["token_ids"][-1:])


def test_tool_calls_valid_and_numbered_over_the_conversation(lab, tok):
    history = USER + [
        {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [
            {"id": "functions.get_weather:0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}},
            {"id": "functions.get_weather:1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Lyon", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
        {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "rain"},
    ]
    for i in range(4):
        status, body, _ = lab.chat({"messages": history + [{"role": "user", "content": str(i)}],
                                    "tools": [WEATHER], "tool_choice": "required",
                                    **only("clean")})
        assert status == 200
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        calls = choice["message"]["tool_calls"]
        for k, call in enumerate(calls):
            assert call["id"] == f"functions.get_weather:{2 + k}" and call["type"] == "function"
            args = json.loads(call["function"]["arguments"])
            assert 2 <= len(args["city"]) <= 40 and 1 <= args["days"] <= 7
            assert args.get("unit", "celsius") in ("celsius", "fahrenheit")
            assert 1 <= len(args.get("fields", ["x"])) <= 3
            assert call["function"]["arguments"] in tok.decode(choice["token_ids"])
    status, body, _ = lab.chat({"messages": USER, "tools": [WEATHER], "tool_choice": "none",
                                **only("clean")})
    assert "tool_calls" not in body["choices"][0]["message"]


# -- streaming -------------------------------------------------------------------------------
def _fold_stream(events):
    content, reasoning, calls, ids = [], [], {}, []
    for ev in events:
        for ch in ev.get("choices", []):
            ids += ch.get("token_ids", [])
            d = ch["delta"]
            content.append(d.get("content") or "")
            reasoning.append(d.get("reasoning") or "")
            for tc in d.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                if "id" in tc:
                    assert slot["id"] is None, "only the first fragment carries the id"
                    slot["id"], slot["name"] = tc["id"], tc["function"]["name"]
                else:
                    assert "name" not in tc.get("function", {})
                slot["arguments"] += tc["function"].get("arguments", "")
    return "".join(content), "".join(reasoning), calls, ids


def test_stream_framing_and_true_ids(lab, k25):
    status, lines = lab.stream({"messages": USER, "tools": [WEATHER], **only("clean")})
    assert status == 200
    assert lines[0] == ": OPENROUTER PROCESSING"
    comments, events, done = sse_events(lines)
    assert done and lines[-1] == "data: [DONE]"
    assert all(e["provider"] == "Clean" and e["object"] == "chat.completion.chunk"
               for e in events)
    assert "prompt_token_ids" in events[0] and events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[0]["prompt_token_ids"] == k25[True].prompt_ids(USER, [WEATHER])
    usage = events[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    finish = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finish) == 1 and finish[0] is events[-2]
    content, reasoning, calls, ids = _fold_stream(events)
    assert len(ids) == usage["usage"]["completion_tokens"]
    parsed = k25[True].parse_completion(ids)
    assert parsed.content == content and parsed.reasoning == reasoning
    assert [(c.id, c.arguments) for c in parsed.tool_calls] == [
        (calls[k]["id"], calls[k]["arguments"]) for k in sorted(calls)]


def test_stream_tool_call_deltas(lab):
    for i in range(3):
        status, lines = lab.stream({"messages": USER + [{"role": "user", "content": str(i)}],
                                    "tools": [WEATHER], "tool_choice": "required",
                                    **only("clean")})
        _, events, _ = sse_events(lines)
        content, reasoning, calls, ids = _fold_stream(events)
        assert calls and all(c["id"].startswith("functions.get_weather:") for c in calls.values())
        assert all(json.loads(c["arguments"])["city"] for c in calls.values())
        assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_keepalive_comments_while_waiting(lab):
    status, lines = lab.stream({"messages": USER, "max_tokens": 30, **only("latent")})
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert first_data >= 3  # the initial comment plus at least two during 0.35 s
    assert all(line == ": OPENROUTER PROCESSING" for line in lines[:first_data])
    _, events, done = sse_events(lines)
    assert done and events[-1]["usage"]["completion_tokens"] <= 30


# -- quirks ----------------------------------------------------------------------------------
def _quirk(lab, name, **body):
    status, resp, _ = lab.chat({"messages": USER, "max_tokens": 2000, **body,
                                **only(tag("q", name))})
    assert status == 200
    assert name in resp["specgen_sim"]["quirks"], resp["specgen_sim"]
    return resp, resp["choices"][0]


def test_quirk_tool_calls_in_content(lab, tok):
    body, choice = _quirk(lab, "tool_calls_in_content")
    msg = choice["message"]
    assert "tool_calls" not in msg and SECTION_BEGIN in msg["content"]
    assert "<|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>" in msg["content"]
    assert tok.token_id(SECTION_BEGIN) in choice["token_ids"]
    assert choice["finish_reason"] == "stop"


def test_quirk_tool_calls_as_text(lab):
    body, choice = _quirk(lab, "tool_calls_as_text", tools=[WEATHER], tool_choice="required")
    assert "tool_calls" not in choice["message"]
    assert "<|tool_call_begin|>functions.get_weather:0" in choice["message"]["content"]


def test_quirk_im_end_in_content(lab):
    body, choice = _quirk(lab, "im_end_in_content")
    assert choice["message"]["content"].endswith(IM_END)
    assert not choice["message"]["content"].endswith(" " + IM_END)


def test_quirk_spaces_around_special(lab, tok):
    status, body, _ = lab.chat({"messages": USER, "max_tokens": 2000, **only("q-spaces-think")})
    assert set(body["specgen_sim"]["quirks"]) == {"spaces_around_special", "think_in_content",
                                                  "im_end_in_content"}
    msg = body["choices"][0]["message"]
    parsed = get_renderer("kimi-k2.5", tok).parse_completion(body["choices"][0]["token_ids"])
    assert msg["reasoning"] is None
    assert msg["content"] == f"{parsed.reasoning} {END_THINK} {parsed.content} {IM_END}"


def test_quirk_think_in_content(lab, tok):
    body, choice = _quirk(lab, "think_in_content")
    parsed = get_renderer("kimi-k2.5", tok).parse_completion(choice["token_ids"])
    assert choice["message"]["reasoning"] is None
    assert choice["message"]["content"] == parsed.reasoning + END_THINK + parsed.content


def test_quirk_drop_end_think(lab, tok):
    body, choice = _quirk(lab, "drop_end_think")
    parsed = get_renderer("kimi-k2.5", tok).parse_completion(choice["token_ids"])
    assert choice["message"]["content"] == ""
    assert choice["message"]["reasoning"] == parsed.reasoning + parsed.content


HISTORY = USER + [
    {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [
        {"id": "functions.get_weather:0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
]


def test_quirk_renumber_tool_call_ids(lab, tok):
    body, choice = _quirk(lab, "renumber_tool_call_ids", messages=HISTORY, tools=[WEATHER],
                          tool_choice="required", parallel_tool_calls=False)
    assert choice["message"]["tool_calls"][0]["id"] == "functions.get_weather:0"
    assert "functions.get_weather:1" in tok.decode(choice["token_ids"])  # what the model wrote


def test_quirk_openai_tool_call_ids(lab):
    body, choice = _quirk(lab, "openai_tool_call_ids", tools=[WEATHER], tool_choice="required")
    ids = [c["id"] for c in choice["message"]["tool_calls"]]
    assert all(i.startswith("call_") and len(i) == 29 for i in ids)


def test_quirk_reserialize_arguments(lab, tok):
    body, choice = _quirk(lab, "reserialize_arguments", tools=[WEATHER], tool_choice="required")
    sampled = get_renderer("kimi-k2.5", tok).parse_completion(choice["token_ids"]).tool_calls
    for call, model_call in zip(choice["message"]["tool_calls"], sampled, strict=True):
        assert call["function"]["arguments"] != model_call.arguments
        assert json.loads(call["function"]["arguments"]) == json.loads(model_call.arguments)


def test_quirk_empty_content(lab):
    body, choice = _quirk(lab, "empty_content", tools=[WEATHER], tool_choice="required")
    assert choice["message"]["content"] == "" and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop" and body["usage"]["completion_tokens"] > 0


def test_quirks_in_a_stream(lab, tok):
    status, lines = lab.stream({"messages": USER, "max_tokens": 2000, **only("q-spaces-think")})
    _, events, done = sse_events(lines)
    content, reasoning, _, ids = _fold_stream(events)
    parsed = get_renderer("kimi-k2.5", tok).parse_completion(ids)
    assert done and reasoning == ""
    assert content == f"{parsed.reasoning} {END_THINK} {parsed.content} {IM_END}"
    assert events[-1]["specgen_sim"]["quirks"]


# -- faults ----------------------------------------------------------------------------------
def _shape(err: dict) -> str:
    # a 429 also says how long to wait (metadata.retry_after_seconds), in either shape
    meta = {k: v for k, v in err["metadata"].items() if k != "retry_after_seconds"}
    if set(meta) == {"provider_name", "raw"}:
        return "provider_raw"
    assert set(meta) == {"error_type", "provider_code"}, meta
    return "error_type"


@pytest.mark.parametrize("fault,status", [("rate_limit", 429), ("timeout", 408),
                                          ("server_error", 500), ("bad_gateway", 502),
                                          ("unavailable", 503)])
def test_http_faults_with_both_metadata_shapes(lab, fault, status):
    shapes = set()
    for i in range(12):
        got, body, headers = lab.chat({"messages": USER + [{"role": "user", "content": str(i)}],
                                       **only(tag("f", fault))})
        assert got == status and body["error"]["code"] == status
        shapes.add(_shape(body["error"]))
        if status == 429:
            assert headers["Retry-After"] == "7"
    assert shapes == {"provider_raw", "error_type"}


def test_moderation_403(lab):
    status, body, _ = lab.chat({"messages": USER, **only("f-moderation")})
    assert status == 403
    assert body["error"]["metadata"]["reasons"] and body["error"]["metadata"]["flagged_input"]


def test_error_in_body_200(lab):
    kinds = set()
    for i in range(10):
        status, body, _ = lab.chat({"messages": USER + [{"role": "user", "content": str(i)}],
                                    **only("f-error-in-body")})
        assert status == 200
        if "error" in body:
            kinds.add("top")
        else:
            choice = body["choices"][0]
            assert choice["error"]["code"] and choice["finish_reason"] == "error"
            kinds.add("choice")
    assert kinds == {"top", "choice"}
    status, lines = lab.stream({"messages": USER, **only("f-error-in-body")})
    _, events, _ = sse_events(lines)
    assert status == 200 and events[0]["error"]["code"] == 502


def test_mid_stream_error(lab):
    status, lines = lab.stream({"messages": USER, **only("f-mid-stream-error")})
    _, events, done = sse_events(lines)
    assert status == 200 and not done
    last = events[-1]
    assert last["error"]["message"] and last["choices"][0]["finish_reason"] == "error"
    assert all("usage" not in e for e in events)


def _raw_http(lab, body: dict) -> bytes:
    """Send one request over a plain socket and read until the peer closes or resets."""
    host, port = lab.root[len("http://"):].split(":")
    payload = json.dumps({"model": MODEL, **body}).encode()
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: "
              b"application/json\r\nContent-Length: " + str(len(payload)).encode()
              + b"\r\n\r\n" + payload)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except ConnectionResetError:
        got += b"<RESET>"
    finally:
        s.close()
    return got


def test_connection_reset_mid_body(lab):
    got = _raw_http(lab, {"messages": USER, **only("f-connection-reset")})
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"<RESET>")
    head, _, body = got[:-len(b"<RESET>")].partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert 0 < len(body) < length
    got = _raw_http(lab, {"messages": USER, "stream": True, **only("f-connection-reset")})
    assert b"data: " in got and got.endswith(b"<RESET>") and b"[DONE]" not in got


def test_slow_first_byte_beyond_client_timeout(lab):
    req = urllib.request.Request(lab.root + CHAT, data=json.dumps(
        {"model": MODEL, "messages": USER, **only("f-slow-first-byte")}).encode(),
        headers={"Content-Type": "application/json"})
    with pytest.raises((TimeoutError, urllib.error.URLError, socket.timeout)):
        urllib.request.urlopen(req, timeout=0.5).read()


def test_malformed_json(lab):
    status, _, raw = lab.request("POST", CHAT, {"model": MODEL, "messages": USER,
                                                **only("f-malformed-json")})
    assert status == 200
    with pytest.raises(ValueError):
        json.loads(raw)
    status, lines = lab.stream({"messages": USER, **only("f-malformed-json")})
    bad = 0
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            try:
                json.loads(line[6:])
            except ValueError:
                bad += 1
    assert bad == 1


def test_stats_count_outcomes(lab):
    before = lab.stats()
    lab.chat({"messages": USER, **only("f-rate-limit")})
    _, ok, _ = lab.chat({"messages": USER, **only("clean")})
    after = lab.stats()
    assert after["requests"] - before["requests"] == 2
    assert after["completed"] - before["completed"] == 1
    assert after["failed"]["rate_limit"] - before["failed"].get("rate_limit", 0) == 1
    assert after["in_flight"] == 0
    assert after["completion_tokens"] - before["completion_tokens"] == ok["usage"]["completion_tokens"]
    assert abs(after["cost_usd"] - before["cost_usd"] - ok["usage"]["cost"]) < 1e-12
    assert after["providers"]["Clean"]["completed"] >= 1
    gen = lab.get(f"/api/v1/generation?id={ok['id']}")[1]["data"]
    assert gen["provider_name"] == "Clean" and gen["total_cost"] == ok["usage"]["cost"]


def test_canonical_reconstruction_matches_renderer(lab, tok, k25):
    """The sampled ids are exactly the renderer's ids for the returned message."""
    for i in range(5):
        _, body, _ = lab.chat({"messages": USER + [{"role": "user", "content": f"c{i}"}],
                               "tools": [WEATHER], **only("clean")})
        msg = body["choices"][0]["message"]
        am = AssistantMessage.from_openai({**msg, "reasoning_content": msg["reasoning"]})
        assert k25[True].completion_ids(am) == body["choices"][0]["token_ids"]
