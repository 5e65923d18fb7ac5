"""The simulator's token-in endpoints: vLLM's `/v1/completions` and SGLang's `/generate`
(docs/sim.md, "Token-in endpoints (vLLM and SGLang shapes)"), over real HTTP.

Prompts are rendered with the same Kimi renderers a token-in client uses; the answers' ids
must parse with `renderer.parse_completion`, name the declared tools, and obey vLLM's and
SGLang's stop-token, cut and usage rules.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from specgen.render import get_renderer
from specgen.render.kimi import END_THINK, IM_END
from specgen.render.kimi_tools import kimi_k25_tool_declaration, tools_json
from specgen.sim import start_in_thread
from specgen.sim.config import FaultRates, LengthConfig, ProviderConfig, SimConfig, ToolCallConfig
from specgen.sim.tokens import parse_declaration

MODEL = "moonshotai/kimi-k2.5"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name", "minLength": 2, "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "fields": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    }, "required": ["city", "days"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}}, "required": ["query"]}}}
TOOLS = [WEATHER, SEARCH]
# A tool loop: the user asks, the model called a tool, the tool answered.
HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris, then search for museums."},
    {"role": "assistant", "content": "", "reasoning_content": "Need the weather.",
     "tool_calls": [{"id": "functions.get_weather:0", "type": "function", "function": {
         "name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "Sunny, 24 C"},
]
USER = [{"role": "user", "content": "Say hello in three languages."}]


def _config(**provider: Any) -> SimConfig:
    return SimConfig(
        providers=[ProviderConfig(name="Local", tag="local", **provider)],
        length=LengthConfig(distribution="uniform", min=20, max=120),
        tool_calls=ToolCallConfig(rate=1.0, max_parallel=2))


@pytest.fixture(scope="module")
def sim(demo_tokenizer):
    with start_in_thread(_config(context_length=4096, max_completion_tokens=1024), seed=3,
                         tokenizer=demo_tokenizer, renderer="kimi-k2.5") as handle:
        yield handle


@pytest.fixture(scope="module")
def k25(demo_tokenizer):
    return {t: get_renderer("kimi-k2.5", demo_tokenizer, thinking=t) for t in (True, False)}


def post(handle, path: str, body: Any) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(handle.root_url + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def complete(handle, body: dict) -> tuple[int, Any]:
    status, _, raw = post(handle, "/v1/completions", {"model": MODEL, **body})
    return status, json.loads(raw)


def stream(handle, body: dict) -> tuple[int, list[Any], bool]:
    status, headers, raw = post(handle, "/v1/completions",
                                {"model": MODEL, "stream": True, **body})
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    events, done = [], False
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n")
    for block in text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        if block == "data: [DONE]":
            done = True
        else:
            events.append(json.loads(block[6:]))
    return status, events, done


def generate(handle, body: dict) -> tuple[int, Any]:
    status, _, raw = post(handle, "/generate", body)
    return status, json.loads(raw)


def stop_id(renderer) -> int:
    return renderer.tokenizer.token_id(IM_END)


# -- vLLM /v1/completions ------------------------------------------------------------------------
def test_tool_loop_prompt_answer_parses_and_names_declared_tools(sim, k25):
    r = k25[True]
    prompt = r.prompt_ids(HISTORY, TOOLS)
    names = {t["function"]["name"] for t in TOOLS}
    seen_calls = 0
    for seed in range(6):
        status, body = complete(sim, {"prompt": prompt, "return_token_ids": True, "seed": seed,
                                      "include_stop_str_in_output": True})
        assert status == 200, body
        assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
        assert body["model"] == MODEL and isinstance(body["created"], int)
        assert body["prompt_token_ids"] == prompt
        choice = body["choices"][0]
        ids = choice["token_ids"]
        assert ids[-1] == stop_id(r)
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop_id(r)
        assert choice["logprobs"] is None and choice["index"] == 0
        assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                                 "total_tokens": len(prompt) + len(ids)}
        msg = r.parse_completion(ids)  # thinking on: reasoning, </think>, content, calls
        assert msg.reasoning
        for k, call in enumerate(msg.tool_calls):
            assert call.name in names
            json.loads(call.arguments)
            assert call.id == f"functions.{call.name}:{1 + k}"  # one call earlier in the loop
        seen_calls += len(msg.tool_calls)
        # skip_special_tokens (default): the text is the decode of the ids without markers
        tok = r.tokenizer
        assert choice["text"] == tok.decode([i for i in ids if not tok.is_special(i)])
    assert seen_calls  # tools.rate is 1: the declared tools are called


def test_stop_id_left_out_unless_asked_but_counted(sim, k25):
    r = k25[True]
    prompt = r.prompt_ids(USER)
    base = {"prompt": prompt, "return_token_ids": True, "seed": 11}
    _, with_stop = complete(sim, {**base, "include_stop_str_in_output": True,
                                  "skip_special_tokens": False})
    _, without = complete(sim, base)
    full = with_stop["choices"][0]["token_ids"]
    ids = without["choices"][0]["token_ids"]
    assert full[-1] == stop_id(r) and ids == full[:-1]
    assert without["choices"][0]["stop_reason"] == stop_id(r)
    assert without["choices"][0]["finish_reason"] == "stop"
    assert without["usage"]["completion_tokens"] == len(full) == len(ids) + 1
    # skip_special_tokens false writes the markers out, the stop token included
    assert with_stop["choices"][0]["text"] == r.tokenizer.decode(full)
    assert with_stop["choices"][0]["text"].endswith(IM_END)
    assert END_THINK in with_stop["choices"][0]["text"]
    assert END_THINK not in without["choices"][0]["text"]
    # without return_token_ids: no ids in the answer
    _, plain = complete(sim, {"prompt": prompt, "seed": 11})
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain
    assert plain["choices"][0]["text"] == without["choices"][0]["text"]


def test_thinking_and_non_thinking_prompts(sim, k25, demo_tokenizer):
    end_think = demo_tokenizer.token_id(END_THINK)
    for seed in range(4):
        _, on = complete(sim, {"prompt": k25[True].prompt_ids(USER), "seed": seed,
                               "return_token_ids": True, "include_stop_str_in_output": True})
        _, off = complete(sim, {"prompt": k25[False].prompt_ids(USER), "seed": seed,
                                "return_token_ids": True, "include_stop_str_in_output": True})
        on_ids, off_ids = on["choices"][0]["token_ids"], off["choices"][0]["token_ids"]
        # thinking on: the prompt ends in <think>, the answer reasons first, then </think>
        assert end_think in on_ids and on_ids[0] != end_think
        assert k25[True].parse_completion(on_ids).reasoning
        # thinking off: the prompt ends in <think></think>, the answer is content only
        assert end_think not in off_ids
        msg = k25[False].parse_completion(off_ids)
        assert msg.reasoning is None and msg.content


def test_max_tokens_cuts_exactly(sim, k25):
    prompt = k25[True].prompt_ids(USER)
    _, full = complete(sim, {"prompt": prompt, "seed": 5, "return_token_ids": True,
                             "include_stop_str_in_output": True})
    full_ids = full["choices"][0]["token_ids"]
    for n in (1, 5, len(full_ids) - 1):
        _, cut = complete(sim, {"prompt": prompt, "seed": 5, "return_token_ids": True,
                                "max_tokens": n})
        choice = cut["choices"][0]
        assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
        assert choice["token_ids"] == full_ids[:n]  # with a seed: the same completion, cut
        assert cut["usage"]["completion_tokens"] == n
    # max_tokens exactly the full length: the model stopped on its own
    _, exact = complete(sim, {"prompt": prompt, "seed": 5, "return_token_ids": True,
                              "max_tokens": len(full_ids)})
    assert exact["choices"][0]["finish_reason"] == "stop"


def test_stop_token_ids_end_the_completion(sim, k25, demo_tokenizer):
    prompt = k25[True].prompt_ids(USER)
    end_think = demo_tokenizer.token_id(END_THINK)
    _, full = complete(sim, {"prompt": prompt, "seed": 8, "return_token_ids": True})
    ids = full["choices"][0]["token_ids"]
    k = ids.index(end_think)
    _, stopped = complete(sim, {"prompt": prompt, "seed": 8, "return_token_ids": True,
                                "stop_token_ids": [end_think]})
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == end_think
    assert choice["token_ids"] == ids[:k] and stopped["usage"]["completion_tokens"] == k + 1


def test_stream_concatenates_to_the_non_stream_answer(sim, k25):
    prompt = k25[True].prompt_ids(HISTORY, TOOLS)
    for seed, extra in ((1, {}), (2, {"include_stop_str_in_output": True}),
                        (3, {"max_tokens": 9})):
        body = {"prompt": prompt, "seed": seed, "return_token_ids": True, **extra}
        _, whole = complete(sim, body)
        _, events, done = stream(sim, {**body, "stream_options": {"include_usage": True}})
        assert done
        *chunks, usage = events
        assert usage["choices"] == [] and usage["usage"] == whole["usage"]
        assert chunks[0]["prompt_token_ids"] == prompt
        assert all("prompt_token_ids" not in c for c in chunks[1:])
        ids, text = [], ""
        for c in chunks:
            assert c["object"] == "text_completion" and c["id"] == chunks[0]["id"]
            assert c["model"] == MODEL
            choice = c["choices"][0]
            assert 1 <= len(choice["token_ids"]) <= 4 or len(chunks) == 1
            ids += choice["token_ids"]
            text += choice["text"]
        assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
        last = chunks[-1]["choices"][0]
        want = whole["choices"][0]
        assert (last["finish_reason"], last["stop_reason"]) == (want["finish_reason"],
                                                                want["stop_reason"])
        assert ids == want["token_ids"] and text == want["text"]
    # without include_usage: no usage chunk
    _, events, _ = stream(sim, {"prompt": prompt, "seed": 1})
    assert all(e["choices"] for e in events) and "token_ids" not in events[0]["choices"][0]


def test_identical_bodies_are_deterministic_per_occurrence(demo_tokenizer, k25):
    prompt = k25[True].prompt_ids(USER)
    runs = []
    for _ in range(2):
        with start_in_thread(_config(), seed=9, tokenizer=demo_tokenizer) as handle:
            answers = [complete(handle, {"prompt": prompt, "return_token_ids": True})[1]
                       ["choices"][0]["token_ids"] for _ in range(3)]
            seeded = [complete(handle, {"prompt": prompt, "return_token_ids": True,
                                        "seed": 4})[1]["choices"][0]["token_ids"]
                      for _ in range(2)]
        runs.append(answers)
        assert seeded[0] == seeded[1]  # a seed: the same completion every time
    assert runs[0] == runs[1]  # same sim seed, same request sequence: same answers
    assert len({tuple(a) for a in runs[0]}) > 1  # a repeated body gets a fresh draw


def test_string_prompt_and_nested_list(sim, k25, demo_tokenizer):
    text = k25[False].render_text(USER, add_generation_prompt=True)
    ids = k25[False].prompt_ids(USER)
    _, a = complete(sim, {"prompt": text, "seed": 2, "return_token_ids": True})
    _, b = complete(sim, {"prompt": [ids], "seed": 2, "return_token_ids": True})
    assert a["prompt_token_ids"] == ids == b["prompt_token_ids"]
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]


@pytest.mark.parametrize("body, field", [
    ({}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, 2, 999999]}, "out of vocabulary"),
    ({"prompt": [1, -1]}, "out of vocabulary"),
    ({"prompt": [1, "2"]}, "prompt[1]"),
    ({"prompt": [1, True]}, "prompt[1]"),
    ({"prompt": "PROMPT", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "PROMPT", "max_tokens": 1.5}, "max_tokens"),
    ({"prompt": "PROMPT", "temperature": "hot"}, "temperature"),
    ({"prompt": "PROMPT", "seed": "x"}, "seed"),
    ({"prompt": "PROMPT", "stream": "yes"}, "stream"),
    ({"prompt": "PROMPT", "stop_token_ids": [1, "x"]}, "stop_token_ids"),
    ({"prompt": "PROMPT", "skip_special_tokens": 1}, "skip_special_tokens"),
    ({"prompt": "PROMPT", "stream_options": {"include_usage": "y"}}, "include_usage"),
    ({"prompt": [1, 2, 3]}, "generation prompt"),
    ({"prompt": "PROMPT", "max_tokens": 5000}, "maximum context length is 4096"),
])
def test_bad_completions_requests_are_400_naming_the_field(sim, k25, body, field):
    text = k25[True].render_text(USER, add_generation_prompt=True)
    if body.get("prompt") == "PROMPT":
        body = {**body, "prompt": text}
    status, err = complete(sim, body)
    assert status == 400, err
    assert err["object"] == "error" and err["type"] == "BadRequestError"
    assert err["code"] == 400 and err["param"] is None
    assert field in err["message"]


def test_unknown_model_and_bad_json(sim, k25):
    status, _, raw = post(sim, "/v1/completions", {"model": "nobody/none",
                                                   "prompt": k25[True].prompt_ids(USER)})
    err = json.loads(raw)
    assert status == 404 and err["type"] == "NotFoundError" and "nobody/none" in err["message"]
    status, _, raw = post(sim, "/api/v1/completions", b"{not json")
    assert status == 400 and json.loads(raw)["object"] == "error"
    status, _, raw = post(sim, "/v1/completions", {"prompt": [1]})
    assert status == 400 and "model" in json.loads(raw)["message"]


def test_context_length_counts_prompt_and_max_tokens(demo_tokenizer, k25):
    prompt = k25[True].prompt_ids(USER)
    cfg = _config(context_length=len(prompt) + 10)
    with start_in_thread(cfg, seed=1, tokenizer=demo_tokenizer) as handle:
        status, ok = complete(handle, {"prompt": prompt, "max_tokens": 10,
                                       "return_token_ids": True})
        assert status == 200 and ok["usage"]["completion_tokens"] <= 10
        status, err = complete(handle, {"prompt": prompt, "max_tokens": 11})
        assert status == 400 and "maximum context length" in err["message"]
        status, ok = complete(handle, {"prompt": prompt})  # no max_tokens: capped, no error
        assert status == 200 and ok["usage"]["completion_tokens"] <= 10


# -- SGLang /generate ------------------------------------------------------------------------
def test_generate_shape_and_matched_stop(sim, k25):
    r = k25[True]
    prompt = r.prompt_ids(HISTORY, TOOLS)
    status, out = generate(sim, {"input_ids": prompt, "rid": "abc", "sampling_params": {
        "max_new_tokens": 1000, "temperature": 0.6, "sampling_seed": 3}})
    assert status == 200, out
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": stop_id(r)}
    ids = out["output_ids"]
    assert stop_id(r) not in ids  # never the matched stop id ...
    assert meta["completion_tokens"] == len(ids) + 1  # ... which is counted
    assert meta["prompt_tokens"] == len(prompt) and meta["cached_tokens"] == 0
    assert isinstance(meta["e2e_latency"], float) and len(meta["id"]) == 32
    r.parse_completion([*ids, meta["finish_reason"]["matched"]])
    assert out["text"] == r.tokenizer.decode([i for i in ids if not r.tokenizer.is_special(i)])
    # the same prompt and seed through vLLM's shape: the same completion
    _, v = complete(sim, {"prompt": prompt, "seed": 3, "return_token_ids": True})
    assert v["choices"][0]["token_ids"] == ids
    # no_stop_trim + skip_special_tokens false: the stop token's text stays in the text
    _, kept = generate(sim, {"input_ids": prompt, "sampling_params": {
        "max_new_tokens": 1000, "sampling_seed": 3, "no_stop_trim": True,
        "skip_special_tokens": False}})
    assert kept["output_ids"] == ids and kept["text"].endswith(IM_END)


def test_generate_length_and_text_prompt(sim, k25):
    text = k25[True].render_text(USER, add_generation_prompt=True)
    status, out = generate(sim, {"text": text, "sampling_params": {"max_new_tokens": 3}})
    assert status == 200
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert len(out["output_ids"]) == 3 == out["meta_info"]["completion_tokens"]
    assert out["meta_info"]["prompt_tokens"] == len(k25[True].prompt_ids(USER))


@pytest.mark.parametrize("body, field", [
    ({}, "input_ids"),
    ({"input_ids": [1, 10**9]}, "out of vocabulary"),
    ({"input_ids": [[1, 2]]}, "batches"),
    ({"input_ids": "PROMPT", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"input_ids": "PROMPT", "sampling_params": {"top_p": "x"}}, "top_p"),
    ({"input_ids": "PROMPT", "sampling_params": []}, "sampling_params"),
    ({"input_ids": "PROMPT", "stream": True}, "streaming /generate is not simulated"),
    ({"input_ids": [5, 6]}, "generation prompt"),
])
def test_bad_generate_requests_are_400(sim, k25, body, field):
    if body.get("input_ids") == "PROMPT":
        body = {**body, "input_ids": k25[True].prompt_ids(USER)}
    status, err = generate(sim, body)
    assert status == 400 and set(err) == {"error"} and field in err["error"]["message"]


# -- providers: faults, stats, pacing ----------------------------------------------------------
def test_rate_limit_fault_is_a_429_with_retry_after(demo_tokenizer, k25):
    cfg = _config(faults=FaultRates(rate_limit=1.0))
    cfg.retry_after_s = 3
    prompt = k25[True].prompt_ids(USER)
    with start_in_thread(cfg, seed=1, tokenizer=demo_tokenizer) as handle:
        status, headers, raw = post(handle, "/v1/completions", {"model": MODEL,
                                                                "prompt": prompt})
        err = json.loads(raw)
        assert status == 429 and headers["Retry-After"] == "3"
        assert err["object"] == "error" and err["code"] == 429 and err["message"]
        status, headers, raw = post(handle, "/generate", {"input_ids": prompt})
        assert status == 429 and headers["Retry-After"] == "3"
        assert json.loads(raw)["error"]["message"]
        stats = handle.stats()
        assert stats["failed"]["rate_limit"] == 2 and stats["faults"]["rate_limit"] == 2
        assert stats["providers"]["Local"]["failed"] == 2 and stats["in_flight"] == 0


def test_other_http_faults_and_error_bodies(demo_tokenizer, k25):
    prompt = k25[True].prompt_ids(USER)
    for fault, status in (("unavailable", 503), ("server_error", 500)):
        with start_in_thread(_config(faults=FaultRates(**{fault: 1.0})),
                             tokenizer=demo_tokenizer) as handle:
            got, headers, raw = post(handle, "/v1/completions", {"model": MODEL,
                                                                 "prompt": prompt})
            assert got == status and json.loads(raw)["code"] == status
            assert "Retry-After" not in headers
    with start_in_thread(_config(faults=FaultRates(error_in_body=1.0)),
                         tokenizer=demo_tokenizer) as handle:
        status, v = complete(handle, {"prompt": prompt})
        assert status == 200 and v["object"] == "error"
        status, s = generate(handle, {"input_ids": prompt})
        assert status == 200 and s["meta_info"]["finish_reason"]["type"] == "abort"


def test_stats_count_token_requests(demo_tokenizer, k25):
    prompt = k25[True].prompt_ids(USER)
    with start_in_thread(_config(), seed=2, tokenizer=demo_tokenizer) as handle:
        _, a = complete(handle, {"prompt": prompt})
        _, b = generate(handle, {"input_ids": prompt})
        _, events, _ = stream(handle, {"prompt": prompt, "stream_options": {
            "include_usage": True}})
        complete(handle, {"prompt": [1]})
        stats = handle.stats()
    completion = (a["usage"]["completion_tokens"] + b["meta_info"]["completion_tokens"]
                  + events[-1]["usage"]["completion_tokens"])
    assert stats["requests"] == 4 and stats["completed"] == 3
    assert stats["failed"] == {"bad_request": 1} and stats["in_flight"] == 0
    assert stats["prompt_tokens"] == 3 * len(prompt)
    assert stats["completion_tokens"] == completion
    assert stats["providers"]["Local"]["completed"] == 3 and stats["cost_usd"] > 0
    assert stats["spent_usd"] == 0.0


@pytest.mark.timing
def test_latency_and_speed_pace_the_answers(demo_tokenizer, k25):
    # No absolute time: the same requests to an unpaced simulator set this machine's scale
    # (`base`), the paced one waits 10 base for its latency and 10 base for its tokens
    import time

    def timed(handle, send) -> tuple[float, Any]:
        t = time.monotonic()
        out = send(handle, {"prompt": prompt, "max_tokens": 100, "seed": 7})
        return time.monotonic() - t, out

    prompt = k25[True].prompt_ids(USER)
    with start_in_thread(_config(), seed=1, tokenizer=demo_tokenizer) as handle:
        base_c, (_, body) = min(timed(handle, complete) for _ in range(3))
        base_s = min(timed(handle, stream)[0] for _ in range(3))
    base = max(base_c, base_s, 0.005)
    tokens = body["usage"]["completion_tokens"]
    with start_in_thread(_config(latency_s=10 * base, tokens_per_second=tokens / (10 * base)),
                         seed=1, tokenizer=demo_tokenizer) as handle:
        paced, (_, again) = timed(handle, complete)
        paced_s, _ = timed(handle, stream)
    assert again["usage"]["completion_tokens"] == tokens  # the same answer, paced
    # latency alone or speed alone would be 10 base; an unpaced answer 1 base
    assert paced > 15 * base and paced_s > 5 * base, (base, paced, paced_s)


# -- tool declarations and the other Kimi renderers ----------------------------------------------
def test_typescript_declaration_reads_back_to_the_same_declaration():
    tools = [WEATHER, SEARCH, {"type": "function", "function": {
        "name": "tree", "parameters": {"type": "object", "properties": {
            "kids": {"type": "array", "items": {"$ref": "#"}}, "v": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "noargs", "parameters": {}}},
        {"type": "function", "function": {"name": "nested", "parameters": {
            "type": "object", "$defs": {"Pt": {"type": "object", "description": "A point",
                                               "properties": {"x": {"type": "number"}}}},
            "properties": {"at": {"$ref": "#/$defs/Pt"},
                           "opt": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                           "meta": {"type": "object", "additionalProperties": False},
                           "flag": {"type": "boolean", "default": True}}}}}]
    text = kimi_k25_tool_declaration(tools)
    assert text.startswith("# Tools")
    back = parse_declaration(text)
    assert [t["function"]["name"] for t in back] == [t["function"]["name"] for t in tools]
    assert kimi_k25_tool_declaration(back) == text
    weather = back[0]["function"]["parameters"]
    assert weather["required"] == ["city", "days"]
    assert weather["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]
    assert weather["properties"]["city"]["maxLength"] == 40
    # JSON declarations (K2-Thinking, K2-Instruct, K2.5's fallback) come back as written
    assert parse_declaration(tools_json(TOOLS)) == json.loads(tools_json(TOOLS))
    # unreadable TypeScript: the names still come back
    broken = "# Tools\n\n## functions\nnamespace functions {\ntype f = (_: %%%) => any;\n}\n"
    assert parse_declaration(broken)[0]["function"]["name"] == "f"
    assert parse_declaration("no tools here") is None


@pytest.mark.parametrize("name", ["kimi-k2-thinking", "kimi-k2-instruct"])
def test_other_kimi_renderers(demo_tokenizer, name):
    r = get_renderer(name, demo_tokenizer, thinking=True)
    prompt = r.prompt_ids(HISTORY, TOOLS)
    with start_in_thread(_config(), seed=4, tokenizer=demo_tokenizer, renderer=name) as handle:
        calls = 0
        for seed in range(4):
            status, body = complete(handle, {"prompt": prompt, "seed": seed,
                                             "return_token_ids": True,
                                             "include_stop_str_in_output": True})
            assert status == 200, body
            msg = r.parse_completion(body["choices"][0]["token_ids"])
            assert (msg.reasoning is not None) == (name == "kimi-k2-thinking")
            assert all(c.name in {"get_weather", "search"} for c in msg.tool_calls)
            calls += len(msg.tool_calls)
        assert calls


def test_real_kimi_tokenizer(kimi_tokenizer):
    r = get_renderer("kimi-k2.5", kimi_tokenizer, thinking=True)
    prompt = r.prompt_ids(HISTORY, TOOLS)
    with start_in_thread(_config(), seed=4, tokenizer=kimi_tokenizer) as handle:
        status, body = complete(handle, {"prompt": prompt, "seed": 1, "return_token_ids": True,
                                         "include_stop_str_in_output": True})
        assert status == 200, body
        ids = body["choices"][0]["token_ids"]
        assert ids[-1] == kimi_tokenizer.token_id(IM_END)
        msg = r.parse_completion(ids)
        assert msg.reasoning and all(c.name in {"get_weather", "search"}
                                     for c in msg.tool_calls)
        status, out = generate(handle, {"input_ids": prompt, "sampling_params": {
            "max_new_tokens": 4000, "sampling_seed": 1}})
        assert out["output_ids"] == ids[:-1]
