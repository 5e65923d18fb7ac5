"""The simulator's provider-quality knobs over real HTTP: schema violations, the tool-call
trigger rate, declared vs actual quantization, and the `tools_ignored` quirk (docs/sim.md,
"Provider quality")."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import jsonschema
import pytest

from specgen.config import ConfigError
from specgen.sim import SimConfig, start_in_thread
from specgen.sim.schema import violate
from test_sim_support import CHAT, MODEL, sse_events

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit"]}}}
SCHEMA = WEATHER["function"]["parameters"]
SHORT = {"distribution": "fixed", "tokens": 30, "min": 30, "max": 30}


def sim(providers: list[dict[str, Any]], **cfg: Any):
    return start_in_thread(SimConfig.from_dict({"length": SHORT, "providers": providers,
                                                **cfg}))


def post(handle, body: dict) -> Any:
    data = json.dumps({"model": MODEL, "max_tokens": 400, **body}).encode()
    req = urllib.request.Request(handle.root_url + CHAT, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
    except urllib.error.HTTPError as exc:
        raise AssertionError(exc.read()) from None
    if body.get("stream"):
        return sse_events([x for x in raw.decode().split("\n") if x])[1]
    return json.loads(raw)


def ask(i: int, **kw: Any) -> dict:
    return {"messages": [{"role": "user", "content": f"Weather in city {i}?"}],
            "tools": [WEATHER], **kw}


def calls_of(body: dict) -> list[dict]:
    return body["choices"][0]["message"].get("tool_calls") or []


def test_schema_violation_rate_breaks_that_share_of_calls():
    with sim([{"name": "Sloppy", "schema_violation_rate": 0.5},
              {"name": "Careful", "prompt_price_per_m": 9.0}],
             tool_calls={"rate": 1.0, "max_parallel": 1}) as h:
        broken = {"Sloppy": 0, "Careful": 0}
        total = {"Sloppy": 0, "Careful": 0}
        for i in range(80):
            for name in ("Sloppy", "Careful"):
                body = post(h, ask(i, provider={"only": [name]}))
                assert body["provider"] == name
                for c in calls_of(body):
                    args = json.loads(c["function"]["arguments"])
                    total[name] += 1
                    broken[name] += not jsonschema.Draft202012Validator(SCHEMA).is_valid(args)
    assert total["Sloppy"] == total["Careful"] == 80
    assert broken["Careful"] == 0
    assert 25 <= broken["Sloppy"] <= 55  # 50% of 80, drawn


def test_every_violation_kind_really_violates():
    import random

    kinds = set()
    rng = random.Random(3)
    for _ in range(200):
        good = {"city": "Paris", "unit": "c", "days": 3}
        out = violate(SCHEMA, good, rng)
        assert out is not None
        args, kind = out
        kinds.add(kind)
        assert not jsonschema.Draft202012Validator(SCHEMA).is_valid(args), (kind, args)
    assert kinds == {"missing_required", "wrong_type", "bad_enum"}
    assert violate({"type": "object"}, {"a": 1}, rng) is None  # nothing it could break


def test_tool_call_rate_per_provider():
    with sim([{"name": "Shy", "tool_call_rate": 0.0},
              {"name": "Eager", "tool_call_rate": 1.0, "prompt_price_per_m": 9.0}],
             tool_calls={"rate": 0.5}) as h:
        shy = sum(bool(calls_of(post(h, ask(i, provider={"only": ["Shy"]})))) for i in range(30))
        eager = sum(bool(calls_of(post(h, ask(i, provider={"only": ["Eager"]}))))
                    for i in range(30))
    assert (shy, eager) == (0, 30)


def test_declared_and_actual_quantization():
    with sim([{"name": "Mixed", "tag": "mixed/int4", "quantization": "int4",
               "actual_quantization": "nvfp4", "actual_quantization_rate": 0.5},
              {"name": "Quiet", "tag": "quiet/fp8", "quantization": "fp8",
               "actual_quantization": "fp4", "reveal_quantization": False,
               "prompt_price_per_m": 9.0}]) as h:
        with urllib.request.urlopen(h.url + f"/models/{MODEL}/endpoints", timeout=10) as r:
            listed = {e["provider_name"]: e["quantization"]
                      for e in json.loads(r.read())["data"]["endpoints"]}
        assert listed == {"Mixed": "int4", "Quiet": "fp8"}  # what the list declares
        seen = {post(h, ask(i, provider={"only": ["Mixed"]}))["quantization"] for i in range(40)}
        assert seen == {"int4", "nvfp4"}  # a mix behind one endpoint, and the answer says so
        events = post(h, ask(99, provider={"only": ["Mixed"]}, stream=True))
        assert {e.get("quantization") for e in events} <= {"int4", "nvfp4"}
        assert all("quantization" in e for e in events)
        quiet = post(h, ask(1, provider={"only": ["Quiet"]}, return_token_ids=True))
        assert "quantization" not in quiet  # serves fp4, says nothing
        assert quiet["specgen_sim"]["quantization"] == "fp4"  # (the test hook knows)
        stats = h.stats()["providers"]
        assert sum(stats["Mixed"]["quantizations"].values()) == 41


def test_tools_ignored_gives_raw_markers_in_content():
    with sim([{"name": "Deaf", "quirks": {"tools_ignored": 1.0}}],
             tool_calls={"rate": 1.0, "max_parallel": 1}) as h:
        body = post(h, ask(1, return_token_ids=True))
        msg = body["choices"][0]["message"]
        assert "tool_calls" not in msg
        assert "<|tool_calls_section_begin|>" in msg["content"]
        assert "functions.get_weather:0" in msg["content"]
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["specgen_sim"]["quirks"] == ["tools_ignored"]
    with sim([{"name": "Fine"}], tool_calls={"rate": 1.0, "max_parallel": 1}) as h:
        normal = post(h, ask(1, return_token_ids=True))
    # the provider dropped the declaration: the model saw (and was billed for) a shorter prompt
    assert body["usage"]["prompt_tokens"] < normal["usage"]["prompt_tokens"]
    assert len(body["prompt_token_ids"]) == body["usage"]["prompt_tokens"]


def test_defaults_draw_the_same_answers():
    plain = [{"name": "P"}]
    knobs = [{"name": "P", "schema_violation_rate": 0.0, "actual_quantization_rate": 1.0}]
    with sim(plain, seed=5) as a, sim(knobs, seed=5) as b:
        for i in range(5):
            x, y = post(a, ask(i)), post(b, ask(i))
            assert x["choices"] == y["choices"]


@pytest.mark.parametrize("provider, key", [
    ({"name": "A", "schema_violation_rate": 1.5}, "providers[0].schema_violation_rate"),
    ({"name": "A", "tool_call_rate": -0.1}, "providers[0].tool_call_rate"),
    ({"name": "A", "actual_quantization": "fp3"}, "actual_quantization 'fp3'"),
    ({"name": "A", "actual_quantization_rate": 2}, "providers[0].actual_quantization_rate"),
    ({"name": "A", "quirks": {"tools_ignored": 3}}, "providers[0].quirks.tools_ignored"),
])
def test_bad_knobs_name_the_key(provider, key):
    with pytest.raises(ConfigError) as info:
        SimConfig.from_dict({"providers": [provider]}, "sim.toml")
    assert key in str(info.value) and "sim.toml" in str(info.value)
