"""The engine against the API as it behaves today, over real sockets and real SQLite: the
in-flight spending budget (402), account budgets (402 credits, 403 limit_source), outages
(refused and reset connections, a dead endpoint), long Retry-After, answers from another
model, failed tasks and their exit code, --retry-failed with a fresh attempt budget.
"""

from __future__ import annotations

import socket

import pytest

from specgen.engine.outcome import EXIT_INCOMPLETE, EXIT_OK, EXIT_STOPPED
from specgen.engine.status import run_status
from specgen.store import Store, unpack_json
from test_engine_sim import go, outcomes
from test_engine_support import (
    SimProcess,
    check_store,
    prompt_rows,
    run_cli,
    wait_for,
    write_config,
    write_jsonl,
    wrong_model_sim,
)

CLEAN = """
[length]
distribution = "fixed"
tokens = 30
"""


def _events(run_dir, kind: str) -> list[str]:
    with Store.open(run_dir) as s:
        return [d for (d,) in s.conn.execute("SELECT detail FROM events WHERE kind=?", (kind,))]


def _refused(root: str) -> bool:
    host, port = root.rsplit("/", 1)[-1].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_settles_under_the_in_flight_budget_and_finishes(tmp_path):
    # Requests of max_tokens 4096 cost ~$0.0123 each at the dearest endpoint's price: a
    # budget of $0.2 holds ~16 of them while 200 are configured in flight.
    sim = SimProcess(tmp_path, """
in_flight_budget_usd = 0.2
in_flight_retry_after_s = 0.2
""" + CLEAN + """
[[providers]]
name = "Solo"
tag = "solo/int4"
quantization = "int4"
prompt_price_per_m = 0.6
completion_price_per_m = 3.0
latency_s = 0.15
""", name="budget")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(300))
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="concurrency = 200\nmax_attempts = 3")
        cfg, outcome = go(path)
        stats = sim.get("/sim/stats")[1]
    finally:
        sim.stop()
    assert (outcome.state, outcome.exit_code) == ("finished", EXIT_OK), outcome
    st = run_status(cfg.run_dir)["datasets"]["a"]
    assert (st["done"], st["failed"], st["pending"]) == (300, 0, 0)
    refused = outcomes(cfg.run_dir).get("retry:in_flight_budget", 0)
    assert refused > 0  # it did meet the budget (200 sent at once, ~16 fit) ...
    assert stats["failed"].get("in_flight_budget", 0) == refused
    with Store.open(cfg.run_dir) as s:
        t0, t1 = s.conn.execute("SELECT MIN(started_at), MAX(ended_at) FROM attempts"
                                ).fetchone()
        (late,) = s.conn.execute(
            "SELECT COUNT(*) FROM attempts WHERE outcome='retry:in_flight_budget' AND "
            "started_at > ?", (t0 + (t1 - t0) / 3,)).fetchone()
    assert late <= 10, (late, refused)  # ... and settled under it instead of bouncing
    notes = _events(cfg.run_dir, "concurrency")
    assert any("in-flight budget" in n for n in notes), notes
    check_store(cfg.run_dir)


@pytest.mark.timing
def test_outage_window_at_start_leaves_nothing_failed(tmp_path, caplog):
    # Connections are refused for the first 6 s: the start-up check waits for the API, and
    # the run then does all its work; max_attempts = 2 would have failed them if counted.
    sim = SimProcess(tmp_path, CLEAN + """
[[outages]]
start_s = 0.2
duration_s = 6
mode = "refuse"
""", name="down")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(40))
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="max_attempts = 2\noutage_probe_max = 2")
        wait_for(lambda: _refused(sim.root), timeout=10, what="the outage window")
        cfg, outcome = go(path)
    finally:
        sim.stop()
    assert (outcome.state, outcome.exit_code) == ("finished", EXIT_OK), outcome
    # it really met the outage: the start-up check found the API refusing and waited for it
    waits = [r.getMessage() for r in caplog.records if "waiting for it" in r.getMessage()]
    assert waits and all("cannot reach 127.0.0.1" in w for w in waits), caplog.text[-3000:]
    st = run_status(cfg.run_dir)["datasets"]["a"]
    assert (st["done"], st["failed"]) == (40, 0)
    check_store(cfg.run_dir)


def test_connections_reset_mid_run_are_an_outage_not_failures(tmp_path):
    sim = SimProcess(tmp_path, CLEAN + """
[[providers]]
name = "Slow"
tag = "slow/int4"
quantization = "int4"
latency_s = 0.25
[[outages]]
start_s = 2.5
duration_s = 4
mode = "reset"
""", name="flaky")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(200))
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="concurrency = 6\nmax_attempts = 2\n"
                                     "fetch_endpoints = false\ndialect = \"openrouter\"\n"
                                     "outage_probe_max = 1")
        cfg, outcome = go(path)
    finally:
        sim.stop()
    assert (outcome.state, outcome.exit_code) == ("finished", EXIT_OK), outcome
    st = run_status(cfg.run_dir)["datasets"]["a"]
    assert (st["done"], st["failed"]) == (200, 0)
    assert outcomes(cfg.run_dir).get("retry:unreachable", 0) > 0
    notes = _events(cfg.run_dir, "endpoint")
    assert any("endpoint down" in n for n in notes) and any("reachable again" in n
                                                            for n in notes), notes
    check_store(cfg.run_dir)


def test_a_dead_endpoint_stops_with_the_reason_and_work_pending(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}/api/v1"  # nothing listens there
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(10))
    # no start-up check: the engine itself finds the endpoint down
    path = write_config(tmp_path, url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint='fetch_endpoints = false\ndialect = "openrouter"\n'
                                 'outage_probe_max = 0.5', extra="outage_timeout = 3")
    res = run_cli(path)
    assert res.returncode == EXIT_STOPPED, (res.stdout, res.stderr)
    assert "endpoint unreachable since" in res.stdout and "finished" not in res.stdout
    assert "Traceback" not in res.stderr
    st = run_status(tmp_path / "run-dir")
    assert st["state"] == "stopped" and "endpoint unreachable" in st["stop_reason"]
    assert (st["datasets"]["a"]["failed"], st["datasets"]["a"]["done"]) == (0, 0)
    assert st["datasets"]["a"]["pending"] == 10 and st["datasets"]["a"]["state"] != "done"
    # the start-up check tells "cannot reach the host" apart from "not OpenRouter-like"
    path = write_config(tmp_path, url, [{"name": "a", "path": "a.jsonl"}], name="startup",
                        endpoint="outage_probe_max = 0.5", extra="outage_timeout = 2")
    res = run_cli(path)
    assert res.returncode == EXIT_STOPPED, (res.stdout, res.stderr)
    assert "cannot reach 127.0.0.1" in res.stdout + res.stderr


def test_answers_from_another_model_never_become_samples(tmp_path):
    sim = wrong_model_sim(tmp_path, "meta-llama/llama-3-8b", CLEAN)
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(40))
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}])
        cfg, outcome = go(path)
    finally:
        sim.stop()
    assert outcome.state == "finished", outcome
    assert outcomes(cfg.run_dir).get("rejected:wrong_model", 0) > 0
    with Store.open(cfg.run_dir) as s:
        models = {m for (m,) in s.conn.execute("SELECT model FROM results")}
        (n,) = s.conn.execute("SELECT COUNT(*) FROM results").fetchone()
        (cost,) = s.conn.execute("SELECT SUM(cost_usd) FROM attempts WHERE "
                                 "outcome='rejected:wrong_model'").fetchone()
    assert n == 40 and models == {"moonshotai/kimi-k2.5-20260127"}
    assert cost and cost > 0  # rejected answers are paid for, and counted


def test_spent_guardrail_budget_stops_cleanly_saying_until_when(tmp_path):
    sim = SimProcess(tmp_path, """
spend_limit_usd = 0.0005
spend_limit_source = "openrouter_guardrail_budget"
spend_limit_resets_at = "2026-12-03T00:00:00Z"
""" + CLEAN, name="guard")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(60))
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="concurrency = 2")
        res = run_cli(path)
    finally:
        sim.stop()
    assert res.returncode == EXIT_STOPPED, (res.stdout, res.stderr)
    assert "guardrail budget is spent" in res.stdout and "2026-12-03T00:00:00Z" in res.stdout
    st = run_status(tmp_path / "run-dir")
    assert st["state"] == "stopped" and st["datasets"]["a"]["failed"] == 0
    assert 0 < st["datasets"]["a"]["done"] < 60 and st["datasets"]["a"]["pending"] > 0


def test_request_heavier_than_the_whole_budget_ends_or_shrinks(tmp_path):
    sim = SimProcess(tmp_path, "in_flight_budget_usd = 0.004\n" + CLEAN, name="tiny")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(6))
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}])
        res = run_cli(path)
        assert res.returncode == EXIT_INCOMPLETE, (res.stdout, res.stderr)
        assert "incomplete" in res.stdout and "weight_exceeds_budget" in res.stdout
        assert "--retry-failed" in res.stdout
        st = run_status(tmp_path / "run-dir")
        assert st["datasets"]["a"]["state"] == "failed" and st["datasets"]["a"]["failed"] == 6
        # with shrink_max_tokens the request is retried with a max_tokens that fits
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                            name="shrink", extra="[budget]\nshrink_max_tokens = true")
        cfg, outcome = go(path)
    finally:
        sim.stop()
    assert outcome.state == "finished", outcome
    with Store.open(cfg.run_dir) as s:
        rows = s.conn.execute("SELECT repairs, request FROM results").fetchall()
    assert len(rows) == 6
    for repairs, request in rows:
        assert "max_tokens_shrunk:4096->" in repairs
        assert unpack_json(request)["max_tokens"] < 4096


def test_a_long_retry_after_pauses_the_endpoint_visibly(tmp_path):
    sim = SimProcess(tmp_path, "retry_after_s = 1.5\n" + CLEAN + """
[faults]
rate_limit = 0.15
""", name="slowdown")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(30))
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                            extra="retry_after_cap = 1")
        cfg, outcome = go(path)
        assert outcome.state == "finished", outcome
        assert any("paused until" in n for n in _events(cfg.run_dir, "endpoint"))
        # a wait longer than outage_timeout stops the run instead of parking it for a day
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                            name="day", extra="retry_after_cap = 1\noutage_timeout = 1")
        cfg, outcome = go(path)
    finally:
        sim.stop()
    assert (outcome.state, outcome.exit_code) == ("stopped", EXIT_STOPPED), outcome
    assert "asks to wait" in outcome.stop_reason


def test_failed_tasks_exit_nonzero_and_retry_failed_grants_fresh_attempts(tmp_path):
    broken = SimProcess(tmp_path, CLEAN + "[faults]\nmalformed_json = 1.0\n", name="broken")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(5))
        path = write_config(tmp_path, broken.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="max_attempts = 2")
        res = run_cli(path)
    finally:
        broken.stop()
    assert res.returncode == EXIT_INCOMPLETE, (res.stdout, res.stderr)
    assert "run incomplete: 5 task(s) failed (invalid_response 5)" in res.stdout
    assert "invalid_response: 5" in res.stdout and "gave up after 2 attempts" in res.stdout
    st = run_status(tmp_path / "run-dir")
    assert st["state"] == "incomplete" and st["datasets"]["a"]["state"] == "failed"
    assert st["failures"]["invalid_response"]["count"] == 5
    clean = SimProcess(tmp_path, CLEAN, name="clean")
    try:
        path = write_config(tmp_path, clean.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="max_attempts = 2")
        res = run_cli(path, "--retry-failed")
    finally:
        clean.stop()
    assert res.returncode == EXIT_OK, (res.stdout, res.stderr)
    with Store.open(tmp_path / "run-dir") as s:
        attempts = [n for (n,) in s.conn.execute("SELECT attempts FROM tasks")]
    assert attempts == [1] * 5  # a fresh attempt budget, not the 2 already spent
    check_store(tmp_path / "run-dir")


def test_an_empty_dataset_warns_and_the_rest_runs(tmp_path):
    sim = SimProcess(tmp_path, CLEAN, name="plain")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(3))
        (tmp_path / "empty.jsonl").write_text("\n\n")
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"},
                                                {"name": "nothing", "path": "empty.jsonl"}])
        res = run_cli(path)
    finally:
        sim.stop()
    assert res.returncode == EXIT_OK, (res.stdout, res.stderr)
    assert "dataset 'nothing'" in res.stderr and "has no rows" in res.stderr
    assert run_status(tmp_path / "run-dir")["datasets"]["a"]["done"] == 3
