"""`specgen run` as a real process: SIGINT with drain, a second signal, `specgen stop` (and
--now) from another shell, `status` while running, and `kill -9` at random points followed by
resumes — every final store holds each task done exactly once and loses nothing committed."""

from __future__ import annotations

import random
import signal
import subprocess

import pytest

from specgen.store import Store
from test_engine_support import (
    SPECGEN,
    SimProcess,
    check_store,
    count,
    live_status,
    multi_turn_rows,
    prompt_rows,
    results_snapshot,
    run_cli,
    start_cli,
    status_json,
    stop_run,
    wait_for,
    write_config,
    write_jsonl,
)


def slow_sim(tmp, latency: float, name: str) -> SimProcess:
    return SimProcess(tmp, f"""
[length]
distribution = "fixed"
tokens = 30
[[providers]]
name = "Slow"
tag = "slow/bf16"
quantization = "bf16"
latency_s = {latency}
latency_jitter = 0.5
""", name=name)


@pytest.fixture(scope="module")
def sim_fast(tmp_path_factory):
    sim = slow_sim(tmp_path_factory.mktemp("simf"), 0.05, "fast")
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def sim_slow(tmp_path_factory):
    sim = slow_sim(tmp_path_factory.mktemp("sims"), 0.6, "slow")
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def sim_stuck(tmp_path_factory):
    sim = slow_sim(tmp_path_factory.mktemp("simx"), 30.0, "stuck")
    yield sim
    sim.stop()


def ok_attempts_per_done_task(run_dir) -> set[int]:
    with Store.open(run_dir) as s:
        return {n for (n,) in s.conn.execute(
            "SELECT COUNT(a.id) FROM tasks t LEFT JOIN attempts a ON a.task=t.id "
            "AND a.outcome='ok' WHERE t.status='done' GROUP BY t.id")}


@pytest.mark.timing
def test_sigint_drains_then_rerun_resumes(tmp_path, sim_slow):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(72))
    # 2 at a time, 0.6 s each: ~20 s of work left once 2 are done, for two `status`
    # processes to start and look on a busy machine (12 at a time left 3 s: it had finished)
    path = write_config(tmp_path, sim_slow.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint="concurrency = 2")
    run_dir = tmp_path / "run-dir"
    proc = start_cli(path)
    try:
        wait_for(lambda: count(run_dir, "SELECT COUNT(*) FROM results") >= 2, what="results")
        st = status_json(run_dir)  # status from another process while it runs
        assert st["state"] == "running" and st["pid"] == proc.pid
        assert st["live"]["in_flight"] > 0 and st["concurrency"] == 2
        assert set(st["datasets"]["a"]) >= {"total", "done", "failed", "pending",
                                            "prompt_tokens", "completion_tokens", "cost_usd"}
        plan = st["live"]["progress"]["datasets"]["a"]  # the source counted: 72 rows
        assert plan["rows_total"] == 72 and plan["planned_requests"] == 72
        assert plan["planned"] == "estimate" and plan["basis"] == "requests"
        text = subprocess.run([*SPECGEN, "status", str(run_dir)], capture_output=True,
                              text=True, timeout=60).stdout
        assert "progress" in text and "/~72 req" in text
        before = results_snapshot(run_dir)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 5, err  # stopped cleanly, work left: never 0
    assert "run stopped: signal SIGINT" in out and "rerun the same command to resume" in out
    assert count(run_dir, "SELECT COUNT(*) FROM attempts WHERE outcome='cancelled'") == 0
    st = status_json(run_dir)
    assert st["state"] == "stopped" and "SIGINT" in st["stop_reason"]
    assert 0 < st["datasets"]["a"]["done"] < 72
    # resume
    res = run_cli(path)
    assert res.returncode == 0, res.stderr
    after = results_snapshot(run_dir)
    assert len(after) == 72 and all(after[t] == v for t, v in before.items())
    assert ok_attempts_per_done_task(run_dir) == {1}
    check_store(run_dir)
    assert status_json(run_dir)["state"] == "finished"


def test_second_sigint_cancels_in_flight(tmp_path, sim_stuck):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(20))
    path = write_config(tmp_path, sim_stuck.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint="concurrency = 5")
    run_dir = tmp_path / "run-dir"
    proc = start_cli(path)
    try:
        wait_for(lambda: live_status(run_dir).get("in_flight") == 5, timeout=60,
                 what="5 requests in flight")
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "stopping (signal SIGINT)" in (run_dir / "specgen.log").read_text(),
                 what="drain started")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 3, err
    assert count(run_dir, "SELECT COUNT(*) FROM attempts WHERE outcome='cancelled'") == 5
    st = status_json(run_dir)
    a = st["datasets"]["a"]
    assert st["state"] == "stopped" and a["done"] == 0 and a["pending"] == a["total"] == 10


def test_specgen_stop_from_another_shell(tmp_path, sim_slow, sim_stuck):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(100))
    path = write_config(tmp_path, sim_slow.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint="concurrency = 8")
    run_dir = tmp_path / "run-dir"
    proc = start_cli(path)
    try:
        wait_for(lambda: count(run_dir, "SELECT COUNT(*) FROM results") >= 4, what="results")
        stop, out, err = stop_run(run_dir, proc)
    finally:
        proc.kill()
    assert stop.returncode == 0, stop.stderr
    assert "asked the run" in stop.stdout and "the run ended: state stopped" in stop.stdout
    assert proc.returncode == 5 and "specgen stop" in out
    assert count(run_dir, "SELECT COUNT(*) FROM attempts WHERE outcome='cancelled'") == 0
    again = subprocess.run([*SPECGEN, "stop", str(run_dir)], capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0 and "nothing to stop" in again.stdout

    # --now cancels what is in flight (a provider that never answers in time)
    path = write_config(tmp_path, sim_stuck.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint="concurrency = 4")
    proc = start_cli(path)
    try:
        wait_for(lambda: live_status(run_dir).get("in_flight") == 4, timeout=60,
                 what="in flight")
        stop = subprocess.run([*SPECGEN, "stop", "--now", str(path)], capture_output=True,
                              text=True, timeout=60)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert stop.returncode == 0 and "now" in stop.stdout, stop.stderr
    assert proc.returncode == 3, err
    assert count(run_dir, "SELECT COUNT(*) FROM attempts WHERE outcome='cancelled'") == 4
    check_store(run_dir)


def test_drain_timeout_cancels_what_is_left(tmp_path, sim_stuck):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(10))
    path = write_config(tmp_path, sim_stuck.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint="concurrency = 3")
    run_dir = tmp_path / "run-dir"
    proc = start_cli(path, "--drain-timeout", "1")
    try:
        wait_for(lambda: live_status(run_dir).get("in_flight") == 3, timeout=60,
                 what="in flight")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 3 and "drain timeout (1s) hit" in out, (out, err)
    assert count(run_dir, "SELECT COUNT(*) FROM attempts WHERE outcome='cancelled'") == 3


def test_kill_9_at_random_points_loses_nothing_committed(tmp_path, sim_fast):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(150))
    write_jsonl(tmp_path / "m.jsonl", multi_turn_rows(30))
    path = write_config(tmp_path, sim_fast.url, [{"name": "a", "path": "a.jsonl"},
                                                 {"name": "m", "path": "m.jsonl",
                                                  "turns": "all"}],
                        endpoint="concurrency = 16",
                        extra="commit_interval = 0.1")
    run_dir = tmp_path / "run-dir"
    rng = random.Random(1234)
    committed: dict[int, tuple] = {}
    kills = 0
    for round_ in range(5):
        proc = start_cli(path)
        try:
            # kill at a random point: sometimes before any request, mostly mid-run
            threshold = len(committed) + rng.choice([0, 5, 20, 40])
            if round_ == 0:
                threshold = 0
            wait_for(lambda t=threshold, p=proc, r=round_: p.poll() is not None or (
                count(run_dir, "SELECT COUNT(*) FROM results") >= t
                and count(run_dir, "SELECT COUNT(*) FROM sessions") > r), timeout=90,
                what="progress before the kill")
            snap = results_snapshot(run_dir)
            if proc.poll() is None:
                proc.kill()  # SIGKILL
                kills += 1
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        after = results_snapshot(run_dir)
        assert all(after.get(t) == v for t, v in snap.items()), "a committed result was lost"
        assert all(after.get(t) == v for t, v in committed.items())
        committed = after
        check_store(run_dir)
        st = status_json(run_dir)
        if proc.returncode == -9:
            assert st["state"] == "stopped" and "without a clean stop" in st["stop_reason"]
    assert kills >= 3
    res = run_cli(path)
    assert res.returncode == 0, res.stderr
    final = results_snapshot(run_dir)
    assert all(final[t] == v for t, v in committed.items())
    counts = check_store(run_dir)
    st = status_json(run_dir)
    assert st["state"] == "finished"
    assert st["datasets"]["a"]["done"] == 150 and st["datasets"]["m"]["done"] == 60
    assert counts["results"] == 210 and counts.get("pending", 0) == 0
    assert ok_attempts_per_done_task(run_dir) == {1}  # each task answered exactly once
    with Store.open(run_dir) as s:
        assert s.conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 6
        states = dict(s.conn.execute("SELECT state, COUNT(*) FROM sessions GROUP BY 1"))
        killed = s.conn.execute("SELECT COUNT(*) FROM sessions WHERE stop_reason LIKE "
                                "'interrupted: the process ended%'").fetchone()[0]
    assert "running" not in states and killed == kills  # dead sessions closed on restart


def test_a_second_engine_on_the_same_run_dir_is_refused(tmp_path, sim_slow):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(60))
    path = write_config(tmp_path, sim_slow.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint="concurrency = 2")
    run_dir = tmp_path / "run-dir"
    proc = start_cli(path)
    try:
        wait_for(lambda: count(run_dir, "SELECT COUNT(*) FROM sessions") == 1, what="session")
        second = run_cli(path, timeout=60)
        assert second.returncode == 2
        assert "another specgen run (pid" in second.stderr
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
