"""Determinism under --seed, router-level fault rates, raw text mode, keys and credits
(each against its own `specgen sim` process)."""

from __future__ import annotations

from collections import Counter

import pytest

from specgen.tokenizer import load_tokenizer
from test_sim_support import SimProcess, sse_events

USER = [{"role": "user", "content": "Tell me something."}]
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "parameters": {"type": "object", "properties": {
        "q": {"type": "string"}, "n": {"type": "integer", "minimum": 1, "maximum": 5}},
        "required": ["q"]}}}]
DET_CONFIG = """
[length]
tokens = 60
sigma = 0.6
min = 10
max = 200
[faults]
rate_limit = 0.2
server_error = 0.1
"""


def _strip(body: dict) -> dict:
    body = dict(body)
    body.pop("created", None)
    body["id"] = body.get("id", "").rsplit("-", 1)[-1]  # the timestamp part varies
    return body


def _session(sim: SimProcess) -> list:
    """A fixed sequence of requests, some repeated, some streamed, some with tools."""
    out = []
    for i in range(30):
        body = {"messages": USER + [{"role": "user", "content": str(i % 12)}],
                "return_token_ids": True, "max_tokens": 300}
        if i % 3 == 0:
            body["tools"] = TOOLS
        if i % 5 == 0:
            status, lines = sim.stream(body)
            _, events, _ = sse_events(lines)
            out.append((status, [_strip(e) for e in events]))
        else:
            status, resp, _ = sim.chat(body)
            out.append((status, _strip(resp)))
    return out


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("det")
    sims = [SimProcess(tmp, DET_CONFIG, seed=s, name=f"det{k}") for k, s in
            enumerate((5, 5, 6))]
    yield sims
    for s in sims:
        s.stop()


def test_same_seed_same_session_other_seed_differs(twins):
    a, b, c = (_session(s) for s in twins)
    assert a == b
    assert a != c
    statuses = Counter(status for status, _ in a)
    assert statuses[200] > 0 and set(statuses) <= {200, 429, 500}


def test_repeated_request_differs_unless_it_has_a_seed(twins):
    sim = twins[0]
    body = {"messages": USER + [{"role": "user", "content": "repeat"}], "return_token_ids": True}
    outs = []
    while len(outs) < 2:
        status, resp, _ = sim.chat(body)
        if status == 200:
            outs.append(resp["choices"][0]["token_ids"])
    assert outs[0] != outs[1]
    seeded = []
    while len(seeded) < 3:
        status, resp, _ = sim.chat({**body, "seed": 42})
        if status == 200:
            seeded.append(resp["choices"][0]["token_ids"])
    assert seeded[0] == seeded[1] == seeded[2]


def test_router_fault_rates(twins):
    sim = twins[2]
    counts = Counter()
    for i in range(300):
        status, body, headers = sim.chat({"messages": USER + [{"role": "user", "content": f"f{i}"}],
                                          "max_tokens": 2})
        counts[status] += 1
        if status == 429:
            assert headers["Retry-After"] == "1"
    assert 0.12 < counts[429] / 300 < 0.28
    assert 0.04 < counts[500] / 300 < 0.17
    stats = sim.stats()
    assert stats["failed"]["rate_limit"] >= counts[429]


RAW_CONFIG = """
text_mode = "raw"
raw_rate = 0.3
[length]
tokens = 80
sigma = 0.5
min = 20
max = 300
"""


def test_raw_mode_rate_of_non_canonical_sequences(tmp_path):
    tok = load_tokenizer("demo")
    sim = SimProcess(tmp_path, RAW_CONFIG, seed=11, name="raw")
    try:
        n, non_canonical = 300, 0
        for i in range(n):
            status, body, _ = sim.chat({"messages": USER + [{"role": "user", "content": f"r{i}"}],
                                        "return_token_ids": True, "tools": TOOLS})
            assert status == 200
            ids = body["choices"][0]["token_ids"]
            bad = tok.encode(tok.decode(ids)) != ids
            non_canonical += bad
            assert bad == (body["specgen_sim"]["resegmented"] > 0)
            msg = body["choices"][0]["message"]
            # The API text is still exactly what the ids decode to.
            assert (msg["reasoning"] or "") in tok.decode(ids) and msg["content"] in tok.decode(ids)
        assert 0.2 < non_canonical / n < 0.4, non_canonical / n
        assert sim.stats()["resegmented"] == non_canonical
    finally:
        sim.stop()


ACCOUNT_CONFIG = """
api_keys = ["sk-sim-secret"]
credit_limit_usd = 0.0007
[length]
distribution = "fixed"
tokens = 200
min = 200
max = 200
[[providers]]
name = "Only"
prompt_price_per_m = 1.0
completion_price_per_m = 2.5
"""


def test_keys_and_credits(tmp_path):
    sim = SimProcess(tmp_path, ACCOUNT_CONFIG, name="account")
    try:
        status, body, _ = sim.chat({"messages": USER})
        assert status == 401
        status, body, _ = sim.chat({"messages": USER}, headers={"Authorization": "Bearer sk-bad"})
        assert status == 401 and "sk-bad" not in str(body)
        auth = {"Authorization": "Bearer sk-sim-secret"}
        statuses = []
        for i in range(4):
            status, body, _ = sim.chat({"messages": USER + [{"role": "user", "content": str(i)}]},
                                       headers=auth)
            statuses.append(status)
        assert statuses[0] == 200 and statuses[-1] == 402
        assert statuses.index(402) >= 1 and set(statuses[statuses.index(402):]) == {402}
        st, _, raw = sim.request("GET", "/api/v1/key", headers=auth)
        import json

        key = json.loads(raw)["data"]
        assert key["limit"] == 0.0007 and key["usage"] >= 0.0007
        assert key["limit_remaining"] == 0
        assert sim.stats()["failed"]["credits"] == statuses.count(402)
    finally:
        sim.stop()


def test_cli_reports_config_errors_and_prints_the_config(tmp_path):
    import json
    import subprocess
    import sys

    bad = tmp_path / "bad.toml"
    bad.write_text("[faults]\nrate_limit = 3\n")
    run = subprocess.run([sys.executable, "-m", "specgen", "sim", "--config", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "faults.rate_limit" in run.stderr and str(bad) in run.stderr
    good = tmp_path / "good.toml"
    good.write_text('models = ["a/b"]\n[[providers]]\nname = "Solo"\n')
    run = subprocess.run([sys.executable, "-m", "specgen", "sim", "--config", str(good),
                          "--print-config"], capture_output=True, text=True, timeout=120)
    cfg = json.loads(run.stdout)
    assert run.returncode == 0 and cfg["models"] == ["a/b"]
    assert cfg["providers"][0]["tag"] == "solo"
