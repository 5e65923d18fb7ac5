"""OpenRouter provider routing in `specgen sim` (real process, plain HTTP)."""

from __future__ import annotations

from collections import Counter

import pytest

from test_sim_support import SimProcess

USER = [{"role": "user", "content": "Route me."}]
CONFIG = """
seed = 3
[length]
distribution = "fixed"
tokens = 40
min = 40
max = 40

[[providers]]
name = "Alpha"
tag = "alpha/fp8"
quantization = "fp8"
prompt_price_per_m = 0.5
completion_price_per_m = 2.0
latency_s = 0.01
tokens_per_second = 5000

[[providers]]
name = "Alpha"
tag = "alpha/fp4"
quantization = "fp4"
prompt_price_per_m = 0.3
completion_price_per_m = 1.2
latency_s = 0.02
tokens_per_second = 4000

[[providers]]
name = "Beta"
tag = "beta"
quantization = "bf16"
prompt_price_per_m = 0.9
completion_price_per_m = 3.5
latency_s = 0.01
tokens_per_second = 30000
collects_data = true
supported_parameters = ["tools", "tool_choice", "max_tokens", "temperature", "reasoning"]

[[providers]]
name = "Gamma"
tag = "gamma/int4"
quantization = "int4"
prompt_price_per_m = 0.6
completion_price_per_m = 2.5
tokens_per_second = 10000
zdr = true

[[providers]]
name = "Flaky"
tag = "flaky"
quantization = "fp8"
prompt_price_per_m = 0.55
completion_price_per_m = 2.2
latency_s = 0.01
tokens_per_second = 8000
faults = { unavailable = 1.0 }
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    s = SimProcess(tmp_path_factory.mktemp("routing"), CONFIG)
    yield s
    s.stop()


def ask(sim, provider=None, n=1, **body):
    """Provider tags that answered n requests (distinct bodies)."""
    tags = []
    for i in range(n):
        req = {"messages": USER + [{"role": "user", "content": str(i)}], "max_tokens": 8,
               "return_token_ids": True, **body}
        if provider is not None:
            req["provider"] = provider
        status, resp, _ = sim.chat(req)
        assert status == 200, resp
        tags.append(resp["specgen_sim"]["provider_tag"])
        assert resp["provider"] == {"alpha/fp8": "Alpha", "alpha/fp4": "Alpha", "beta": "Beta",
                                    "gamma/int4": "Gamma", "flaky": "Flaky"}[tags[-1]]
    return tags


def test_only_and_ignore(sim):
    assert set(ask(sim, {"only": ["beta"]}, 3)) == {"beta"}
    assert set(ask(sim, {"only": ["alpha"]}, 8)) <= {"alpha/fp8", "alpha/fp4"}  # base slug
    assert set(ask(sim, {"only": ["alpha/fp8"]}, 3)) == {"alpha/fp8"}
    ignored = ask(sim, {"ignore": ["alpha"]}, 12)
    assert not any(t.startswith("alpha") for t in ignored)
    assert set(ask(sim, {"only": ["Gamma"]}, 2)) == {"gamma/int4"}  # display names match too


def test_quantizations_allow_list_and_404(sim):
    assert set(ask(sim, {"quantizations": ["fp4"]}, 3)) == {"alpha/fp4"}
    assert set(ask(sim, {"quantizations": ["int4", "bf16"]}, 8)) <= {"gamma/int4", "beta"}
    status, body, _ = sim.chat({"messages": USER, "provider": {"quantizations": ["int8"]}})
    assert status == 404
    assert body["error"]["availability"]["code"] == "constraint_filtered"


def test_order_and_fallbacks(sim):
    assert set(ask(sim, {"order": ["beta", "gamma"]}, 3)) == {"beta"}
    before = sim.stats()["fallbacks"]
    assert set(ask(sim, {"order": ["flaky", "gamma"]}, 3)) == {"gamma/int4"}
    assert sim.stats()["fallbacks"] - before == 3
    status, body, _ = sim.chat({"messages": USER,
                                "provider": {"order": ["flaky"], "allow_fallbacks": False}})
    assert status == 503
    meta = body["error"]["metadata"]
    assert meta.get("provider_name") == "Flaky" or meta.get("provider_code") == 503
    # allow_fallbacks false and no order: only the first choice, never a fallback.
    statuses = Counter()
    for i in range(20):
        status, _, _ = sim.chat({"messages": USER + [{"role": "user", "content": f"x{i}"}],
                                 "max_tokens": 4, "provider": {"allow_fallbacks": False}})
        statuses[status] += 1
    assert set(statuses) <= {200, 503}


def test_require_parameters(sim):
    assert set(ask(sim, {"only": ["beta"]}, 2, seed=1)) == {"beta"}  # unsupported: ignored
    status, body, _ = sim.chat({"messages": USER, "seed": 1,
                                "provider": {"only": ["beta"], "require_parameters": True}})
    assert status == 404 and body["error"]["availability"]["code"] == "constraint_filtered"
    assert "beta" not in ask(sim, {"require_parameters": True}, 10, seed=1)


def test_sort(sim):
    assert set(ask(sim, {"sort": "price"}, 3)) == {"alpha/fp4"}
    assert set(ask(sim, {"sort": "throughput"}, 3)) == {"beta"}
    assert set(ask(sim, {"sort": "latency"}, 3)) == {"gamma/int4"}
    assert set(ask(sim, None, 3, model="moonshotai/kimi-k2.5:floor")) == {"alpha/fp4"}
    assert set(ask(sim, None, 3, model="moonshotai/kimi-k2.5:nitro")) == {"beta"}


def test_policy_filters(sim):
    assert "beta" not in ask(sim, {"data_collection": "deny"}, 12)
    assert set(ask(sim, {"zdr": True}, 3)) == {"gamma/int4"}
    assert set(ask(sim, {"max_price": {"prompt": 0.4}}, 3)) == {"alpha/fp4"}
    status, body, _ = sim.chat({"messages": USER, "provider": {"max_price": {"completion": 1}}})
    assert status == 404


def test_default_load_balancing_prefers_cheap(sim):
    tags = Counter(ask(sim, None, 60))
    assert tags.most_common(1)[0][0] == "alpha/fp4"
    assert "flaky" not in tags  # it always fails and is always fallen back from


def test_unknown_provider_keys_are_400(sim):
    for bad in ({"orderr": ["beta"]}, {"sort": "random"}, {"only": "beta"},
                {"allow_fallbacks": "no"}, {"data_collection": "maybe"}):
        status, body, _ = sim.chat({"messages": USER, "provider": bad})
        assert status == 400, bad
        assert body["error"]["code"] == 400
