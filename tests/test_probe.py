"""`specgen probe` against a real `specgen sim` process over HTTP on 127.0.0.1: a bad provider
ranks below the thresholds and is left out of the suggested policy (which parses as TOML and
validates as a config), the cost cap refuses before anything is sent, the provider policy
decides what is probed, and the exit codes say what happened."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from specgen.client.types import ChatResponse, RawToolCall
from specgen.config import load_config
from specgen.engine.policy import Endpoint, ProviderPolicy
from specgen.probe.measure import (
    Observation,
    Thresholds,
    min_answers,
    summarize,
    tool_facts,
    verdict,
)
from specgen.probe.report import suggested_provider, toml_block
from specgen.probe.suite import WEATHER
from test_engine_support import ENV, REPO, SimProcess, tool_rows, write_jsonl

SIM = """
[length]
distribution = "fixed"
tokens = 40
[tool_calls]
rate = 1.0                       # the model calls a tool whenever tools are declared
[[providers]]
name = "Moonshot AI"
tag = "moonshotai/int4"
quantization = "int4"
prompt_price_per_m = 0.6
completion_price_per_m = 3.0
latency_s = 0.05
tokens_per_second = 500
[[providers]]
name = "Together"
tag = "together/fp8"
quantization = "fp8"
prompt_price_per_m = 0.5
completion_price_per_m = 2.8
tokens_per_second = 900
quirks = { reserialize_arguments = 1.0 }   # counted right after the count-guided repair
[[providers]]
name = "Budget Host"
tag = "budgethost/fp4"
quantization = "fp4"
prompt_price_per_m = 0.3
completion_price_per_m = 1.2
usage_noise = 0.4                          # its usage counts are no witness
quirks = { tool_calls_as_text = 1.0 }      # its tool parser fails: calls come back as text
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    s = SimProcess(tmp_path_factory.mktemp("sim"), SIM)
    yield s
    s.stop()


def config(tmp_path, url: str, provider: str = "", dataset: str = "") -> str:
    (tmp_path / "data.jsonl").write_text('{"prompt": "hello"}\n')
    return f"""run_dir = "run"
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
base_url = "{url}"
api_key_env = "SPECGEN_TEST_KEY"
retry_base_delay = 0.01
[endpoint.provider]
{provider}
[[dataset]]
name = "a"
path = "{dataset or 'data.jsonl'}"
"""


def probe_cli(path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specgen", "probe", str(path), *args],
                          capture_output=True, text=True, timeout=180, env=ENV, cwd=REPO)


def test_a_bad_provider_is_ranked_out_and_the_block_is_a_valid_config(tmp_path, sim):
    # the 12 built-in canaries: enough answers for every figure to count
    # (min_answers(0.8) = 11)
    text = config(tmp_path, sim.url, 'quantizations = ["int4", "fp8", "fp4"]')
    path = tmp_path / "run.toml"
    path.write_text(text)
    before = sim.stats()["requests"]
    out = probe_cli(path, "--per-provider", "12")
    assert out.returncode == 0, out.stderr
    assert "worst case $" in out.stderr and "reference moonshotai/int4" in out.stderr
    data = json.loads((tmp_path / "run" / "probe.json").read_text())
    rows = {r["tag"]: r for r in data["providers"]}
    assert set(rows) == {"moonshotai/int4", "together/fp8", "budgethost/fp4"}
    bad = rows["budgethost/fp4"]
    assert not bad["kept"] and bad["trigger_f1"] == 0.0 and bad["tool_calls"] == 0
    assert any("tool-call trigger F1" in f for f in bad["failures"])
    assert bad["witness_agreement"] is not None and bad["witness_agreement"] < 0.9
    assert [r["tag"] for r in data["providers"]][-1] == "budgethost/fp4"  # ranked last
    good = rows["together/fp8"]
    assert good["kept"] and good["schema_accuracy"] == 1.0 and good["trigger_f1"] == 1.0
    # 11 of 12 repaired (builtin/convert_usd's reserialized arguments are no repair we know)
    assert good["witness_agreement"] >= 0.9 and good["witness"].get("repaired", 0) >= 11
    ref = rows["moonshotai/int4"]
    assert ref["reference"] and ref["kept"] and ref["reasoning_present"] == 1.0
    for r in rows.values():
        assert r["requests"] == 12 and r["answered"] == 12 and r["too_few"] == {}
        assert r["quantization"] == r["tag"].split("/")[1]
        assert r["cost_per_1k_completion_usd"] > 0 and r["ttft_p50_s"] is not None
        assert set(r["finish_reasons"]) <= {"tool_calls", "stop"}
    assert set(data["kept"]) == {"together/fp8", "moonshotai/int4"}
    assert 0 < data["spent_usd"] <= data["estimate_usd"] <= 1.0
    assert sim.stats()["requests"] - before == 36  # 12 canaries x 3, none retried
    # the block parses as TOML, validates as the config, and its policy leaves out the bad one
    block = data["suggested_toml"]
    assert block in out.stdout and "budgethost" not in block
    parsed = tomllib.loads(block)["endpoint"]["provider"]
    assert parsed == data["suggested_provider"]
    assert parsed["quantizations"] == ["int4", "fp8", "fp4"]  # the config's own keys kept
    new = tmp_path / "new.toml"
    new.write_text(config(tmp_path, sim.url).replace("[endpoint.provider]\n", block))
    cfg = load_config(new)
    policy = ProviderPolicy(cfg.endpoint.provider, [
        Endpoint(r["name"], r["tag"], r["quantization"], None, None) for r in rows.values()])
    assert policy.rejection("Budget Host") == "provider_not_allowed"
    assert policy.rejection("Together") is None


def test_the_cost_cap_refuses_before_anything_is_sent(tmp_path, sim):
    path = tmp_path / "run.toml"
    path.write_text(config(tmp_path, sim.url))
    before = sim.stats()["requests"]
    out = probe_cli(path, "--max-cost", "0.01")
    assert out.returncode == 2, out.stderr
    assert "refusing to start: the worst case is $" in out.stderr
    assert "above --max-cost $0.01" in out.stderr and "Traceback" not in out.stderr
    assert sim.stats()["requests"] == before  # the endpoint list only: no chat
    assert not (tmp_path / "run" / "probe.json").exists()


def test_policy_providers_and_reference_decide_what_is_probed(tmp_path, sim):
    write_jsonl(tmp_path / "t.jsonl", tool_rows(12))
    path = tmp_path / "run.toml"
    path.write_text(config(tmp_path, sim.url, 'ignore = ["together"]', dataset="t.jsonl"))
    out = probe_cli(path, "--per-provider", "11", "--providers", "budgethost", "--out",
                    str(tmp_path / "p.json"))
    # the reference (outside --providers) is probed but never kept; the one asked fails
    # (on 11 canaries, enough to count): nothing to suggest, exit 4
    assert out.returncode == 4, out.stderr
    data = json.loads((tmp_path / "p.json").read_text())
    assert {r["tag"] for r in data["providers"]} == {"budgethost/fp4", "moonshotai/int4"}
    assert data["kept"] == [] and data["suggested_toml"] is None
    assert data["canaries"]["ids"] == [f"a/t{i}" for i in range(11)]  # the config's tool rows
    assert "no endpoint meets the thresholds" in out.stdout
    bad = probe_cli(path, "--providers", "together")  # ignored by the policy: nothing left
    assert bad.returncode == 2 and "leave none of" in bad.stderr
    unknown = probe_cli(path, "--reference", "nosuch")
    assert unknown.returncode == 2 and "--reference nosuch: not in the endpoint list" in \
        unknown.stderr


def test_a_spent_account_stops_the_probe_with_exit_5(tmp_path):
    sim = SimProcess(tmp_path, "credit_limit_usd = 0.0005\n" + SIM, name="poor")
    try:
        path = tmp_path / "run.toml"
        path.write_text(config(tmp_path, sim.url))
        out = probe_cli(path, "--per-provider", "8", "--concurrency", "1")
        assert out.returncode == 5, out.stderr
        assert "an account budget is spent" in out.stderr
        data = json.loads((tmp_path / "run" / "probe.json").read_text())
        assert data["stopped"] and data["kept"] == []
    finally:
        sim.stop()


# -- the measures, unit by unit --------------------------------------------------------------
def _resp(args: str, name: str = "get_weather") -> ChatResponse:
    return ChatResponse(content="", reasoning="r", reasoning_field="reasoning",
                        tool_calls=[RawToolCall(0, "functions.x:0", name, args)],
                        finish_reason="tool_calls", native_finish_reason="tool_calls",
                        provider="p", model="m", id="g")


def test_schema_accuracy_counts_calls_that_fit_their_schema():
    tools = [WEATHER]
    assert tool_facts(_resp('{"city": "Oslo"}'), tools)[:2] == (1, 1)
    n, ok, problems = tool_facts(_resp('{"city": "Oslo", "unit": "kelvin"}'), tools)
    assert (n, ok) == (1, 0) and "$.unit" in problems[0]
    assert tool_facts(_resp('{"city":'), tools)[2] == ["get_weather: arguments are not JSON"]
    assert "not a declared tool" in tool_facts(_resp("{}", "rm_rf"), tools)[2][0]


def test_trigger_f1_is_measured_against_the_reference():
    def obs(canary: str, triggered: bool, tag: str = "x") -> Observation:
        return Observation(canary=canary, endpoint=tag, has_tools=True, thinking=True,
                           ok=True, triggered=triggered)

    ref = {c: obs(c, t, "ref") for c, t in (("a", True), ("b", True), ("c", False),
                                             ("d", False))}
    mine = [obs("a", True), obs("b", False), obs("c", True), obs("d", False)]
    m = summarize(mine, ref)
    assert m["trigger_f1"] == 0.5 and m["trigger_agreement"] == 0.5
    assert m["trigger_compared"] == 4
    why, thin = verdict(m, Thresholds())  # 4 canaries: too few to drop on
    assert why == [] and "rests on too few answers (n=4, needs 11)" in thin["trigger_f1"]
    m = summarize(mine * 3, ref)  # the same shares over 12 canaries count
    assert any("trigger F1 50% < 80% (n=12)" in f for f in verdict(m, Thresholds())[0])
    assert summarize([obs("a", True), obs("b", True)], ref)["trigger_f1"] == 1.0


def test_the_suggested_block_keeps_the_config_keys_and_orders():
    current = {"order": ["together", "deepinfra"], "ignore": ["x"], "zdr": True,
               "sort": {"by": "price", "partition": "none"}, "max_price": {"prompt": 1}}
    got = suggested_provider(current, ["moonshotai/int4", "together/fp8"])
    assert got == {"zdr": True, "sort": {"by": "price", "partition": "none"},
                   "max_price": {"prompt": 1}, "order": ["together"],
                   "only": ["moonshotai/int4", "together/fp8"]}
    assert tomllib.loads(toml_block(got))["endpoint"]["provider"] == got
    assert suggested_provider(current, []) is None and toml_block(None) is None


def test_a_bad_out_path_is_refused_before_anything_is_sent(tmp_path, sim):
    path = tmp_path / "run.toml"
    path.write_text(config(tmp_path, sim.url))
    (tmp_path / "afile").write_text("x")
    before = sim.stats()["requests"]
    for out, why in ((tmp_path, "it is a directory"),
                     (tmp_path / "afile" / "probe.json", f"{tmp_path / 'afile'} is not a directory")):
        res = probe_cli(path, "--out", str(out))
        assert res.returncode == 2, res.stderr
        assert f"cannot write {out}: {why}" in res.stderr and "Traceback" not in res.stderr
    assert sim.stats()["requests"] == before  # not even the endpoint list
    assert (tmp_path / "afile").read_text() == "x"


def test_min_answers_tells_a_coin_flip_from_the_floor():
    # the smallest n with 1.96 * 0.5 / sqrt(n) < floor - 0.5 (docs/probe.md)
    assert [min_answers(f) for f in (0.8, 0.9, 0.95, 1.0)] == [11, 7, 5, 4]
    assert min_answers(0.5) == min_answers(0.6) == 97


IDENTICAL = """
[length]
distribution = "fixed"
tokens = 30
""" + "".join(f"""[[providers]]
name = "{name}"
tag = "{tag}"
quantization = "fp8"
prompt_price_per_m = 0.5
completion_price_per_m = 2.5
""" for name, tag in (("Moonshot AI", "moonshotai/fp8"), ("Twin A", "twina/fp8"),
                      ("Twin B", "twinb/fp8")))


def test_identical_healthy_providers_are_not_dropped_on_too_few_answers(tmp_path):
    # the simulated model calls a tool on half the requests at random ([tool_calls] rate
    # 0.5), on every provider alike: with the default 8 canaries their trigger F1 against the
    # reference is noise, which must not drop them
    sim = SimProcess(tmp_path, IDENTICAL, name="twins")
    try:
        path = tmp_path / "run.toml"
        path.write_text(config(tmp_path, sim.url))
        out = probe_cli(path)
    finally:
        sim.stop()
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "run" / "probe.json").read_text())
    rows = {r["tag"]: r for r in data["providers"]}
    assert len(rows) == 3 and all(r["kept"] for r in rows.values()), rows
    assert set(data["kept"]) == set(rows)
    low = [r for r in rows.values() if r["trigger_f1"] is not None and r["trigger_f1"] < 0.8]
    assert low, "the seed gave no noisy figure: the test shows nothing"
    for r in low:
        note = r["too_few"]["trigger_f1"]
        assert "rests on too few answers (n=8, needs 11)" in note
        assert f"* {r['tag']}: tool-call trigger F1" in out.stdout
    assert "  drop " not in out.stdout


PRICEY = """
[length]
distribution = "fixed"
tokens = 40
[[providers]]
name = "Moonshot AI"
tag = "moonshotai/int4"
quantization = "int4"
prompt_price_per_m = 0.6
completion_price_per_m = 3.0
latency_s = 0.2
[[providers]]
name = "Pricey"
tag = "pricey/fp8"
quantization = "fp8"
prompt_price_per_m = 0.5
completion_price_per_m = 2.5
billed_price_factor = 10.0            # bills ten times what its endpoint list says
latency_s = 0.2
"""


def test_a_provider_billing_above_its_listed_price_stops_at_the_cap(tmp_path):
    sim = SimProcess(tmp_path, PRICEY, name="pricey")
    try:
        path = tmp_path / "run.toml"
        path.write_text(config(tmp_path, sim.url))
        args = ("--max-tokens", "64", "--per-provider", "8", "--json")
        plan = probe_cli(path, *args, "--max-cost", "0.0001")  # refused: shows the estimate
        estimate = float(plan.stderr.split("worst case is $")[1].split()[0])
        cap = round(estimate * 1.5, 6)  # fits the listed worst case, not what is billed
        before = sim.stats()["cost_usd"]
        out = probe_cli(path, *args, "--max-cost", str(cap))
        billed = sim.stats()["cost_usd"] - before
    finally:
        sim.stop()
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert billed <= cap + 1e-9, (billed, cap)  # what the provider charged, all of it
    assert abs(data["spent_usd"] - billed) < 1e-6
    assert data["billed_over_listed"]["pricey/fp8"] > 9
    assert "stopped at the cost cap" in out.stderr and "pricey/fp8 bills 10x" in out.stderr
    rows = {r["tag"]: r for r in data["providers"]}
    for tag, r in rows.items():
        assert r["requests"] + r["unsent"] == 8
        if r["unsent"]:
            assert f"{tag} {r['unsent']}/8" in data["capped"].split("left unmeasured: ")[1]
    assert rows["pricey/fp8"]["unsent"] > 0
