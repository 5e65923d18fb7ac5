"""OpenRouter's 2026 `provider` object: every key accepted in its valid forms, every bad value
refused with an error naming the file and the key; the simulator routes on the same keys and
the engine's policy honours `max_price`."""

from __future__ import annotations

import random

import pytest

from specgen.config import ConfigError, load_config
from specgen.engine.policy import Endpoint, ProviderPolicy
from specgen.provider_object import provider_problem
from specgen.sim.config import ProviderConfig
from specgen.sim.routing import BadRequest, parse_preferences, route

BASE = """run_dir = "runs/x"
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
base_url = "sim"
[endpoint.provider]
{provider}
[[dataset]]
name = "a"
path = "data.jsonl"
"""


def load(tmp_path, provider: str):
    (tmp_path / "data.jsonl").write_text('{"prompt": "hi"}\n')
    path = tmp_path / "run.toml"
    path.write_text(BASE.format(provider=provider))
    return load_config(path)


VALID = [
    'order = ["moonshotai", "together/fp8"]',
    'only = ["moonshotai"]',
    'ignore = ["deepinfra/fp4"]',
    'quantizations = ["int4", "fp8", "nvfp4", "mxfp4", "unknown"]',
    "allow_fallbacks = false",
    "require_parameters = true",
    'data_collection = "deny"',
    "zdr = true",
    "enforce_distillable_text = true",
    'sort = "throughput"',
    'sort = { by = "latency" }',
    'sort = { by = "price", partition = "none" }',
    "max_price = { prompt = 1, completion = 3.5 }",
    "max_price = { request = 0.01 }",
    "preferred_min_throughput = 50",
    "preferred_min_throughput = { p50 = 80, p90 = 30 }",
    "preferred_max_latency = 2.5",
    "preferred_max_latency = { p99 = 8 }",
]


@pytest.mark.parametrize("line", VALID)
def test_every_key_is_accepted_in_its_valid_forms(tmp_path, line):
    cfg = load(tmp_path, line)
    key = line.split("=", 1)[0].strip()
    assert key in cfg.endpoint.provider


BAD = [
    ('order = "moonshotai"', "endpoint.provider.order must be a list of strings"),
    ('only = [1]', "endpoint.provider.only must be a list of strings"),
    ('ignore = [""]', "endpoint.provider.ignore must be a list of strings"),
    ('quantizations = ["fp5"]', "endpoint.provider.quantizations has unknown value(s) ['fp5']"),
    ('allow_fallbacks = "no"', "endpoint.provider.allow_fallbacks must be true or false"),
    ("require_parameters = 1", "endpoint.provider.require_parameters must be true or false"),
    ('zdr = "yes"', "endpoint.provider.zdr must be true or false"),
    ("enforce_distillable_text = 0", "endpoint.provider.enforce_distillable_text must be true"),
    ('data_collection = "maybe"', 'endpoint.provider.data_collection must be "allow" or "deny"'),
    ('sort = "cheapest"', "endpoint.provider.sort must be one of 'price', 'throughput'"),
    ('sort = { by = "speed" }', "endpoint.provider.sort.by must be one of"),
    ('sort = { by = "price", partition = "all" }', "endpoint.provider.sort.partition must be"),
    ('sort = { by = "price", order = 1 }', "endpoint.provider.sort has unknown key(s) order"),
    ("sort = 3", "endpoint.provider.sort must be a string or a table"),
    ("max_price = 3", "endpoint.provider.max_price must be a table of prices"),
    ("max_price = { prompt = -1 }", "endpoint.provider.max_price.prompt must be a number >= 0"),
    ("max_price = { tokens = 1 }", "endpoint.provider.max_price.tokens is unknown"),
    ('preferred_min_throughput = "fast"', "endpoint.provider.preferred_min_throughput must be a number"),
    ("preferred_min_throughput = { p42 = 1 }", "endpoint.provider.preferred_min_throughput.p42 is unknown"),
    ("preferred_max_latency = { p90 = -2 }", "endpoint.provider.preferred_max_latency.p90 must be a number >= 0"),
    ("preferred_max_latency = true", "endpoint.provider.preferred_max_latency must be a number"),
    ("fallbacks = false", "unknown key(s) in [endpoint.provider]: fallbacks"),
]


@pytest.mark.parametrize(("line", "needle"), BAD)
def test_each_key_has_its_own_clear_error(tmp_path, line, needle):
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, line)
    msg = str(exc.value)
    assert needle in msg, msg
    assert msg.startswith(str(tmp_path / "run.toml"))  # the file is named
    assert "Traceback" not in msg


def test_problem_names_a_custom_key():
    assert provider_problem({"zdr": 1}, "probe.provider") == \
        "probe.provider.zdr must be true or false, not 1"
    assert provider_problem({"only": ["a"], "allow_fallbacks": False}) is None


def _providers():
    return [ProviderConfig(name="Slow", tag="slow", latency_s=3.0, tokens_per_second=20,
                           prompt_price_per_m=0.1, completion_price_per_m=0.1),
            ProviderConfig(name="Fast", tag="fast", latency_s=0.2, tokens_per_second=200,
                           prompt_price_per_m=2.0, completion_price_per_m=9.0)]


def test_sim_routes_on_the_preferences_and_refuses_bad_ones():
    prefs = parse_preferences({"sort": "price", "preferred_max_latency": {"p50": 1.0}})
    order = route(_providers(), "m", prefs, params=set(), has_tools=False,
                  rng=random.Random(0))
    assert [p.name for p in order] == ["Fast", "Slow"]  # Slow misses the preference: last
    prefs = parse_preferences({"sort": "price", "preferred_min_throughput": 10})
    order = route(_providers(), "m", prefs, params=set(), has_tools=False,
                  rng=random.Random(0))
    assert [p.name for p in order] == ["Slow", "Fast"]  # both meet it: price order
    with pytest.raises(BadRequest, match="preferred_max_latency"):
        parse_preferences({"preferred_max_latency": {"p33": 1}})


def test_policy_drops_endpoints_over_max_price():
    eps = [Endpoint("Cheap", "cheap/fp8", "fp8", 0.5e-6, 2.0e-6),
           Endpoint("Dear", "dear/int4", "int4", 0.6e-6, 3.0e-6)]
    policy = ProviderPolicy({"max_price": {"completion": 2.5}}, eps)
    assert [e.tag for e in policy.allowed_endpoints()] == ["cheap/fp8"]
    assert policy.rejection("Dear") == "over_max_price"
    assert policy.rejection("Cheap") is None
    exact = ProviderPolicy({"max_price": {"prompt": 0.6, "completion": 3}}, eps)
    assert len(exact.allowed_endpoints()) == 2  # at the cap is within it
