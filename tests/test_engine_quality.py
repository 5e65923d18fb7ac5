"""Quality policed during a run, end to end: a real `specgen sim` process over HTTP, the real
store, `specgen run` / `provider` / `status` / `export` as processes (docs/quality.md,
"Policing and alarms")."""

from __future__ import annotations

import json
import subprocess

import pyarrow.parquet as pq

from specgen.engine.outcome import EXIT_OK, EXIT_STOPPED
from test_engine_support import (
    ENV,
    SPECGEN,
    WEATHER_TOOL,
    SimProcess,
    count,
    prompt_rows,
    run_cli,
    start_cli,
    status_json,
    wait_for,
    write_config,
    write_jsonl,
)

SIM = """
[length]
distribution = "fixed"
tokens = 40
[tool_calls]
rate = 0.7
max_parallel = 1
"""


def tool_prompts(n: int, start: int = 0) -> list[dict]:
    """Prompt-only rows that offer the weather tool."""
    return [{"id": f"w{i}", "tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": f"What is the weather in city {i}?"}]}
        for i in range(start, start + n)]


def provider(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECGEN, "provider", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def specgen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECGEN, *args], capture_output=True, text=True, timeout=120,
                          env=ENV)


def events(run_dir, kind: str) -> list[tuple]:
    from specgen.store import Store

    with Store.open(run_dir) as s:
        return s.conn.execute("SELECT ts, session, dataset, provider, detail FROM events "
                              "WHERE kind=? ORDER BY id", (kind,)).fetchall()


def held_markers(run_dir, task: int) -> bool:
    """The stored answer of a task held raw tool-call markers: its quarantined response's
    content, or the repair that recovered calls from content on a kept sample."""
    from specgen.store import Store, unpack_json

    with Store.open(run_dir) as s:
        quarantined = [unpack_json(r[0]) for r in s.conn.execute(
            "SELECT response FROM quarantine WHERE task=?", (task,))]
        repairs = [json.loads(r[0]) for r in s.conn.execute(
            "SELECT repairs FROM results WHERE task=?", (task,))]
    return (any("<|tool_calls_section_begin|>" in (q.get("content") or "") for q in quarantined)
            or any("tool_calls_from_content" in r for r in repairs))


def attempts_after(run_dir, ts: float) -> dict[str, int]:
    """Attempts (by provider) whose request was sent after `ts`."""
    from specgen.store import Store

    with Store.open(run_dir) as s:
        return dict(s.conn.execute("SELECT provider, COUNT(*) FROM attempts WHERE started_at > ? "
                                   "AND provider IS NOT NULL GROUP BY 1", (ts,)).fetchall())


def test_tools_ignored_stops_on_the_raw_marker_alarm_within_its_first_answers(tmp_path):
    sim = SimProcess(tmp_path, SIM + '[[providers]]\nname = "Deaf"\n'
                                     'quirks = { tools_ignored = 1.0 }\n')
    try:
        write_jsonl(tmp_path / "w.jsonl", tool_prompts(300))
        path = write_config(tmp_path, sim.url, [{"name": "tools", "path": "w.jsonl"}],
                            endpoint="concurrency = 4\n")
        out = run_cli(path)
    finally:
        sim.stop()
    run_dir = tmp_path / "run-dir"
    assert out.returncode == EXIT_STOPPED, out.stderr[-3000:]
    st = status_json(run_dir)
    reason = st["stop_reason"]
    assert st["state"] == "stopped" and "alarm raw_markers on dataset 'tools'" in reason
    assert "answers with raw tool-call markers" in reason and "> 20% after 20" in reason
    assert "alarm raw_markers" in out.stdout + out.stderr  # said where the user looks
    # its figures and example answers: task ids of answers that held markers
    (ts, _session, dataset, _p, detail), = events(run_dir, "alarm")
    assert dataset == "tools" and "(on_alarm = stop)" in detail
    examples = [int(t) for t in
                detail.split("examples: ", 1)[1].replace("task ", "").split(" (Deaf)")[:-1]
                for t in [t.strip(", ")]]
    assert examples
    for task in examples:  # real answers, and they did hold raw markers
        assert held_markers(run_dir, task), task
    # stopped before more budget went: the answers after the first 20 are those in flight
    answered = count(run_dir, "SELECT COUNT(*) FROM attempts WHERE outcome = 'ok' OR outcome "
                     "LIKE 'quarantined:%'")
    assert 20 <= answered <= 20 + 4
    assert st["datasets"]["tools"]["rows_read"] < 100  # the rest was never sent


def test_auto_exclude_drops_a_provider_below_schema_accuracy_and_allow_puts_it_back(tmp_path):
    sim = SimProcess(tmp_path, SIM.replace("rate = 0.7", "rate = 1.0")
                     + '[[providers]]\nname = "Good"\ntag = "good/fp8"\nquantization = "fp8"\n'
                     + '[[providers]]\nname = "Bad"\ntag = "bad/fp8"\nquantization = "fp8"\n'
                       'schema_violation_rate = 0.6\n')
    try:
        write_jsonl(tmp_path / "w.jsonl", tool_prompts(150))
        # redo_excluded = false: Bad's samples stay as they were, left out of the exports
        # (the redo: test_engine_blame)
        quality = ("[quality]\nauto_exclude = true\nmin_samples = 10\nwindow = 50\n"
                   "alarms = { schema_mismatch = false }\nredo_excluded = false\n")
        path = write_config(tmp_path, sim.url, [{"name": "tools", "path": "w.jsonl"}],
                            endpoint="concurrency = 4\n", extra=quality)
        out = run_cli(path)
        run_dir = tmp_path / "run-dir"
        assert out.returncode == EXIT_OK, out.stderr[-3000:]
        (ts, _s, _d, who, detail), = events(run_dir, "provider_excluded")
        assert who == "Bad" and "schema accuracy" in detail and "< 90%" in detail
        assert attempts_after(run_dir, ts).get("Bad") is None  # nothing sent to it since
        assert attempts_after(run_dir, ts).get("Good", 0) > 50
        st = status_json(run_dir)
        assert st["excluded_providers"]["Bad"]["by"] == "auto"
        assert count(run_dir, "SELECT COUNT(*) FROM results WHERE provider='Bad'") > 0
        # the exports hold only allowed providers, each sample with provider and quantization
        ex = specgen("export", str(run_dir), "--format", "tokens")
        assert ex.returncode == 0, ex.stderr
        table = pq.read_table(run_dir / "exports" / "tokens.parquet").to_pylist()
        assert table and {r["provider"] for r in table} == {"Good"}
        assert {r["quantization"] for r in table} == {"fp8"}
        manifest = json.loads((run_dir / "exports" / "tokens.manifest.json").read_text())
        assert manifest["excluded"]["by_reason"]["provider_excluded"] == count(
            run_dir, "SELECT COUNT(*) FROM results WHERE provider='Bad'")
        assert manifest["totals"]["providers"] == {"Good": len(table)}
        oa = specgen("export", str(run_dir), "--format", "openai")
        assert oa.returncode == 0, oa.stderr
        rows = [json.loads(x) for x in
                (run_dir / "exports" / "openai.jsonl").read_text().splitlines()]
        assert rows and all(r["providers"] == ["Good"] and r["quantizations"] == ["fp8"]
                            for r in rows)

        # put it back while no run is running; the resumed run sends to it again
        back = provider([str(run_dir), "--allow", "bad"])
        assert back.returncode == 0 and "'Bad' allowed back" in back.stdout, back.stderr
        assert status_json(run_dir)["excluded_providers"] == {}
        write_jsonl(tmp_path / "w.jsonl", tool_prompts(190))  # 40 rows more
        again = run_cli(path)
        assert again.returncode == EXIT_OK, again.stderr[-3000:]
        assert count(run_dir, "SELECT COUNT(*) FROM attempts WHERE session=2 AND "
                     "provider='Bad'") > 0
    finally:
        sim.stop()


def test_exclude_and_allow_by_hand_in_a_running_run(tmp_path):
    sim = SimProcess(tmp_path, SIM + '[[providers]]\nname = "A"\nlatency_s = 0.02\n'
                                     '[[providers]]\nname = "B"\nlatency_s = 0.02\n')
    try:
        write_jsonl(tmp_path / "p.jsonl", prompt_rows(3000))
        path = write_config(tmp_path, sim.url, [{"name": "p", "path": "p.jsonl"}],
                            endpoint="concurrency = 2\n")
        run_dir = tmp_path / "run-dir"
        proc = start_cli(path)
        try:
            wait_for(lambda: count(run_dir, "SELECT COUNT(*) FROM results") >= 10,
                     what="first results")
            ex = provider([str(run_dir), "--exclude", "A"])
            assert ex.returncode == 0 and "took it" in ex.stdout, ex.stderr
            wait_for(lambda: events(run_dir, "provider_excluded"), what="the exclusion")
            (ts, *_), = events(run_dir, "provider_excluded")
            wait_for(lambda: attempts_after(run_dir, ts).get("B", 0) >= 20, what="answers")
            assert "A" not in attempts_after(run_dir, ts)
            assert "A" in status_json(run_dir)["excluded_providers"]
            listed = provider([str(run_dir)])
            assert listed.returncode == 0 and "A: excluded (user)" in listed.stdout
            ok = provider([str(run_dir), "--allow", "A"])
            assert ok.returncode == 0 and "took it" in ok.stdout, ok.stderr
            wait_for(lambda: events(run_dir, "provider_allowed"), what="the allow")
            (ts2, *_), = events(run_dir, "provider_allowed")
            wait_for(lambda: attempts_after(run_dir, ts2).get("A", 0) >= 5, what="A again")
        finally:
            stop = specgen("stop", str(run_dir))
            proc.wait(60)
        assert stop.returncode == 0 and proc.returncode == EXIT_STOPPED
        assert status_json(run_dir)["excluded_providers"] == {}
    finally:
        sim.stop()


def test_pause_dataset_keeps_the_other_datasets_going(tmp_path):
    sim = SimProcess(tmp_path, SIM + '[[providers]]\nname = "Deaf"\n'
                                     'quirks = { tools_ignored = 1.0 }\n')
    try:
        write_jsonl(tmp_path / "w.jsonl", tool_prompts(200))
        write_jsonl(tmp_path / "p.jsonl", prompt_rows(30))
        path = write_config(tmp_path, sim.url, [{"name": "tools", "path": "w.jsonl"},
                                                {"name": "plain", "path": "p.jsonl"}],
                            endpoint="concurrency = 4\n",
                            extra='[quality]\non_alarm = "pause_dataset"\n')
        out = run_cli(path)
    finally:
        sim.stop()
    run_dir = tmp_path / "run-dir"
    assert out.returncode == EXIT_STOPPED, out.stderr[-3000:]
    st = status_json(run_dir)
    assert st["datasets"]["tools"]["state"] == "paused"
    assert st["datasets"]["tools"]["rows_read"] < 100
    assert st["datasets"]["plain"]["state"] == "done" and st["datasets"]["plain"]["done"] == 30
    assert "tools paused by alarm raw_markers" in st["stop_reason"]


def test_a_hidden_quantization_mix_is_rejected_recorded_and_policed(tmp_path):
    sim = SimProcess(tmp_path, SIM
                     + '[[providers]]\nname = "Mixed"\ntag = "mixed/int4"\nquantization = "int4"\n'
                       'actual_quantization = "nvfp4"\nactual_quantization_rate = 0.5\n'
                     + '[[providers]]\nname = "Clean"\ntag = "clean/int4"\n'
                       'quantization = "int4"\n')
    try:
        write_jsonl(tmp_path / "p.jsonl", prompt_rows(120))
        path = write_config(
            tmp_path, sim.url, [{"name": "p", "path": "p.jsonl"}],
            endpoint='concurrency = 4\n[endpoint.provider]\nquantizations = ["int4"]\n',
            extra="[quality]\nauto_exclude = true\nmin_samples = 10\n")
        out = run_cli(path)
    finally:
        sim.stop()
    run_dir = tmp_path / "run-dir"
    assert out.returncode == EXIT_OK, out.stderr[-3000:]
    # the endpoint list says int4 for both; the answers that say nvfp4 are not kept
    assert count(run_dir, "SELECT COUNT(*) FROM attempts WHERE provider='Mixed' AND "
                 "outcome='rejected:quantization:nvfp4'") > 0
    assert count(run_dir, "SELECT COUNT(*) FROM results WHERE quantization != 'int4'") == 0
    assert count(run_dir, "SELECT COUNT(*) FROM results WHERE quantization IS NULL") == 0
    (_ts, _s, _d, who, detail), = events(run_dir, "provider_excluded")
    assert who == "Mixed" and "model/quantization mismatch rate" in detail
