"""`export` and `merge` build under a temporary name and rename only when complete.

Real stores, real files and real `python -m specgen` processes: a SIGKILL part-way leaves
nothing under the final name, the next run cleans up and succeeds, a write failure (disk
full, a file size limit) removes the temporary files and exits non-zero with one clear line,
and an earlier output stays whole until the new one replaces it.
"""

from __future__ import annotations

import errno
import json
import os
import random
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from specgen.cli import main
from specgen.export import ExportOptions, export_run
from specgen.export import writers as writers_mod
from specgen.export.atomic import parse_temp_name, pid_alive, remove_stale, temp_path
from specgen.merge import merge_runs
from specgen.store import Store, pack_ids, pack_json

SPECGEN = [sys.executable, "-m", "specgen"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


# -- helpers -----------------------------------------------------------------------------------

def big_store(run_dir: Path, n: int, *, offset: int = 0, shard: str = "",
              ids_per_sample: int = 300) -> Path:
    """A finished run store of `n` single-turn samples with random ids, written straight into
    the store schema (export and merge never re-render, so the ids need not be real)."""
    rng = random.Random(offset)
    store = Store.create(run_dir)
    c = store.conn
    c.execute("BEGIN")
    for k, v in {"config_hash": "atomic-test", "renderer": "kimi-k2.5", "model": "m/x",
                 "tokenizer_fingerprint": "fp", "thinking": "1", "shard": shard,
                 "config_json": "{}"}.items():
        store.set_meta(k, v)
    c.execute("INSERT INTO sessions(id, started_at, state) VALUES(1, 0, 'finished')")
    c.execute("INSERT INTO datasets(name, position, rows_read, exhausted, state) "
              "VALUES('d', 0, ?, 1, 'done')", (n,))
    convs, tasks, results, attempts = [], [], [], []
    for i in range(n):
        key = i + 1
        conv_id = f"c{offset + i:07d}"
        ids = [rng.randrange(100, 150_000) for _ in range(ids_per_sample)]
        n_prompt = ids_per_sample // 2
        messages = [{"role": "user", "content": f"question {offset + i}"}]
        convs.append((key, "d", conv_id, offset + i, "done",
                      pack_json({"id": conv_id, "messages": messages})))
        tasks.append((key, key, "d", 1, "done", 1))
        results.append((key, key, "d", 1, "p", "m/x", "stop", pack_json({"messages": messages}),
                        orjson.dumps({"role": "assistant", "content": "ok"}).decode(),
                        pack_ids(ids), n_prompt, n_prompt, ids_per_sample - n_prompt, 0.001))
        attempts.append((key, 1, "p", "m/x", "ok", n_prompt, ids_per_sample - n_prompt, 0.001))
    c.executemany("INSERT INTO conversations(id, dataset, conv_id, row_index, status, data) "
                  "VALUES(?,?,?,?,?,?)", convs)
    c.executemany("INSERT INTO tasks(id, conversation, dataset, turn, status, attempts) "
                  "VALUES(?,?,?,?,?,?)", tasks)
    c.executemany("INSERT INTO results(task, conversation, dataset, turn, provider, model, "
                  "finish_reason, request, message, input_ids, n_prompt, prompt_tokens, "
                  "completion_tokens, cost_usd) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)", results)
    c.executemany("INSERT INTO attempts(task, session, provider, model, outcome, prompt_tokens, "
                  "completion_tokens, cost_usd) VALUES(?,?,?,?,?,?,?,?)", attempts)
    c.execute("COMMIT")
    store.close()
    return run_dir


def specgen(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECGEN, *args], capture_output=True, text=True, timeout=timeout,
                          env=ENV, **kw)


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*SPECGEN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=ENV)


def wait_for(cond, proc: subprocess.Popen, timeout: float = 120, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"the process ended (rc {proc.returncode}) before {what}: "
                                 f"{proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    proc.stdout.close()
    proc.stderr.close()


def temps(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if parse_temp_name(p.name))


def row_count(run_dir: Path, table: str) -> int:
    conn = sqlite3.connect(f"file:{run_dir / 'state.sqlite'}?mode=ro", uri=True)
    try:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not pid_alive(p.pid)
    return p.pid


def limited_fsize(limit: int):
    """preexec_fn: a file size limit, so writes past `limit` bytes fail (EFBIG) like a full
    disk (Python ignores SIGXFSZ, so the write raises instead of killing the process)."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    return big_store(tmp_path_factory.mktemp("big") / "run", 20_000)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return big_store(tmp_path_factory.mktemp("small") / "run", 50, ids_per_sample=40)


# -- temporary names ---------------------------------------------------------------------------

def test_temp_names_and_pid_liveness(tmp_path):
    t = temp_path(tmp_path / "tokens.parquet")
    assert t.parent == tmp_path and t.name == f".tokens.parquet.tmp-{os.getpid()}"
    assert parse_temp_name(t.name) == ("tokens.parquet", os.getpid())
    assert parse_temp_name(".x.json.tmp-12") == ("x.json", 12)
    for name in ("tokens.parquet", ".tokens.parquet", "tokens.parquet.tmp-1", ".a.tmp-x"):
        assert parse_temp_name(name) is None
    assert pid_alive(os.getppid())
    assert not pid_alive(os.getpid())  # a temp with our own pid is an earlier process's
    assert not pid_alive(dead_pid())


def test_remove_stale_keeps_live_and_foreign_names(tmp_path):
    dead = dead_pid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f".a.jsonl.tmp-{dead}").write_text("x")
        (tmp_path / f".a.jsonl.tmp-{sleeper.pid}").write_text("x")  # being built right now
        (tmp_path / f".other.tmp-{dead}").write_text("x")  # not one of ours
        (tmp_path / f".d.tmp-{dead}").mkdir()
        (tmp_path / f".d.tmp-{dead}" / "f").write_text("x")
        removed = remove_stale(tmp_path, {"a.jsonl", "d"})
        assert sorted(p.name for p in removed) == sorted([f".a.jsonl.tmp-{dead}", f".d.tmp-{dead}"])
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [f".a.jsonl.tmp-{sleeper.pid}", f".other.tmp-{dead}"])
    finally:
        sleeper.kill()
        sleeper.wait()


# -- export ------------------------------------------------------------------------------------

def test_export_writes_temp_names_and_publishes_at_the_end(small, tmp_path, monkeypatch):
    out = tmp_path / "x" / "t.jsonl"
    seen = []
    real = writers_mod.JsonlWriter.write

    def spy(self, row):
        if not seen:
            seen.append(sorted(p.name for p in out.parent.iterdir()))
        real(self, row)

    monkeypatch.setattr(writers_mod.JsonlWriter, "write", spy)
    m = export_run(small, ExportOptions(format="tokens", jsonl=True, out=out))
    assert seen == [[f".t.jsonl.tmp-{os.getpid()}"]]  # nothing under the final name yet
    assert sorted(p.name for p in out.parent.iterdir()) == ["t.jsonl", "t.jsonl.manifest.json"]
    manifest = json.loads((out.parent / "t.jsonl.manifest.json").read_text())
    assert manifest["files"][0]["rows"] == 50 == m["totals"]["rows"]
    assert len(out.read_text().splitlines()) == 50


def test_split_export_builds_the_directory_under_a_temp_name(small, tmp_path, monkeypatch):
    out = tmp_path / "split"
    seen = []
    real = writers_mod.ParquetWriter.write

    def spy(self, row):
        if not seen:
            seen.append((out.exists(), sorted(p.name for p in tmp_path.iterdir()),
                         sorted(p.name for p in self.temp.parent.iterdir())))
        real(self, row)

    monkeypatch.setattr(writers_mod.ParquetWriter, "write", spy)
    export_run(small, ExportOptions(format="tokens", out=out, split_by_dataset=True))
    assert seen == [(False, [f".split.tmp-{os.getpid()}"], ["d.parquet"])]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["split"]
    assert sorted(p.name for p in out.iterdir()) == ["d.parquet", "manifest.json"]
    # into the existing directory: per file, temporary names inside it, manifest last
    seen.clear()
    export_run(small, ExportOptions(format="tokens", out=out, split_by_dataset=True))
    assert seen[0][0] is True and seen[0][2] == sorted(
        ["d.parquet", "manifest.json", f".d.parquet.tmp-{os.getpid()}"])
    assert sorted(p.name for p in out.iterdir()) == ["d.parquet", "manifest.json"]


def test_disk_full_keeps_the_previous_export_and_leaves_no_temp(small, tmp_path, monkeypatch,
                                                                 capsys):
    out = tmp_path / "t.jsonl"
    assert main(["export", str(small), "-f", "tokens", "--jsonl", "-o", str(out)]) == 0
    before = (out.read_bytes(), (tmp_path / "t.jsonl.manifest.json").read_bytes())
    calls = {"n": 0}
    real = writers_mod.JsonlWriter.write

    def full(self, row):
        calls["n"] += 1
        if calls["n"] > 10:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(self, row)

    monkeypatch.setattr(writers_mod.JsonlWriter, "write", full)
    capsys.readouterr()
    assert main(["export", str(small), "-f", "tokens", "--jsonl", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "no space left" in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert (out.read_bytes(), (tmp_path / "t.jsonl.manifest.json").read_bytes()) == before
    assert temps(tmp_path) == []


def test_export_file_size_limit_in_a_real_process(big, tmp_path):
    out = tmp_path / "t.parquet"
    proc = specgen("export", str(big), "-f", "tokens", "-o", str(out),
                   preexec_fn=limited_fsize(2 << 20))
    assert proc.returncode == 1, proc.stderr
    # the Parquet writer or SQLite's sorter (its temp files count too) hits the limit first
    assert proc.stderr.startswith("specgen export: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_export_killed_part_way_leaves_nothing_and_a_rerun_succeeds(big, tmp_path):
    out = tmp_path / "exp" / "tokens.jsonl"
    manifest = tmp_path / "exp" / "tokens.jsonl.manifest.json"
    proc = start("export", str(big), "-f", "tokens", "--jsonl", "-o", str(out))
    tmp = temp_path(out, proc.pid)
    # kill once the temporary file holds some rows (well before the end: 20,000 rows)
    wait_for(lambda: tmp.exists() and tmp.stat().st_size > 200_000, proc,
             what="the temporary export file to grow")
    kill(proc)
    assert not out.exists() and not manifest.exists()
    assert temps(out.parent) == [tmp]
    done = specgen("export", str(big), "-f", "tokens", "--jsonl", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert temps(out.parent) == []  # the killed export's leftover is gone
    assert sum(1 for _ in out.open()) == 20_000
    assert json.loads(manifest.read_text())["totals"]["rows"] == 20_000


def test_a_killed_export_does_not_touch_the_previous_one(big, tmp_path):
    out = tmp_path / "tokens.parquet"
    first = specgen("export", str(big), "-f", "tokens", "-o", str(out))
    assert first.returncode == 0, first.stderr
    before = out.read_bytes()
    mbefore = json.loads((tmp_path / "tokens.manifest.json").read_text())
    proc = start("export", str(big), "-f", "tokens", "-o", str(out))
    tmp = temp_path(out, proc.pid)
    wait_for(lambda: tmp.exists() and tmp.stat().st_size > 0, proc,
             what="the temporary export file to grow")
    kill(proc)
    assert out.read_bytes() == before
    assert json.loads((tmp_path / "tokens.manifest.json").read_text()) == mbefore


# -- merge -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("shards")
    return [big_store(d / "s0", 15_000, shard="0/2"),
            big_store(d / "s1", 15_000, offset=15_000, shard="1/2")]


def test_merge_killed_part_way_leaves_no_run_and_a_rerun_succeeds(shards, tmp_path):
    out = tmp_path / "merged"
    proc = start("merge", *map(str, shards), "-o", str(out))
    work = temp_path(out, proc.pid)
    wal = work / "state.sqlite-wal"
    wait_for(lambda: wal.exists() and wal.stat().st_size > 1 << 20, proc,
             what="the merge to write into its temporary run dir")
    kill(proc)
    assert not out.exists()
    assert temps(tmp_path) == [work]
    status = specgen("status", str(out), "--json")
    assert status.returncode != 0  # nothing a status or export could take for the merge
    done = specgen("merge", *map(str, shards), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert temps(tmp_path) == []
    assert sorted(p.name for p in out.iterdir()) == ["state.sqlite"]
    assert row_count(out, "results") == 30_000 and row_count(out, "conversations") == 30_000
    exported = specgen("export", str(out), "-f", "tokens", "--jsonl")
    assert exported.returncode == 0, exported.stderr


def test_merge_into_an_existing_folder(tmp_path):
    a = big_store(tmp_path / "a", 30, ids_per_sample=20, shard="0/2")
    b = big_store(tmp_path / "b", 30, offset=30, ids_per_sample=20, shard="1/2")
    empty = tmp_path / "empty"
    empty.mkdir()
    merge_runs([a, b], empty)
    assert sorted(p.name for p in empty.iterdir()) == ["state.sqlite"]
    assert row_count(empty, "results") == 60
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep me")
    (busy / f".state.sqlite.tmp-{dead_pid()}").mkdir()  # a killed merge's leftover
    merge_runs([a, b], busy)
    assert sorted(p.name for p in busy.iterdir()) == ["notes.txt", "state.sqlite"]
    assert (busy / "notes.txt").read_text() == "keep me"
    assert row_count(busy, "results") == 60
    assert main(["merge", str(a), str(b), "-o", str(busy)]) == 2  # holds a run now


def test_merge_write_failure_removes_the_temp_dir(shards, tmp_path):
    out = tmp_path / "merged"
    proc = specgen("merge", *map(str, shards), "-o", str(out),
                   preexec_fn=limited_fsize(4 << 20))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("specgen merge: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
