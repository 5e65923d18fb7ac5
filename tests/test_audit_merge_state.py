"""A merged run's state says which shards were unfinished or missing (third reliability
audit): `specgen merge` of one shard of two is not "finished" — real processes."""

from __future__ import annotations

import json
import subprocess

from test_engine_support import ENV, SPECGEN, prompt_rows, run_cli, write_config, write_jsonl


def test_merging_one_shard_of_two_says_the_other_is_missing(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(12))
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}])
    res = run_cli(path, "--shard", "0/2")
    assert res.returncode == 0, res.stderr[-2000:]
    merged = tmp_path / "merged"
    res = subprocess.run([*SPECGEN, "merge", str(tmp_path / "run-dir"), "-o", str(merged)],
                         capture_output=True, text=True, timeout=120, env=ENV)
    assert res.returncode == 0, res.stderr[-2000:]
    st = subprocess.run([*SPECGEN, "status", str(merged), "--json"], capture_output=True,
                        text=True, timeout=60, env=ENV)
    status = json.loads(st.stdout)
    assert status["state"] != "finished", status["state"]
    assert "shard 1/2 missing" in status["stop_reason"]
