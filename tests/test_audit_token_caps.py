"""Token-in answers honour `[endpoint] max_answer_bytes` too (issue 25): an answer of sampled
ids and no text counts BYTES_PER_ID a token id, so a runaway token-in answer is quarantined
`answer_too_large` like a chat one (before, its size was 0 and it was kept whatever its
length). Real `specgen run` processes in `mode = "tokens"` against the simulator's vLLM- and
SGLang-shaped endpoints, streamed (cut by the client) and not (measured by the size stage)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from test_engine_support import SimProcess, prompt_rows, run_cli, write_config, write_jsonl

SIM = """
[length]
distribution = "fixed"
tokens = 200
[[providers]]
name = "engine"
"""


def _run(tmp_path, api: str, stream: bool, cap: int):
    sim = SimProcess(tmp_path, SIM)
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(4))
        path = write_config(
            tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
            endpoint=f'mode = "tokens"\ntoken_api = "{api}"\nstream = {str(stream).lower()}\n'
                     f"fetch_endpoints = false\nmax_answer_bytes = {cap}\n"
                     "quarantine_retries = 0")
        res = run_cli(path)
    finally:
        sim.stop()
    return res, sqlite3.connect(tmp_path / "run-dir" / "state.sqlite")


@pytest.mark.parametrize("api,stream", [("vllm", True), ("vllm", False), ("sglang", False)])
def test_a_token_in_answer_beyond_max_answer_bytes_is_quarantined(tmp_path, api, stream):
    res, db = _run(tmp_path, api, stream, cap=400)  # 200 ids x 4 = 800 bytes > 400
    out = res.stdout + res.stderr
    assert "Traceback" not in out
    assert res.returncode == 6, out[-3000:]  # every answer quarantined: unproductive
    rows = db.execute("SELECT reason, detail FROM quarantine").fetchall()
    assert rows and {r for r, _ in rows} == {"answer_too_large"}, rows
    detail = json.loads(rows[0][1])
    assert detail["max_answer_bytes"] == 400 and detail["bytes"] > 400, detail
    assert detail["cut"] is stream, detail
    assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 0


def test_a_token_in_answer_within_max_answer_bytes_is_kept(tmp_path):
    res, db = _run(tmp_path, "vllm", True, cap=4000)  # 800 bytes of ids: under the cap
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    assert db.execute("SELECT COUNT(*) FROM quarantine").fetchone()[0] == 0
    assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 4
