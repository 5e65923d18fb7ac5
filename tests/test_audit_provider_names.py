"""`specgen provider --exclude` with a name no attempt came from says so and suggests the
close names (third reliability audit) — real processes on a run made against the simulator."""

from __future__ import annotations

import sqlite3
import subprocess

from specgen.commands.provider import shown
from test_engine_support import ENV, SPECGEN, prompt_rows, run_cli, write_config, write_jsonl


def test_an_unknown_provider_name_is_said_with_the_close_names(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(6))
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}])
    assert run_cli(path).returncode == 0
    run_dir = tmp_path / "run-dir"
    db = sqlite3.connect(run_dir / "state.sqlite")
    seen = [p for (p,) in db.execute("SELECT DISTINCT provider FROM attempts") if p]
    db.close()
    res = subprocess.run([*SPECGEN, "provider", str(run_dir), "--exclude", "Nonexistent"],
                         capture_output=True, text=True, timeout=60, env=ENV)
    assert res.returncode == 0, res.stderr
    assert "no attempt of this run came from a provider named 'Nonexistent'" in res.stderr
    if seen:  # a near miss of a real name is suggested
        real = seen[0]
        typo = real[:-1] + ("x" if real[-1] != "x" else "y")
        res = subprocess.run([*SPECGEN, "provider", str(run_dir), "--exclude", typo],
                             capture_output=True, text=True, timeout=60, env=ENV)
        assert f"did you mean {real.lower()!r}" in res.stderr.lower(), res.stderr
        res = subprocess.run([*SPECGEN, "provider", str(run_dir), "--exclude", real],
                             capture_output=True, text=True, timeout=60, env=ENV)
        assert "no attempt" not in res.stderr


def test_terminal_escapes_in_names_are_shown_escaped():
    assert shown("Evil\x1b[31mRed") == "Evil\\x1b[31mRed"
