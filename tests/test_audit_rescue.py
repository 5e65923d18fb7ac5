"""The rescue file (third reliability audit): written in the run dir as a new file, mode
0600, never through a symlink (a private temp dir otherwise), and imported by the next run so
a resume does not pay for those answers again — checked with real `specgen run` processes."""

from __future__ import annotations

import os
import sqlite3
import stat
from types import SimpleNamespace

from specgen.engine.store_guard import rescue_results
from specgen.records import ResultRecord
from test_engine_support import prompt_rows, run_cli, write_config, write_jsonl


def held_rows(db: sqlite3.Connection, tasks: list[int]) -> list[ResultRecord]:
    cols = ", ".join(ResultRecord._fields)
    marks = ",".join("?" * len(tasks))
    return [ResultRecord(*row) for row in db.execute(
        f"SELECT {cols} FROM results WHERE task IN ({marks}) ORDER BY task", tasks)]


def test_a_rescue_file_is_private_and_imported_by_the_next_run(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(10))
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}])
    res = run_cli(path)
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = tmp_path / "run-dir"
    db = sqlite3.connect(run_dir / "state.sqlite", isolation_level=None)
    tasks = [t for (t,) in db.execute("SELECT id FROM tasks ORDER BY id LIMIT 3")]
    rows = held_rows(db, tasks)
    sent = db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
    # the store never took these answers: as if the session's last commit had failed
    where = rescue_results(SimpleNamespace(results=rows), run_dir, 7)
    assert where is not None and os.path.dirname(where) == str(run_dir)
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o600
    marks = ",".join("?" * len(tasks))
    db.execute(f"DELETE FROM results WHERE task IN ({marks})", tasks)
    db.execute(f"UPDATE tasks SET status='pending' WHERE id IN ({marks})", tasks)
    db.execute("UPDATE conversations SET status='active', end_reason=NULL WHERE id IN "
               f"(SELECT conversation FROM tasks WHERE id IN ({marks}))", tasks)
    db.close()
    res = run_cli(path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "imported 3 rescued result(s)" in res.stderr
    db = sqlite3.connect(run_dir / "state.sqlite")
    assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == sent  # none re-sent
    assert held_rows(db, tasks) == rows
    assert db.execute("SELECT COUNT(*) FROM tasks WHERE status='done'").fetchone()[0] == 10
    assert not os.path.exists(where) and os.path.exists(where + ".imported")
    res = run_cli(path)  # imported once: the next run has nothing to import
    assert res.returncode == 0 and "rescued" not in res.stderr


def test_a_rescue_file_never_follows_a_planted_symlink(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(time, "time", lambda: 1000.0)
    target = tmp_path / "victim"
    target.write_text("keep me")
    run_dir = tmp_path / "rd"
    run_dir.mkdir()
    (run_dir / "rescued-session-3-1000.jsonl").symlink_to(target)
    row = ResultRecord(*([1, 1, "a", 0] + [None] * (len(ResultRecord._fields) - 4)))
    where = rescue_results(SimpleNamespace(results=[row]), run_dir, 3)
    assert target.read_text() == "keep me"
    assert where is not None and not where.startswith(str(run_dir))
    assert stat.S_IMODE(os.stat(os.path.dirname(where)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o600
