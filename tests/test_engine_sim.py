"""The engine against a real `specgen sim` process: fault classes, budgets, provider policy,
fatal errors, bad rows, dedupe, limits, shards, config changes. Real SQLite, real sockets.

Runs are in-process (`specgen.engine.runner.run`) to keep the suite fast; the tests that
need real signals and kills are in test_run_process.py.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from specgen.config import load_config
from specgen.engine.runner import RunError, RunOptions, run
from specgen.engine.status import run_status
from specgen.store import Store, unpack_json
from specgen.tokenizer import load_tokenizer
from test_engine_support import (
    SimProcess,
    check_store,
    multi_turn_rows,
    prompt_rows,
    tool_rows,
    write_config,
    write_jsonl,
)

FAULTS = """
retry_after_s = 0.02
slow_first_byte_s = 1.5
[length]
distribution = "fixed"
tokens = 40
[faults]
rate_limit = 0.05
timeout = 0.04
server_error = 0.04
bad_gateway = 0.04
unavailable = 0.04
error_in_body = 0.04
mid_stream_error = 0.04
connection_reset = 0.04
malformed_json = 0.04
slow_first_byte = 0.03
moderation = 0.02
"""

CLEAN = """
[length]
distribution = "fixed"
tokens = 50
"""


@pytest.fixture(scope="module")
def faulty_sim(tmp_path_factory):
    sim = SimProcess(tmp_path_factory.mktemp("sim"), FAULTS)
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def clean_sim(tmp_path_factory):
    sim = SimProcess(tmp_path_factory.mktemp("sim"), CLEAN)
    yield sim
    sim.stop()


def go(path, **kw) -> tuple:
    cfg = load_config(path)
    outcome = run(cfg, RunOptions(live=False, **kw))
    return cfg, outcome


def outcomes(run_dir) -> dict[str, int]:
    with Store.open(run_dir) as s:
        return dict(s.conn.execute("SELECT outcome, COUNT(*) FROM attempts GROUP BY 1"))


@pytest.mark.parametrize("stream", [True, False])
def test_every_fault_class_is_retried_or_recorded(tmp_path, faulty_sim, stream):
    write_jsonl(tmp_path / "p.jsonl", prompt_rows(70))
    write_jsonl(tmp_path / "t.jsonl", tool_rows(15))
    write_jsonl(tmp_path / "m.jsonl", multi_turn_rows(10))
    path = write_config(
        tmp_path, faulty_sim.url,
        [{"name": "prompts", "path": "p.jsonl"},
         {"name": "tools", "path": "t.jsonl", "turns": "all"},
         {"name": "multi", "path": "m.jsonl", "turns": "all"}],
        endpoint=f"stream = {str(stream).lower()}\nfirst_byte_timeout = 0.5")
    cfg, outcome = go(path)
    # moderation fails its task: the run did all it could, but not all its work (exit 4)
    assert outcome.state == "incomplete" and outcome.exit_code == 4, outcome
    assert "task(s) failed (moderation" in outcome.stop_reason
    seen = outcomes(cfg.run_dir)
    want = {"retry:rate_limit", "retry:timeout", "retry:server", "retry:overloaded",
            "retry:connection", "retry:invalid_response", "fatal:moderation", "ok"}
    # in a stream, an error after the headers is a stream error; else an error in the body
    want.add("retry:stream_error" if stream else "retry:error_in_body")
    assert want <= set(seen), seen
    counts = check_store(cfg.run_dir, vocab=load_tokenizer("demo").vocab_size)
    assert counts.get("pending", 0) == 0
    st = run_status(cfg.run_dir)
    assert st["state"] == "incomplete" and "failed (moderation" in st["stop_reason"]
    assert set(st["failures"]) == {"moderation"}
    assert set(st["datasets"]) == {"prompts", "tools", "multi"}
    # moderation is fatal for the request: recorded as failed with its reason
    with Store.open(cfg.run_dir) as s:
        errors = [e for (e,) in s.conn.execute("SELECT error FROM tasks WHERE status='failed'")]
        n_multi = s.conn.execute("SELECT COUNT(*) FROM results WHERE dataset='multi'"
                                 ).fetchone()[0]
    assert errors and all("moderation" in e for e in errors)
    assert st["datasets"]["prompts"]["done"] + st["datasets"]["prompts"]["failed"] \
        + st["datasets"]["prompts"]["quarantined"] == 70
    assert n_multi > 10  # turns = "all": more than one sample per conversation
    # the status figures are the store's: cost = sum over every attempt (billed failures too)
    with sqlite3.connect(cfg.run_dir / "state.sqlite") as c:
        total = c.execute("SELECT SUM(cost_usd) FROM attempts").fetchone()[0]
    assert st["cost_usd"] == pytest.approx(total, rel=1e-6)


def test_samples_are_exact_and_requests_recorded(tmp_path, clean_sim):
    write_jsonl(tmp_path / "t.jsonl", tool_rows(8))
    path = write_config(tmp_path, clean_sim.url, [{"name": "tools", "path": "t.jsonl",
                                                   "turns": "all"}],
                        endpoint="return_token_ids = true")
    cfg, outcome = go(path)
    assert outcome.state == "finished"
    check_store(cfg.run_dir)
    with Store.open(cfg.run_dir) as s:
        rows = list(s.iter_results())
        attempts = s.conn.execute("SELECT provider, model, generation_id, prompt_tokens "
                                  "FROM attempts WHERE outcome='ok'").fetchall()
    assert rows and all(a[0] and a[1] and a[2] and a[3] for a in attempts)
    for r in rows:
        assert r.request["tools"] and r.request["messages"][0]["role"] == "user"
        assert r.message["role"] == "assistant" and r.provider
        # the simulator returns true ids: ours must equal them for a clean provider
        assert r.true_prompt_ids is not None and r.true_completion_ids is not None
        assert r.input_ids == r.true_prompt_ids + r.true_completion_ids
        assert r.n_prompt == len(r.true_prompt_ids)
        assert r.prompt_tokens == r.n_prompt


def test_token_budget_stops_exactly_and_resumes_with_a_bigger_one(tmp_path, clean_sim):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(60, "a"))
    write_jsonl(tmp_path / "b.jsonl", prompt_rows(10, "b"))
    ds = [{"name": "a", "path": "a.jsonl", "token_budget": 1000, "max_tokens": 100},
          {"name": "b", "path": "b.jsonl"}]
    path = write_config(tmp_path, clean_sim.url, ds)
    cfg, outcome = go(path)
    assert outcome.state == "finished" and "budget reached: a" in outcome.stop_reason
    st = run_status(cfg.run_dir)
    a = st["datasets"]["a"]
    assert 900 < a["completion_tokens"] <= 1000  # never over; stops once max_tokens won't fit
    assert a["state"] == "budget_reached" and a["pending"] > 0
    assert st["datasets"]["b"]["done"] == 10  # the run moved on to the next dataset
    before = {t: v for t, v in _results(cfg.run_dir).items()}
    # a bigger budget continues the pending work; nothing is sent twice
    ds[0]["token_budget"] = 2500
    path = write_config(tmp_path, clean_sim.url, ds)
    cfg, outcome = go(path)
    st = run_status(cfg.run_dir)
    assert 2400 < st["datasets"]["a"]["completion_tokens"] <= 2500
    after = _results(cfg.run_dir)
    assert all(after[t] == v for t, v in before.items())
    check_store(cfg.run_dir)
    with Store.open(cfg.run_dir) as s:
        assert s.conn.execute("SELECT COUNT(*) FROM attempts a JOIN tasks t ON t.id=a.task "
                              "WHERE a.outcome='ok' GROUP BY t.id HAVING COUNT(*) > 1"
                              ).fetchall() == []


def _results(run_dir):
    with Store.open(run_dir) as s:
        return {r.task: (r.input_ids, r.n_prompt) for r in s.iter_results()}


def test_cost_cap_with_endpoint_prices_never_overshoots(tmp_path, clean_sim):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(80))
    # endpoint list: completion price at most $3/M; worst case per request ~ 200 x 3e-6
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl",
                                                   "max_tokens": 200}],
                        extra="[budget]\nmax_cost_usd = 0.004")
    cfg, outcome = go(path)
    st = run_status(cfg.run_dir)
    assert outcome.state == "finished" and "budget reached" in outcome.stop_reason
    assert st["prices"]["source"] == "endpoints"
    assert 0.0025 < st["cost_usd"] <= 0.004
    assert st["datasets"]["a"]["pending"] > 0


def test_cost_cap_without_prices_uses_reported_cost(tmp_path, clean_sim):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(80))
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl",
                                                   "max_tokens": 200}],
                        endpoint="fetch_endpoints = false\nconcurrency = 4",
                        extra="[budget]\nmax_cost_usd = 0.002")
    cfg, outcome = go(path)
    st = run_status(cfg.run_dir)
    assert st["prices"]["source"] == "unknown"
    # overshoot bounded by what was in flight: 4 requests of at most ~$0.0007 each
    assert 0.002 <= st["cost_usd"] <= 0.002 + 4 * 0.0007
    assert st["datasets"]["a"]["pending"] > 0


def test_provider_policy_rejects_and_retries(tmp_path, clean_sim):
    """The router ignores the provider filter (here: the request's `provider` object is
    replaced through sampling.extra), so fp4 answers arrive: each is rejected (its cost still
    counted) and retried until an allowed provider answers."""
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(40))
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint='[endpoint.provider]\nquantizations = ["int4", "fp8"]',
                        sampling="max_tokens = 4096\nextra = {provider = {allow_fallbacks = true}}")
    cfg, outcome = go(path)
    assert outcome.state == "finished"
    with Store.open(cfg.run_dir) as s:
        rejected = s.conn.execute(
            "SELECT provider, cost_usd FROM attempts WHERE outcome LIKE 'rejected:%'").fetchall()
        kept = {p for (p,) in s.conn.execute("SELECT provider FROM results")}
        outcomes_ = {o for (o,) in s.conn.execute("SELECT outcome FROM attempts")}
    assert rejected and {p for p, _ in rejected} == {"DeepInfra"}
    assert all(c and c > 0 for _, c in rejected)  # paid for, and counted
    assert "rejected:quantization:fp4" in outcomes_
    assert kept and "DeepInfra" not in kept
    st = run_status(cfg.run_dir)
    assert st["datasets"]["a"]["done"] == 40
    assert st["providers"]["DeepInfra"]["outcomes"].get("ok", 0) == 0
    total = sum(p["cost_usd"] for p in st["providers"].values())
    assert st["cost_usd"] == pytest.approx(total)


def test_policy_that_matches_no_endpoint_refuses_to_start(tmp_path, clean_sim):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(3))
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint='[endpoint.provider]\nquantizations = ["bf16"]')
    with pytest.raises(RunError, match="no endpoint of moonshotai/kimi-k2.5 matches"):
        go(path)


def test_404_no_endpoints_stops_the_run_resumably(tmp_path, clean_sim):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(20))
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint='fetch_endpoints = false\ndialect = "openrouter"\n'
                                 '[endpoint.provider]\nonly = ["nobody"]')
    cfg, outcome = go(path)
    assert outcome.state == "failed" and outcome.exit_code == 1
    assert "no_endpoints" in outcome.stop_reason and "relax" in outcome.stop_reason
    st = run_status(cfg.run_dir)
    assert st["state"] == "failed" and st["datasets"]["a"]["done"] == 0
    assert st["datasets"]["a"]["failed"] == 0 and st["datasets"]["a"]["pending"] > 0
    # the policy is not part of what makes results: fixing it continues the same run
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}])
    cfg, outcome = go(path)
    assert outcome.state == "finished"
    assert run_status(cfg.run_dir)["datasets"]["a"]["done"] == 20
    check_store(cfg.run_dir)


def test_402_stops_cleanly_then_resumes(tmp_path):
    sim = SimProcess(tmp_path, "credit_limit_usd = 0.003\n" + CLEAN, name="poor")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(60))
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="concurrency = 4")
        cfg, outcome = go(path)
    finally:
        sim.stop()
    # out of credits is an account's budget, not a fault: stopped cleanly, resumable (exit 5)
    assert (outcome.state, outcome.exit_code) == ("stopped", 5), outcome
    assert "credits" in outcome.stop_reason and "add credits" in outcome.stop_reason
    done_before = _results(cfg.run_dir)
    assert 0 < len(done_before) < 60
    rich = SimProcess(tmp_path, CLEAN, name="rich")
    try:
        path = write_config(tmp_path, rich.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="concurrency = 4")
        cfg, outcome = go(path)
    finally:
        rich.stop()
    assert outcome.state == "finished"
    after = _results(cfg.run_dir)
    assert len(after) == 60 and all(after[t] == v for t, v in done_before.items())
    check_store(cfg.run_dir)


def test_401_bad_key_stops_and_never_records_the_key(tmp_path, monkeypatch):
    sim = SimProcess(tmp_path, 'api_keys = ["good-key"]\n' + CLEAN, name="auth")
    monkeypatch.setenv("SPECGEN_TEST_KEY", "sk-wrong-secret-4242")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(5))
        # an OpenRouter-like server: the key is checked (GET /key) before anything is sent
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}])
        with pytest.raises(RunError, match="refused the key") as exc:
            go(path)
        assert "sk-wrong-secret-4242" not in str(exc.value)
        # a 401 in the middle of a run stops it (no endpoint list, so no key check first)
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint='fetch_endpoints = false\ndialect = "openrouter"')
        cfg, outcome = go(path)
    finally:
        sim.stop()
    assert outcome.state == "failed" and "auth" in outcome.stop_reason
    assert "check the API key" in outcome.stop_reason
    assert run_status(cfg.run_dir)["datasets"]["a"]["pending"] == 5
    for f in cfg.run_dir.iterdir():
        if f.is_file():
            assert b"sk-wrong-secret-4242" not in f.read_bytes(), f


def test_400_is_fatal_for_the_request_only(tmp_path):
    sim = SimProcess(tmp_path, CLEAN + """
[[providers]]
name = "Small"
tag = "small/bf16"
quantization = "bf16"
context_length = 300
""", name="small")
    try:
        rows = prompt_rows(6)
        rows[2]["messages"][0]["content"] = "very long " * 400
        write_jsonl(tmp_path / "a.jsonl", rows)
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}])
        cfg, outcome = go(path)
    finally:
        sim.stop()
    assert (outcome.state, outcome.exit_code) == ("incomplete", 4), outcome
    assert "1 task(s) failed (bad_request 1)" in outcome.stop_reason
    st = run_status(cfg.run_dir)["datasets"]["a"]
    assert (st["done"], st["failed"], st["state"]) == (5, 1, "done_with_failures")
    with Store.open(cfg.run_dir) as s:
        (err,) = s.conn.execute("SELECT error FROM tasks WHERE status='failed'").fetchone()
        (n,) = s.conn.execute("SELECT COUNT(*) FROM attempts WHERE outcome='fatal:bad_request'"
                              ).fetchone()
    assert "bad_request" in err and "context length" in err and n == 1  # not retried


def test_bad_rows_stop_the_run_or_are_skipped(tmp_path, clean_sim):
    rows = [json.dumps(r) for r in prompt_rows(5)]
    rows.insert(3, '{"messages": [oops')
    write_jsonl(tmp_path / "a.jsonl", rows)
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}])
    cfg, outcome = go(path)
    assert outcome.state == "failed" and outcome.exit_code == 2  # bad input: as before the session
    assert "a.jsonl:4" in outcome.stop_reason and "skip_invalid" in outcome.stop_reason
    st = run_status(cfg.run_dir)
    # it fails fast: the rows before the bad one are admitted (pending), nothing is sent
    assert st["datasets"]["a"]["rows_read"] == 3 and st["datasets"]["a"]["pending"] == 3
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl",
                                                   "skip_invalid": True}])
    cfg, outcome = go(path)
    assert outcome.state == "finished"
    st = run_status(cfg.run_dir)["datasets"]["a"]
    assert (st["done"], st["rows_invalid"], st["rows_read"]) == (5, 1, 6)
    with Store.open(cfg.run_dir) as s:
        (row,) = s.conn.execute("SELECT row_index, line, reason FROM invalid_rows").fetchall()
    assert row[0] == 3 and row[1] == 4 and row[2]
    check_store(cfg.run_dir)


def test_duplicates_limits_and_weights(tmp_path, clean_sim):
    rows = prompt_rows(10)
    write_jsonl(tmp_path / "a.jsonl", rows + rows[:4])  # four duplicates
    write_jsonl(tmp_path / "b.jsonl", prompt_rows(30, "b"))
    path = write_config(tmp_path, clean_sim.url, [
        {"name": "a", "path": "a.jsonl"},
        {"name": "b", "path": "b.jsonl", "limit": 7}])
    cfg, outcome = go(path)
    assert outcome.state == "finished" and "limit reached: b" in outcome.stop_reason
    st = run_status(cfg.run_dir)["datasets"]
    assert (st["a"]["done"], st["a"]["rows_duplicate"]) == (10, 4)
    assert st["b"]["done"] == 7 and st["b"]["state"] == "limit_reached"
    check_store(cfg.run_dir)
    # raising the limit continues the dataset from its cursor
    path = write_config(tmp_path, clean_sim.url, [
        {"name": "a", "path": "a.jsonl"},
        {"name": "b", "path": "b.jsonl", "limit": 12}])
    go(path)
    assert run_status(cfg.run_dir)["datasets"]["b"]["done"] == 12
    check_store(cfg.run_dir)


def test_weighted_datasets_interleave(tmp_path, clean_sim):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(40, "a"))
    write_jsonl(tmp_path / "b.jsonl", prompt_rows(40, "b"))
    path = write_config(tmp_path, clean_sim.url, [
        {"name": "a", "path": "a.jsonl", "weight": 3.0, "limit": 30},
        {"name": "b", "path": "b.jsonl", "weight": 1.0, "limit": 10}],
        endpoint="concurrency = 2", extra="admit_window = 1")
    cfg, outcome = go(path)
    with Store.open(cfg.run_dir) as s:
        order = [d for (d,) in s.conn.execute("SELECT dataset FROM conversations ORDER BY id")]
    assert order.count("a") == 30 and order.count("b") == 10
    assert "b" in order[:8]  # interleaved, not one dataset after the other


def test_shards_are_disjoint_and_cover_everything(tmp_path, clean_sim):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(40))
    ids = []
    for i in range(3):
        path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}],
                            name=f"shard{i}")
        cfg, outcome = go(path, shard=f"{i}/3")
        assert outcome.state == "finished"
        with Store.open(cfg.run_dir) as s:
            ids.append({c for (c,) in s.conn.execute("SELECT conv_id FROM conversations")})
            assert s.get_meta("shard") == f"{i}/3"
        check_store(cfg.run_dir)
    assert sum(map(len, ids)) == 40 and set().union(*ids) == {f"p{i}" for i in range(40)}
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}],
                        name="shard0")
    with pytest.raises(RunError, match="shard"):
        go(path, shard="1/3")
    with pytest.raises(RunError, match="shard"):
        go(path)


def test_config_change_is_refused_unless_force_new(tmp_path, clean_sim):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(5))
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}])
    cfg, _ = go(path)
    # a change that does not change results continues the run
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint="concurrency = 3\nmax_attempts = 9",
                        extra="[budget]\nmax_cost_usd = 5.0")
    go(path)
    # the tool-result policy changes what is sent: a resume under another one is refused
    strict = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl",
                                                     "tool_results": "strict"}])
    with pytest.raises(RunError, match="dataset 'a': tool_results: 'name' -> 'strict'"):
        go(strict)
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl",
                                                   "max_tokens": 77}],
                        sampling="max_tokens = 4096\ntemperature = 0.5")
    with pytest.raises(RunError) as exc:
        go(path)
    msg = str(exc.value)
    # silent: the model card decided it (docs/config.md); now set
    assert "sampling.temperature: unset -> 0.5" in msg and "max_tokens" in msg
    assert "--force-new" in msg
    cfg, outcome = go(path, force_new=True)
    assert outcome.state == "finished"
    old = list((cfg.run_dir / "previous").glob("state-*.sqlite"))
    assert len(old) == 1
    with Store.open(old[0]) as s:  # the paid-for results are still there
        assert s.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 5
    with Store.open(cfg.run_dir) as s:
        assert json.loads(s.get_meta("config_json"))["sampling"]["temperature"] == 0.5
        body = unpack_json(s.conn.execute("SELECT request FROM results").fetchone()[0])
        assert body["messages"]


def test_adaptive_concurrency_backs_off_on_429(tmp_path):
    sim = SimProcess(tmp_path, "retry_after_s = 0.01\n" + CLEAN + "[faults]\nrate_limit = 0.5\n",
                     name="busy")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(60))
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="concurrency = 32\nmin_concurrency = 4")
        cfg, outcome = go(path)
    finally:
        sim.stop()
    assert outcome.state == "finished"
    with Store.open(cfg.run_dir) as s:
        events = [d for (d,) in s.conn.execute(
            "SELECT detail FROM events WHERE kind='concurrency'")]
    assert events and "rate_limit: concurrency lowered to" in events[0]
    live = json.loads((cfg.run_dir / "live.json").read_text())
    assert live["concurrency_backoffs"] >= 1 and live["concurrency_limit"] >= 4
    assert run_status(cfg.run_dir)["datasets"]["a"]["done"] == 60


def test_unreadable_source_fails_with_its_reason(tmp_path, clean_sim):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("not a dataset")
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "folder"}])
    cfg, outcome = go(path)
    assert outcome.state == "failed" and outcome.exit_code == 2
    assert outcome.stop_reason.startswith("dataset 'a': cannot read")
    assert run_status(cfg.run_dir)["state"] == "failed"


def test_two_base_urls_share_the_load(tmp_path, clean_sim):
    other = SimProcess(tmp_path, CLEAN, name="second")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(40))
        path = tmp_path / "two.toml"
        text = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}]
                            ).read_text()
        path.write_text(text.replace(f'base_url = "{clean_sim.url}"',
                                     f'base_url = ["{clean_sim.url}", "{other.url}"]'))
        cfg, outcome = go(path)
        assert outcome.state == "finished"
        with Store.open(cfg.run_dir) as s:
            urls = dict(s.conn.execute("SELECT base_url, COUNT(*) FROM attempts GROUP BY 1"))
    finally:
        other.stop()
    assert set(urls) == {clean_sim.url, other.url} and min(urls.values()) >= 10


def test_an_answer_that_breaks_the_normaliser_is_quarantined_not_fatal(tmp_path, clean_sim):
    import dataclasses

    from specgen.engine.stages import default_stages

    real = default_stages()
    answers: dict[str | None, int] = {}

    def flaky_normalize(resp, **kw):
        # every third answer fails, counted by answer id: a count-guided repair normalises
        # candidates of an answer again (same id), which must not shift the count
        nth = answers.setdefault(resp.id, len(answers) + 1)
        if nth % 3 == 0:
            raise KeyError("a field the normaliser did not expect")
        return real.normalize(resp, **kw)

    write_jsonl(tmp_path / "a.jsonl", prompt_rows(12))
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}],
                        sampling="max_tokens = 4096\nmodel_defaults = false")
    cfg, outcome = go(path, stages=dataclasses.replace(real, normalize=flaky_normalize))
    assert outcome.state == "finished"
    st = run_status(cfg.run_dir)["datasets"]["a"]
    assert st["done"] == 8 and st["quarantined"] == 4
    assert st["quarantine_reasons"] == {"normalize_error": 4}
    check_store(cfg.run_dir)


def test_retry_failed_sends_failed_tasks_again(tmp_path, clean_sim):
    strict = SimProcess(tmp_path, CLEAN + "[faults]\nmoderation = 0.4\n", name="strict")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(20))
        path = write_config(tmp_path, strict.url, [{"name": "a", "path": "a.jsonl"}])
        cfg, outcome = go(path)
    finally:
        strict.stop()
    failed = run_status(cfg.run_dir)["datasets"]["a"]["failed"]
    assert outcome.state == "incomplete" and outcome.exit_code == 4 and failed > 0
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}])
    _, outcome = go(path)  # a plain rerun leaves failed tasks alone (and says so)
    assert outcome.state == "incomplete" and f"{failed} task(s) failed" in outcome.stop_reason
    assert run_status(cfg.run_dir)["datasets"]["a"]["failed"] == failed
    cfg, outcome = go(path, retry_failed=True)
    st = run_status(cfg.run_dir)["datasets"]["a"]
    assert outcome.state == "finished" and (st["done"], st["failed"]) == (20, 0)
    check_store(cfg.run_dir)


@pytest.mark.parametrize("cap", [3, 500_000])
def test_dedupe_within_a_session_and_across_sessions(tmp_path, clean_sim, monkeypatch, cap):
    from specgen.engine import admission

    monkeypatch.setattr(admission, "SEEN_CAP", cap)  # 3: past the cap, the store decides
    rows = prompt_rows(10)
    write_jsonl(tmp_path / "a.jsonl", rows + rows[:4])
    path = write_config(tmp_path, clean_sim.url, [{"name": "a", "path": "a.jsonl"}])
    cfg, _ = go(path)
    st = run_status(cfg.run_dir)["datasets"]["a"]
    assert (st["done"], st["rows_duplicate"]) == (10, 4)
    # rows appended later, some repeating earlier sessions' conversations
    write_jsonl(tmp_path / "a.jsonl", rows + rows[:4] + prompt_rows(3, "new") + rows[5:7])
    go(path)
    st = run_status(cfg.run_dir)["datasets"]["a"]
    assert (st["done"], st["rows_duplicate"], st["rows_read"]) == (13, 6, 19)
    check_store(cfg.run_dir)
