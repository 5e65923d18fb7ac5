"""The simulator's parts in-process: config, token generation, serving parser, arguments,
and the in-thread / async start APIs."""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request
from pathlib import Path

import pytest

from specgen.config import ConfigError
from specgen.conversation import AssistantMessage, ToolCall
from specgen.render import get_renderer
from specgen.sim import SimConfig, load_sim_config, start, start_in_thread
from specgen.sim.generate import GenRequest, Model
from specgen.sim.schema import ArgumentGenerator
from specgen.sim.serving import Server
from specgen.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
RENDERERS = ("kimi-k2.5", "kimi-k2-thinking", "kimi-k2-instruct")
TOOLS = [{"type": "function", "function": {"name": "find", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer"}},
    "required": ["q"]}}}]


# -- config ----------------------------------------------------------------------------------
def test_defaults_and_example_config_are_valid():
    SimConfig().validate()
    cfg = load_sim_config(REPO / "examples" / "sim.toml")
    assert len(cfg.providers) >= 3 and cfg.providers[0].tag


@pytest.mark.parametrize("text,needle", [
    ("raw_rate = 2", "raw_rate"),
    ("colour = 1", "colour"),
    ("[faults]\nrate_limit = 0.7\nserver_error = 0.6", "add up to"),
    ('[[providers]]\nname = "A"\nquantization = "fp5"', "quantization"),
    ('[[providers]]\nname = "A"\n[[providers]]\nname = "a"', "duplicate tag"),
    ('[[providers]]\nname = "A"\nquirks = { sparkle = 1.0 }', "sparkle"),
    ('[[providers]]\nname = "A"\nlatency_s = "slow"', "latency_s"),
    ('text_mode = "fancy"', "text_mode"),
    ("[length]\nmin = 10\nmax = 5", "min <= max"),
    ("[tool_calls]\nrate_after_result = 2", "tool_calls.rate_after_result"),
])
def test_config_errors_name_the_key(tmp_path, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_sim_config(path)
    assert needle in str(exc.value) and str(path) in str(exc.value)


# -- generation ------------------------------------------------------------------------------
def _model(tok, renderer="kimi-k2.5", **cfg_kw):
    renderers = {t: get_renderer(renderer, tok, thinking=t) for t in (True, False)}
    cfg = SimConfig(**cfg_kw)
    cfg.validate()
    return Model(cfg, tok, renderers, seed=0), renderers


@pytest.mark.parametrize("which", ["demo", "kimi-k2.5"])
@pytest.mark.parametrize("renderer", RENDERERS)
def test_sampled_ids_are_the_renderers_canonical_ids(request, which, renderer):
    tok = request.getfixturevalue("demo_tokenizer" if which == "demo" else "kimi_tokenizer")
    model, renderers = _model(tok, renderer)
    assert model.fast, "precomputed assembly should be exact for the Kimi layout"
    rng = random.Random(1)
    for i in range(60):
        req = GenRequest(messages=[{"role": "user", "content": "x"}],
                         tools=TOOLS if i % 2 else None, thinking=i % 3 != 0)
        gen = model.generate(req, rng)
        msg = renderers[req.thinking].parse_completion(gen.ids)
        assert renderers[req.thinking].completion_ids(msg) == gen.ids
        assert tok.encode(tok.decode(gen.ids)) == gen.ids


def test_raw_mode_resegments_at_the_configured_rate():
    tok = load_tokenizer("demo")
    model, _ = _model(tok, text_mode="raw", raw_rate=0.25)
    rng = random.Random(2)
    n, bad = 400, 0
    for _ in range(n):
        gen = model.generate(GenRequest(messages=[], tools=None, thinking=True), rng)
        non_canonical = tok.encode(tok.decode(gen.ids)) != gen.ids
        assert non_canonical == (gen.resegmented > 0)
        bad += non_canonical
    assert 0.18 < bad / n < 0.32


def test_tool_call_rate_after_results_and_parallel_share():
    from specgen.sim.chat_request import parse_chat_request
    from specgen.sim.config import ToolCallConfig

    tok = load_tokenizer("demo")
    rng = random.Random(3)

    def calls(model, after, n=60):
        return [model.generate(GenRequest(messages=[], tools=TOOLS, thinking=False,
                                          after_tool_result=after), rng).tool_calls
                for _ in range(n)]

    asked = ToolCallConfig(rate=1.0, rate_after_result=0.0, max_parallel=3, parallel_rate=0.0)
    model, _ = _model(tok, tool_calls=asked)
    assert set(calls(model, after=False)) == {1} and set(calls(model, after=True)) == {0}
    model, _ = _model(tok, tool_calls=ToolCallConfig(rate=1.0, max_parallel=3, parallel_rate=1.0))
    assert set(calls(model, after=True)) == {2, 3}  # unset: `rate` after results too
    body = {"model": "moonshotai/kimi-k2.5", "tools": TOOLS, "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "functions.find:0", "type": "function",
             "function": {"name": "find", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "functions.find:0", "content": "r"}]}
    assert parse_chat_request(body, SimConfig()).after_tool_result
    assert not parse_chat_request({**body, "messages": body["messages"][:1]},
                                  SimConfig()).after_tool_result


def test_resegment_keeps_the_bytes():
    tok = load_tokenizer("demo")
    model, _ = _model(tok)
    ids = tok.encode("The weather in Paris is lovely today, thanks.")
    before = tok.decode(ids)
    split = list(ids)
    assert model.resegment(split, random.Random(0), 3) == 3
    assert tok.decode(split) == before and len(split) > len(ids)


# -- serving ---------------------------------------------------------------------------------
@pytest.mark.parametrize("renderer", RENDERERS)
def test_serving_parser_agrees_with_parse_completion_on_every_prefix(renderer):
    tok = load_tokenizer("demo")
    model, renderers = _model(tok, renderer)
    server = Server(model.tok)
    rng = random.Random(3)
    for i in range(12):
        r = renderers[bool(i % 2)]
        msg = AssistantMessage(
            content=model.bank.text(rng, 20)[0],
            reasoning=model.bank.text(rng, 20)[0] if r.thinking and r.has_thinking else None,
            tool_calls=(ToolCall("functions.find:3", "find", '{"q": "a b"}'),
                        ToolCall("functions.find:4", "find", '{"q":"c"}'))[: i % 3])
        ids = r.completion_ids(msg)
        start = r.thinking and r.has_thinking and r.prompt_opens_think
        for cut in range(1, len(ids) + 1):
            served = server.serve(ids[:cut], start_in_reasoning=start, stop_ids=r.stop_token_ids,
                                  max_tokens=10**6, has_tools=True)
            reasoning, content, calls = server.fold(served)
            want = r.parse_completion(ids[:cut])
            assert reasoning == want.reasoning or (reasoning is None and not want.reasoning)
            assert content == want.content
            assert [(c["id"], c["function"]["arguments"]) for c in calls] == [
                (c.id, c.arguments) for c in want.tool_calls]
            # Every id belongs to exactly one piece, so streams can carry all of them.
            covered = sorted(i for p in served.pieces for i in range(p.start, p.end))
            assert covered == list(range(cut))


def test_stream_deltas_carry_every_id_once():
    tok = load_tokenizer("demo")
    model, renderers = _model(tok)
    server = Server(model.tok)
    rng = random.Random(4)
    for chunk in (1, 3, 8):
        gen = model.generate(GenRequest(messages=[], tools=TOOLS, thinking=True,
                                        tool_choice="required"), rng)
        served = server.serve(gen.ids, start_in_reasoning=True,
                              stop_ids=renderers[True].stop_token_ids, max_tokens=10**6,
                              has_tools=True)
        got: list[int] = []
        text = {"reasoning": "", "content": ""}
        for delta, ids in server.stream_deltas(served, chunk, "reasoning"):
            got += ids
            if delta:
                text["reasoning"] += delta.get("reasoning", "")
                text["content"] += delta.get("content", "")
        assert got == gen.ids
        reasoning, content, _ = server.fold(served)
        assert text == {"reasoning": reasoning or "", "content": content}


def _in_process(sim, bodies):
    """Answers of `sim` to these bodies, through its HTTP parser (no sockets, no latency)."""
    from specgen.sim.http import HttpConnection

    class Transport:
        def __init__(self):
            self.out = []

        def write(self, data):
            self.out.append(data)

        def get_extra_info(self, name, default=None):
            return default

    sim.attach(asyncio.new_event_loop())
    transport = Transport()
    conn = HttpConnection(sim.handle, set())
    conn.connection_made(transport)
    answers = []
    for body in bodies:
        raw = json.dumps(body).encode()
        conn.data_received(b"POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
        head, _, payload = b"".join(transport.out).partition(b"\r\n\r\n")
        transport.out.clear()
        answer = json.loads(payload)
        answer.pop("created", None)  # wall clock
        answer["id"] = answer.get("id", "").rsplit("-", 1)[-1]
        answers.append((head.split(b"\r\n")[0], answer))
    return answers


@pytest.mark.parametrize("renderer", RENDERERS)
def test_plain_shortcut_answers_like_the_full_serving_path(renderer):
    """Non-stream answers that skip the serving parser (no tools called, no quirk, no cut) are
    the same, byte for byte, as those that go through it."""
    from specgen.sim.server import Simulator

    rng = random.Random(8)
    bodies = []
    for i in range(150):
        body = {"model": "moonshotai/kimi-k2.5", "return_token_ids": i % 3 != 0,
                "messages": [{"role": "user", "content": f"question {i}"}]}
        if rng.random() < 0.4:
            body["max_tokens"] = rng.choice([5, 60, 200, 400, 5000])
        if rng.random() < 0.3:
            body["reasoning"] = rng.choice([{"enabled": False}, {"effort": "low"},
                                            {"exclude": True}, {"max_tokens": 20}])
        if rng.random() < 0.2:
            body["stop"] = rng.choice([".", "the", ["zz", "is"]])
        if rng.random() < 0.3:
            body["tools"] = TOOLS
        bodies.append(body)
    fast, full = Simulator(seed=3, renderer=renderer), Simulator(seed=3, renderer=renderer)
    assert fast._plain_ok
    full._plain_ok = False
    plain_calls = []
    serve_plain = fast.serving.serve_plain
    fast.serving.serve_plain = lambda *a, **k: plain_calls.append(1) or serve_plain(*a, **k)
    assert _in_process(fast, bodies) == _in_process(full, bodies)
    assert 30 < len(plain_calls) < len(bodies)  # both paths were taken


# -- fast encoder ----------------------------------------------------------------------------
# -- arguments -------------------------------------------------------------------------------
def _valid(value, schema, root) -> bool:
    if "$ref" in schema:
        node = root
        for part in schema["$ref"][2:].split("/"):
            node = node[part]
        return _valid(value, node, root)
    if "enum" in schema:
        return value in schema["enum"]
    if "anyOf" in schema:
        return any(_valid(value, s, root) for s in schema["anyOf"])
    t = schema.get("type")
    if isinstance(t, list):
        return any(_valid(value, {**schema, "type": x}, root) for x in t)
    if t == "object":
        props = schema.get("properties", {})
        return (isinstance(value, dict) and all(k in value for k in schema.get("required", []))
                and all(_valid(v, props[k], root) for k, v in value.items() if k in props))
    if t == "array":
        return (isinstance(value, list)
                and schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 10**9)
                and all(_valid(v, schema.get("items", {}), root) for v in value))
    if t == "string":
        return (isinstance(value, str)
                and schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", 10**9))
    if t == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)
                and schema.get("minimum", -10**18) <= value <= schema.get("maximum", 10**18))
    if t == "number":
        return (isinstance(value, int | float) and not isinstance(value, bool)
                and schema.get("minimum", -1e18) <= value <= schema.get("maximum", 1e18))
    if t == "boolean":
        return isinstance(value, bool)
    if t == "null":
        return value is None
    return True


def test_arguments_are_valid_for_their_schema():
    schema = {
        "type": "object",
        "$defs": {"place": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 3}, "zip": {"type": ["string", "null"]}},
            "required": ["city"]}},
        "properties": {
            "where": {"$ref": "#/$defs/place"},
            "when": {"type": "string", "format": "date"},
            "mode": {"enum": ["fast", "slow", 3]},
            "n": {"type": "integer", "minimum": 2, "maximum": 4},
            "ratio": {"type": "number", "minimum": 0.5, "maximum": 0.75},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5},
                     "minItems": 2, "maxItems": 3},
            "either": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
            "flag": {"type": "boolean"},
        },
        "required": ["where", "n", "tags", "either"],
    }
    gen = ArgumentGenerator(lambda rng, n: " ".join(["word"] * n), optional_rate=0.5)
    rng = random.Random(6)
    for _ in range(300):
        args = gen.arguments(schema, rng)
        assert _valid(args, schema, schema), args
        json.dumps(args)


# -- start APIs ------------------------------------------------------------------------------
def test_start_in_thread_serves_and_stops():
    with start_in_thread(None, seed=1) as handle:
        assert handle.url.startswith("http://127.0.0.1:") and handle.url.endswith("/api/v1")
        req = urllib.request.Request(handle.url + "/chat/completions", data=json.dumps({
            "model": "moonshotai/kimi-k2.5", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.load(r)
        assert body["usage"]["completion_tokens"] == 5
        assert handle.stats()["completed"] == 1
    handle.stop()  # idempotent


def test_start_in_thread_serves_the_given_models():
    with start_in_thread(None, models=["acme/model-x"], renderer="kimi-k2-instruct") as handle:
        req = urllib.request.Request(handle.url + "/chat/completions", data=json.dumps({
            "model": "acme/model-x", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert json.load(r)["model"] == "acme/model-x-20260127"


def test_start_in_thread_raises_config_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("raw_rate = 5")
    with pytest.raises(ConfigError):
        start_in_thread(bad)


def test_async_start_inside_a_loop():
    async def main():
        import aiohttp

        server = await start(SimConfig(), tokenizer="demo", renderer="kimi-k2-thinking")
        try:
            async with aiohttp.ClientSession() as s:
                async with s.post(server.url + "/chat/completions", json={
                    "model": "moonshotai/kimi-k2.5", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi"}],
                }) as r:
                    assert r.status == 200
                    return await r.json()
        finally:
            await server.stop()

    body = asyncio.run(main())
    assert body["choices"][0]["finish_reason"] == "length"


def test_hash_random_is_a_pure_function_of_its_key():
    """First 8 draws from BLAKE2b(key), then a Twister seeded from the key: the documented
    sequence, and random.Random's methods on top of it."""
    import hashlib
    import struct

    from specgen.sim.rand import HashRandom

    key = b"p-example"
    pool = struct.unpack("<8Q", hashlib.blake2b(key, digest_size=64).digest())
    twister = random.Random(int.from_bytes(key, "little") ^ (1 << (8 * len(key))))
    want = list(pool) + [twister.getrandbits(64) for _ in range(12)]
    rng = HashRandom(key)
    assert [rng.getrandbits(64) for _ in range(20)] == want
    a, b = HashRandom(b"k"), HashRandom(b"k")
    draws = lambda r: (r.random(), r.randint(1, 9), r.choice("abc"), r.choices("xy", k=3),  # noqa: E731
                       r.uniform(1, 2), r.gauss(0, 1), r.getrandbits(100), r.random())
    assert draws(a) == draws(b) != draws(HashRandom(b"j"))
