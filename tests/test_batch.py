"""`mode = "batch"` (docs/batch.md) in real processes: `specgen run` against the simulator's
Batch API (`specgen sim` as its own process where the run is killed, so the batches outlive
it), real SQLite, `kill -9`.

* a batch run's samples equal a live run's of the same config and simulator seed, id for id,
  with several turns going out as one batch per round;
* `kill -9` right after the submission, and between the provider accepting a batch and the
  store recording its id, then a rerun: the batch is collected, one submission in total;
* failed and expired lines are retried in later batches (or live with batch_fallback);
* the simulator's Batch API shape: upload, create, get, list with metadata, content, cancel;
* the config refuses what batch mode cannot do, naming the key.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import time
import uuid

import pytest

from specgen.config import ConfigError, load_config
from test_engine_support import (
    SPECGEN,
    check_store,
    count,
    multi_turn_rows,
    prompt_rows,
    run_cli,
    start_cli,
    status_json,
    stop_run,
    tool_rows,
    wait_for,
    write_config,
    write_jsonl,
)
from test_sim_support import SimProcess

SIM = """
batch_processing_s = {processing}
batch_create_delay_s = {create_delay}
batch_line_fail_rate = {fail}
batch_expire_rate = {expire}
[length]
distribution = "fixed"
tokens = 30
"""

BATCH = ('mode = "batch"\nbatch_poll_interval = 0.2\nbatch_linger_s = 0.3\n'
         'concurrency = 500\n')


def sim_text(processing=0.5, create_delay=0.0, fail=0.0, expire=0.0) -> str:
    return SIM.format(processing=processing, create_delay=create_delay, fail=fail,
                      expire=expire)


def samples(run_dir) -> dict[tuple, tuple]:
    """{(dataset, conv_id, turn): (input_ids, n_prompt, true completion ids)}."""
    db = sqlite3.connect(run_dir / "state.sqlite")
    try:
        return {(d, c, t): (bytes(ids), n, bytes(true or b"")) for d, c, t, ids, n, true in
                db.execute("SELECT r.dataset, c.conv_id, r.turn, r.input_ids, r.n_prompt, "
                           "r.true_completion_ids FROM results r "
                           "JOIN conversations c ON c.id = r.conversation")}
    finally:
        db.close()


def live_batches(run_dir) -> dict:
    """The running session's batch figures, read from live.json itself (a `status` process
    can take seconds on a loaded machine: longer than a short batch runs)."""
    try:
        return json.loads((run_dir / "live.json").read_text()).get("batches") or {}
    except (OSError, ValueError):
        return {}


def sim_stats(sim: SimProcess) -> dict:
    status, _, body = sim.request("GET", "/sim/stats")
    assert status == 200
    return json.loads(body)


def hold_batches(sim: SimProcess, held: bool = True) -> None:
    """While held, no batch of `sim` completes (it stays `finalizing`; a cancel still ends it):
    what a test sees of a running batch does not race the clock of a loaded machine."""
    status, _, _ = sim.request("POST", "/sim/batches/hold" if held else "/sim/batches/release")
    assert status == 200


def batch_run(tmp_path, sim: SimProcess, rows: int, endpoint: str = BATCH, **config):
    """Dataset "a" of `rows` prompts, a batch-mode config against `sim`: (config, run dir)."""
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(rows))
    path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint=endpoint, **config)
    return path, tmp_path / "run-dir"


def test_batch_run_equals_live_run_id_for_id(tmp_path):
    (tmp_path / "sim.toml").write_text(sim_text())
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(30))
    write_jsonl(tmp_path / "m.jsonl", multi_turn_rows(12))
    write_jsonl(tmp_path / "t.jsonl", tool_rows(8))
    datasets = [{"name": "a", "path": "a.jsonl"},
                {"name": "m", "path": "m.jsonl", "turns": "all"},
                {"name": "t", "path": "t.jsonl", "turns": "all"}]
    extra = '[sim]\nconfig = "sim.toml"\nseed = 7\n'
    live = write_config(tmp_path, "sim", datasets, name="live", endpoint="stream = false\n",
                        sampling="max_tokens = 4096\n" + extra)
    batch = write_config(tmp_path, "sim", datasets, name="batch", endpoint=BATCH,
                         sampling="max_tokens = 4096\n" + extra)
    for path in (live, batch):
        out = run_cli(path, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
    a, b = samples(tmp_path / "live-dir"), samples(tmp_path / "batch-dir")
    assert sum(k[0] != "t" for k in a) == 30 + 12 * 2
    assert sum(k[0] == "t" for k in a) >= 8  # tool loops: a round per answer
    assert a == b  # the same samples, id for id
    # each round of the multi-turn conversations went into its own batch
    assert count(tmp_path / "batch-dir", "SELECT COUNT(*) FROM batches") >= 2
    assert count(tmp_path / "batch-dir",
                 "SELECT COUNT(*) FROM batches WHERE state='completed'") == count(
        tmp_path / "batch-dir", "SELECT COUNT(*) FROM batches")
    check_store(tmp_path / "batch-dir")
    # the report's batch timeline (and none for the live run)
    report = subprocess.run([*SPECGEN, "report", str(tmp_path / "batch-dir"), "--text"],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "Batches (timeline)" in report.stdout and "saved $" in report.stdout
    live_report = subprocess.run([*SPECGEN, "report", str(tmp_path / "live-dir"), "--text"],
                                 capture_output=True, text=True, timeout=120)
    assert live_report.returncode == 0 and "Batches (timeline)" not in live_report.stdout


@pytest.mark.parametrize("api", ["openai", "openrouter"])
@pytest.mark.parametrize("phase", ["after_submission", "before_the_id_is_stored"])
def test_kill_9_then_rerun_submits_once(tmp_path, phase, api):
    delay = 3.0 if phase == "before_the_id_is_stored" else 0.0
    sim = SimProcess(tmp_path, sim_text(processing=4.0, create_delay=delay))
    try:
        path, run_dir = batch_run(tmp_path, sim, 40, BATCH + f'batch_api = "{api}"\n')
        proc = start_cli(path)
        try:
            if phase == "after_submission":
                wait_for(lambda: count(run_dir, "SELECT COUNT(*) FROM batches WHERE "
                                                "provider_id IS NOT NULL"), timeout=120,
                         what="a submitted batch in the store")
            else:
                wait_for(lambda: sim_stats(sim)["batches"]["submitted"] == 1, timeout=120,
                         what="the sim accepting the batch")
                assert count(run_dir, "SELECT COUNT(*) FROM batches WHERE "
                                      "provider_id IS NOT NULL") == 0
                # sent, maybe created: a rerun looks for it, never resends it blindly
                assert count(run_dir, "SELECT COUNT(*) FROM batches WHERE state='sending'") == 1
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert count(run_dir, "SELECT COUNT(*) FROM results") == 0  # nothing collected yet
        out = run_cli(path, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        stats = sim_stats(sim)
        assert stats["batches"]["submitted"] == 1  # found and collected, never sent again
        assert stats["batches"]["lines"] == 40
        # the wire shape: an uploaded file (openai), the lines inline (openrouter)
        assert count(run_dir, "SELECT COUNT(*) FROM batches WHERE input_file_id IS NOT NULL"
                     ) == (1 if api == "openai" else 0)
        assert count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status='done'") == 40
        assert count(run_dir, "SELECT COUNT(*) FROM results") == 40
        check_store(run_dir)
    finally:
        sim.stop()


def test_failed_and_expired_lines_are_retried_in_later_batches(tmp_path):
    sim = SimProcess(tmp_path, sim_text(processing=0.3, fail=0.25, expire=0.15))
    try:
        path, run_dir = batch_run(tmp_path, sim, 40)
        out = run_cli(path, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status='done'") == 40
        assert count(run_dir, "SELECT COUNT(*) FROM attempts WHERE outcome='retry:server'") > 0
        assert count(run_dir, "SELECT COUNT(*) FROM attempts WHERE outcome='retry:timeout'") > 0
        assert count(run_dir, "SELECT COUNT(*) FROM batches WHERE state='expired'") > 0
        stats = sim_stats(sim)
        assert stats["batches"]["submitted"] > 1
        assert stats["batches"]["lines"] == count(run_dir, "SELECT COUNT(*) FROM batch_lines")
        check_store(run_dir)
    finally:
        sim.stop()


def test_batch_fallback_live_answers_failed_lines_live(tmp_path):
    sim = SimProcess(tmp_path, sim_text(processing=0.3, fail=0.3))
    try:
        path, run_dir = batch_run(tmp_path, sim, 30, BATCH + 'batch_fallback = "live"\n')
        out = run_cli(path, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status='done'") == 30
        stats = sim_stats(sim)
        failed = count(run_dir, "SELECT COUNT(*) FROM batch_lines WHERE outcome LIKE 'error:%'")
        assert failed > 0
        assert stats["batches"]["submitted"] == 1  # the failed lines went live, not batched
        assert stats["batches"]["lines"] == 30
        # the answered lines in the batch, the failed ones live, each once
        assert stats["requests"] == 30
        assert count(run_dir, "SELECT COUNT(*) FROM attempts WHERE outcome='retry:server'") == failed
        check_store(run_dir)
    finally:
        sim.stop()


# -- the simulator's Batch API shape ------------------------------------------------------
def multipart(fields: dict[str, tuple[str | None, bytes]]) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    out = b""
    for name, (filename, data) in fields.items():
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += (f"--{boundary}\r\nContent-Disposition: {disp}\r\n\r\n").encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_sim_batch_api_shape(tmp_path):
    sim = SimProcess(tmp_path, sim_text(processing=1.0))
    try:
        body = {"model": "moonshotai/kimi-k2.5", "max_tokens": 200, "stream": False,
                "messages": [{"role": "user", "content": "hello"}]}
        lines = b"".join(json.dumps({"custom_id": f"c{i}", "method": "POST",
                                     "url": "/v1/chat/completions", "body": body}).encode()
                         + b"\n" for i in range(3))
        data, ctype = multipart({"purpose": (None, b"batch"), "file": ("in.jsonl", lines)})
        status, _, raw = sim.request("POST", "/v1/files", data, {"Content-Type": ctype})
        assert status == 200, raw
        fid = json.loads(raw)["id"]
        status, _, raw = sim.request("POST", "/v1/batches", {
            "input_file_id": fid, "endpoint": "/v1/chat/completions",
            "completion_window": "24h", "metadata": {"specgen_batch": "tag-1"}})
        assert status == 200, raw
        b = json.loads(raw)
        assert b["status"] == "validating" and b["request_counts"]["total"] == 3
        status, _, raw = sim.request("GET", "/v1/batches?limit=10")
        listed = json.loads(raw)
        assert [x["metadata"] for x in listed["data"]] == [{"specgen_batch": "tag-1"}]

        def done():
            return json.loads(sim.request("GET", f"/v1/batches/{b['id']}")[2])
        final = wait_for(lambda: (x := done())["status"] == "completed" and x, timeout=30)
        assert final["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        status, _, raw = sim.request("GET", f"/v1/files/{final['output_file_id']}/content")
        out = [json.loads(line) for line in raw.splitlines()]
        assert sorted(x["custom_id"] for x in out) == ["c0", "c1", "c2"]
        assert all(x["response"]["status_code"] == 200 for x in out)
        assert all(x["response"]["body"]["usage"]["completion_tokens"] > 0 for x in out)
        # a batch cancelled while it runs ends `cancelled`
        status, _, raw = sim.request("POST", "/v1/batches", {
            "input_file_id": fid, "endpoint": "/v1/chat/completions",
            "completion_window": "24h"})
        second = json.loads(raw)
        status, _, raw = sim.request("POST", f"/v1/batches/{second['id']}/cancel", {})
        assert status == 200
        wait_for(lambda: json.loads(sim.request("GET", f"/v1/batches/{second['id']}")[2])[
            "status"] == "cancelled", timeout=30)
        stats = sim_stats(sim)["batches"]
        assert stats["submitted"] == 2 and stats["cancelled"] == 1
        status, _, raw = sim.request("POST", "/v1/files", b"x", {"Content-Type": "text/plain"})
        assert status == 400
    finally:
        sim.stop()


# -- config ---------------------------------------------------------------------------------
def write_batch_config(tmp_path, endpoint: str = "", budget: str = ""):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(1))
    text = write_config(tmp_path, "https://api.moonshot.ai/v1", [{"name": "a", "path": "a.jsonl"}],
                        endpoint='mode = "batch"\n' + endpoint).read_text()
    if budget:
        text = text.replace("[engine]", f"[budget]\n{budget}\n[engine]")
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("endpoint, budget, key", [
    ('batch_api = "openrouter"\nbatch_max_requests = 6000\n', "", "endpoint.batch_max_requests"),
    ('batch_api = "other"\n', "", "batch_api"),
    ('completion_window = "1 day"\n', "", "endpoint.completion_window"),
    ("batch_max_requests = 60000\n", "", "endpoint.batch_max_requests"),
    ("batch_max_bytes = 10\n", "", "endpoint.batch_max_bytes"),
    ("batch_poll_interval = 0\n", "", "endpoint.batch_poll_interval"),
    ('batch_fallback = "maybe"\n', "", "batch_fallback"),
    ("", "batch_price_factor = 1.5", "budget.batch_price_factor"),
    ('batch_files_path = "/v1/files"\n', "", "endpoint.batch_files_path"),
    ('batch_batches_path = "batches?x=1"\n', "", "endpoint.batch_batches_path"),
])
def test_config_refuses_bad_batch_settings(tmp_path, endpoint, budget, key):
    with pytest.raises(ConfigError) as exc:
        load_config(write_batch_config(tmp_path, endpoint, budget))
    assert key in str(exc.value)


def test_batch_mode_takes_a_live_config_with_stream_true(tmp_path, caplog):
    """Issue 35: adding `mode = "batch"` to the quickstart (stream = true) failed; the first
    try works now, and says the key has no effect."""
    caplog.set_level("WARNING", logger="specgen.config")
    cfg = load_config(write_batch_config(tmp_path, "stream = true\n"))
    assert cfg.endpoint.mode == "batch" and cfg.endpoint.stream is False
    assert any("endpoint.stream = true has no effect" in r.getMessage() for r in caplog.records)


def test_config_batch_defaults(tmp_path):
    cfg = load_config(write_batch_config(tmp_path))
    assert cfg.endpoint.mode == "batch" and cfg.endpoint.stream is False
    text = (tmp_path / "c.toml").read_text().replace("concurrency = 16\n", "")
    (tmp_path / "c.toml").write_text(text)
    cfg = load_config(tmp_path / "c.toml")
    assert cfg.endpoint.concurrency == cfg.endpoint.batch_max_requests == 5000


@pytest.mark.parametrize("api", ["openai", "openrouter"])
def test_stop_leaves_batches_running_and_stop_now_cancels_them(tmp_path, api):
    sim = SimProcess(tmp_path, sim_text(processing=1.0))
    endpoint = BATCH + f'batch_api = "{api}"\n'
    try:
        path, run_dir = batch_run(tmp_path, sim, 20, endpoint)
        hold_batches(sim)
        proc = start_cli(path)
        try:
            wait_for(lambda: live_batches(run_dir).get("eta_s") is not None, timeout=120,
                     what="an ETA from the provider's progress")
            shown = status_json(run_dir)["batches"]
            assert shown["batches"] == 1 and shown["lines"] == {"waiting": 20}
            assert set(shown["by_state"]) <= {"validating", "in_progress", "finalizing"}
            stop, out, err = stop_run(run_dir, proc)
        finally:
            proc.kill()
        assert stop.returncode == 0, stop.stderr
        assert proc.returncode == 5, out + err
        assert sim_stats(sim)["batches"]["cancelled"] == 0  # it runs on, paid for
        assert count(run_dir, "SELECT COUNT(*) FROM results") == 0
        hold_batches(sim, False)
        out = run_cli(path, timeout=300)  # collects it
        assert out.returncode == 0, out.stdout + out.stderr
        assert "saved $" in out.stdout
        text = subprocess.run([*SPECGEN, "status", str(run_dir)], capture_output=True,
                              text=True, timeout=60)
        assert "batches: 1 (completed 1); lines 20 answered" in text.stdout, text.stdout
        assert sim_stats(sim)["batches"]["submitted"] == 1
        assert count(run_dir, "SELECT COUNT(*) FROM results") == 20

        # stop --now cancels the batch at the provider and says so
        write_jsonl(tmp_path / "b.jsonl", prompt_rows(10, prefix="q"))
        path = write_config(tmp_path, sim.url, [{"name": "b", "path": "b.jsonl"}],
                            name="now", endpoint=endpoint)
        run_dir = tmp_path / "now-dir"
        hold_batches(sim)
        proc = start_cli(path)
        try:
            wait_for(lambda: count(run_dir, "SELECT COUNT(*) FROM batches WHERE "
                                            "provider_id IS NOT NULL"), timeout=120,
                     what="a submitted batch")
            stop = subprocess.run([*SPECGEN, "stop", "--now", str(run_dir)],
                                  capture_output=True, text=True, timeout=90)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert stop.returncode == 0, stop.stderr
        assert proc.returncode == 3, out + err
        assert "cancelled at the provider" in out + err
        assert sim_stats(sim)["batches"]["cancelled"] == 1
        hold_batches(sim, False)
        out = run_cli(path, timeout=300)  # what the cancelled batch answered, then the rest
        assert out.returncode == 0, out.stdout + out.stderr
        assert count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status='done'") == 10
        check_store(run_dir)
    finally:
        sim.stop()


def test_the_dollar_cap_counts_submitted_lines_at_their_worst_case(tmp_path):
    sim = SimProcess(tmp_path, sim_text(processing=0.3))
    try:
        path, run_dir = batch_run(tmp_path, sim, 40, sampling="max_tokens = 2000")
        text = path.read_text().replace("[engine]", "[budget]\nmax_cost_usd = 0.02\n[engine]")
        path.write_text(text)
        out = run_cli(path, timeout=300)
        assert out.returncode in (0, 5), out.stdout + out.stderr
        prices = status_json(run_dir)["prices"]
        assert "batch" in prices["source"]
        worst = 2000 * prices["completion_per_m"] / 1e6  # a line's completion at its worst
        db = sqlite3.connect(run_dir / "state.sqlite")
        sizes = [n for (n,) in db.execute("SELECT lines FROM batches ORDER BY created_at")]
        db.close()
        assert sizes and sizes[0] < 40  # the cap held lines back from the first batch
        assert sizes[0] * worst <= 0.02
        assert status_json(run_dir)["cost_usd"] <= 0.02
    finally:
        sim.stop()


def test_preview_shows_the_batch_lines_and_the_price_against_live(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(5))
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}], endpoint=BATCH)
    path.write_text(path.read_text().replace("[engine]",
                                             "[budget]\nbatch_price_factor = 0.6\n[engine]"))
    out = subprocess.run([*SPECGEN, "preview", str(path), "--json", "-n", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    sample = got["datasets"][0]["samples"][0]
    line = sample["body"]
    assert set(line) == {"custom_id", "method", "url", "body"}
    assert line["url"] == "/v1/chat/completions" and line["method"] == "POST"
    assert line["body"]["stream"] is False and line["body"]["model"] == "moonshotai/kimi-k2.5"
    assert "batch" in got["prices"]["source"]
    assert got["live_worst_case_cost_usd"] == pytest.approx(got["worst_case_cost_usd"] / 0.6)
    text = subprocess.run([*SPECGEN, "preview", str(path), "-n", "1", "--no-color"],
                          capture_output=True, text=True, timeout=120)
    assert "at the batch price (live: $" in text.stdout


def test_a_stop_before_submission_submits_nothing(tmp_path):
    sim = SimProcess(tmp_path, sim_text())
    try:
        # the lines linger an hour: the stop comes first however slow the machine
        path, run_dir = batch_run(tmp_path, sim, 10,
                                  BATCH.replace("batch_linger_s = 0.3", "batch_linger_s = 3600"))
        proc = start_cli(path)
        try:
            wait_for(lambda: live_batches(run_dir).get("buffered") == 10,
                     timeout=120, what="10 lines waiting to be submitted")
            stop, out, err = stop_run(run_dir, proc)
        finally:
            proc.kill()
        assert stop.returncode == 0, stop.stderr
        assert proc.returncode == 5, out + err
        assert sim_stats(sim)["batches"]["submitted"] == 0
        assert count(run_dir, "SELECT COUNT(*) FROM batches") == 0
        # the rerun (the linger is no part of the results' config) submits them once
        path.write_text(path.read_text().replace("batch_linger_s = 3600", "batch_linger_s = 0.3"))
        out = run_cli(path, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert sim_stats(sim)["batches"]["submitted"] == 1
    finally:
        sim.stop()


@pytest.mark.parametrize("sampling, dataset, key", [
    ("temperature = 0.7", {}, "sampling.temperature"),
    ("top_p = 0.9", {}, "sampling.top_p"),
    ("extra = { presence_penalty = 0.5 }", {}, "sampling.extra.presence_penalty"),
    ("", {"temperature": [0.6, 1.0]}, "dataset[0] ('a').temperature"),
])
def test_moonshot_k25_batches_refuse_the_sampling_they_fix(tmp_path, sampling, dataset, key):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(1))
    path = write_config(tmp_path, "https://api.moonshot.ai/v1",
                        [{"name": "a", "path": "a.jsonl", **dataset}],
                        endpoint='mode = "batch"\n', sampling="max_tokens = 4096\n" + sampling)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert key in str(exc.value) and "fixes temperature, top_p" in str(exc.value)


def test_moonshot_k25_batch_lines_carry_no_fixed_sampling(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(2))
    path = write_config(tmp_path, "https://api.moonshot.ai/v1",
                        [{"name": "a", "path": "a.jsonl"}], endpoint='mode = "batch"\n')
    out = subprocess.run([*SPECGEN, "preview", str(path), "--json", "-n", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    sample = json.loads(out.stdout)["datasets"][0]["samples"][0]
    body = sample["body"]["body"]
    assert not {"temperature", "top_p", "n"} & set(body)
    assert sample["sampling"]["temperature"] == 1.0  # what the provider applies (thinking)
    # a live config of the same model sends them
    live = write_config(tmp_path, "https://api.moonshot.ai/v1",
                        [{"name": "a", "path": "a.jsonl"}], name="live")
    out = subprocess.run([*SPECGEN, "preview", str(live), "--json", "-n", "1"],
                         capture_output=True, text=True, timeout=120)
    assert "temperature" in json.loads(out.stdout)["datasets"][0]["samples"][0]["body"]


def test_kill_9_at_random_points_never_submits_a_line_twice(tmp_path):
    rng = random.Random(22)
    sim = SimProcess(tmp_path, sim_text(processing=1.0))
    try:
        write_jsonl(tmp_path / "m.jsonl", multi_turn_rows(15))
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(30))
        path = write_config(tmp_path, sim.url, [
            {"name": "a", "path": "a.jsonl"}, {"name": "m", "path": "m.jsonl", "turns": "all"}],
            endpoint=BATCH.replace("batch_linger_s = 0.3", "batch_linger_s = 0.1")
            + "batch_max_requests = 20\n")
        run_dir = tmp_path / "run-dir"
        for _ in range(4):
            proc = start_cli(path)
            try:
                time.sleep(rng.uniform(0.8, 4.0))
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
        out = run_cli(path, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        tasks = 30 + 15 * 2
        assert count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status='done'") == tasks
        stats = sim_stats(sim)["batches"]
        assert stats["lines"] == tasks  # every task's line reached the provider once
        assert stats["submitted"] == count(run_dir, "SELECT COUNT(*) FROM batches "
                                                    "WHERE state != 'lost'")
        check_store(run_dir)
    finally:
        sim.stop()


# -- an independent batch server (not the simulator), with its own paths and purpose -------
class TinyBatchServer:
    """A minimal OpenAI-style batch server on 127.0.0.1 under /v2/uploads and /v2/jobs (upload
    purpose "batch-api", as Together's): every line answered with a canned completion, the
    batch completed when first read; it counts submissions."""

    def __init__(self):
        import http.server
        import threading
        from email.parser import BytesParser

        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict] = {}
        self.submissions = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, obj=None, raw=None):
                data = raw if raw is not None else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                if self.path == "/v2/uploads":
                    msg = BytesParser().parsebytes(
                        b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n"
                        + body)
                    parts = {p.get_param("name", header="content-disposition"): p.get_payload(
                        decode=True) for p in msg.get_payload()}
                    if parts.get("purpose") != b"batch-api":
                        return self.reply(400, {"error": {"message": "bad purpose"}})
                    fid = f"up-{len(outer.files)}"
                    outer.files[fid] = parts["file"]
                    return self.reply(200, {"id": fid})
                if self.path == "/v2/jobs":
                    req = json.loads(body)
                    outer.submissions += 1
                    bid = f"job-{len(outer.batches)}"
                    out = []
                    for line in outer.files[req["input_file_id"]].splitlines():
                        item = json.loads(line)
                        text = "Answer to: " + item["body"]["messages"][-1]["content"]
                        out.append(json.dumps({"custom_id": item["custom_id"], "response": {
                            "status_code": 200, "body": {
                                "id": "x", "model": item["body"]["model"], "choices": [{
                                    "index": 0, "finish_reason": "stop", "message": {
                                        "role": "assistant", "content": text}}]}}}))
                    outer.files[f"out-{bid}"] = ("\n".join(out) + "\n").encode()
                    outer.batches[bid] = {"id": bid, "status": "validating",
                                          "metadata": req.get("metadata"),
                                          "output_file_id": None,
                                          "request_counts": {"total": len(out)}}
                    return self.reply(200, outer.batches[bid])
                return self.reply(404, {"error": {"message": "no such path"}})

            def do_GET(self):
                path = self.path.split("?")[0]
                if path == "/v2/jobs":
                    return self.reply(200, {"data": list(outer.batches.values())[::-1],
                                            "has_more": False})
                if path.startswith("/v2/jobs/"):
                    b = outer.batches.get(path.rsplit("/", 1)[1])
                    if b is None:
                        return self.reply(404, {"error": {"message": "no such batch"}})
                    b.update(status="completed", output_file_id=f"out-{b['id']}")
                    return self.reply(200, b)
                if path.startswith("/v2/uploads/") and path.endswith("/content"):
                    return self.reply(200, raw=outer.files[path.split("/")[3]])
                return self.reply(404, {"error": {"message": "no such path"}})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()


def test_an_independent_batch_server_with_other_paths(tmp_path):
    server = TinyBatchServer()
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(12))
        path = write_config(tmp_path, server.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint=BATCH + 'batch_files_path = "v2/uploads"\n'
                            'batch_batches_path = "v2/jobs"\nbatch_file_purpose = "batch-api"\n'
                            'fetch_endpoints = false\napi_key_env = ""\n')
        path.write_text(path.read_text().replace('api_key_env = "SPECGEN_TEST_KEY"\n', ""))
        run_dir = tmp_path / "run-dir"
        out = run_cli(path, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert server.submissions == 1
        assert count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status='done'") == 12
        db = sqlite3.connect(run_dir / "state.sqlite")
        msgs = [json.loads(m)["content"] for (m,) in db.execute("SELECT message FROM results")]
        db.close()
        assert sorted(msgs)[0].startswith("Answer to: Question ")
        check_store(run_dir)
    finally:
        server.stop()


def test_batch_calls_go_through_endpoint_proxy(tmp_path):
    from proxy_server import ProxyServer

    server = TinyBatchServer()
    try:
        with ProxyServer(user="u", password="p4ss") as proxy:
            write_jsonl(tmp_path / "a.jsonl", prompt_rows(5))
            path = write_config(tmp_path, server.url, [{"name": "a", "path": "a.jsonl"}],
                                endpoint=BATCH + 'batch_files_path = "v2/uploads"\n'
                                'batch_batches_path = "v2/jobs"\n'
                                'batch_file_purpose = "batch-api"\nfetch_endpoints = false\n')
            path.write_text(path.read_text().replace(
                'api_key_env = "SPECGEN_TEST_KEY"\n', "").replace(
                "fetch_endpoints = false\n", 'fetch_endpoints = false\napi_key_env = ""\n'))
            run_dir = tmp_path / "run-dir"
            out = run_cli(path, timeout=300, env={"HTTP_PROXY": proxy.url("u", "p4ss"),
                                                  "NO_PROXY": ""})
            assert out.returncode == 0, out.stdout + out.stderr
            assert server.submissions == 1
            assert count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status='done'") == 5
            assert proxy.forwarded >= 4  # upload, create, poll, download
            assert any("/v2/jobs" in h for h in proxy.heads)
            assert "p4ss" not in (run_dir / "specgen.log").read_text()
    finally:
        server.stop()
