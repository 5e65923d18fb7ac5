"""Issue 33, "also from the audit, outside batch mode": each finding replayed in real processes
against small servers written in the tests (tests/test_secret_in_answer.py's EchoApi) and
real run dirs: a malformed HTTP_PROXY, numeric options beyond range, a tampered store row,
filters that leave nothing, hostile names and ids on the terminal."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from test_engine_support import ENV, SPECGEN, prompt_rows, write_config, write_jsonl
from test_secret_in_answer import EchoApi, run

BIG = "99999999999999999999999"


def cli(*args: str, env: dict | None = None, cwd: Path | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECGEN, *args], capture_output=True, text=True, timeout=300,
                          env={**ENV, **(env or {})}, cwd=cwd)


@pytest.fixture
def run_dir(tmp_path):
    """A finished live run of 12 samples against an EchoApi (no key: nothing quarantined)."""
    api = EchoApi()
    try:
        out, rd = run(tmp_path, api, "", "live")
    finally:
        api.stop()
    assert out.returncode == 0, out.stdout + out.stderr
    return rd


@pytest.mark.parametrize("value", ["http://user:s3cret-pw@host:port", "http://[::1",
                                   "http://user:s3cret-pw@[::1", "socks5://user:s3cret-pw@h:1",
                                   "user:s3cret-pw@h:1:2", "http://h:99999"])
def test_a_malformed_proxy_variable_is_a_clear_error(tmp_path, value):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(2))
    path = write_config(tmp_path, "http://127.0.0.1:9/v1", [{"name": "a", "path": "a.jsonl"}],
                        endpoint="fetch_endpoints = false\n")
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        out = cli("run", str(path), "--no-live", env={name: value, "NO_PROXY": ""})
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr and name in out.stderr
        assert "s3cret-pw" not in out.stdout + out.stderr
        assert not (tmp_path / "run-dir" / "state.sqlite").exists()  # refused before a session


def test_numeric_options_beyond_range_are_clear_errors(run_dir, tmp_path):
    for args in (("export", "-f", "openai", "-o", str(tmp_path / "o.jsonl"),
                  "--min-trainable-tokens", BIG),
                 ("export", "-f", "openai", "-o", str(tmp_path / "o.jsonl"),
                  "--max-repetition", BIG),
                 ("export", "-f", "vocab", "-o", str(tmp_path / "v"), "--target-vocab-size", BIG),
                 ("export", "-f", "tokens", "-o", str(tmp_path / "t"), "--target-vocab-size", BIG),
                 ("stats", "--json", "--repetition-tokens", BIG),
                 ("stats", "--json", "--repetition-period", BIG),
                 ("verify", "--max-true-mismatch", "nan")):
        out = cli(args[0], str(run_dir), *args[1:])
        assert out.returncode == 2, (args, out.stderr[-500:])
        assert "Traceback" not in out.stderr and args[-2] in out.stderr, (args, out.stderr)
    assert not list(tmp_path.glob("o.jsonl*")) and not (tmp_path / "v").exists()


def test_a_tampered_row_is_never_exported_and_stats_survive_it(run_dir, tmp_path):
    db = sqlite3.connect(run_dir / "state.sqlite")
    (task, ids), = db.execute("SELECT task, length(input_ids) / 4 FROM results "
                              "ORDER BY task LIMIT 1")
    db.execute("UPDATE results SET n_prompt = ? WHERE task = ?", (ids + 71_000, task))
    db.commit()
    for fmt in ("openai", "specforge", "tokens"):
        out_path = tmp_path / f"x-{fmt}"
        out = cli("export", str(run_dir), "-f", fmt, "-o", str(out_path))
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"(task {task}) is inconsistent: n_prompt {ids + 71_000}" in out.stderr
        assert "trained on" not in out.stdout and not out_path.exists()
    verify = cli("verify", str(run_dir))
    assert verify.returncode != 0 and "n_prompt" in verify.stdout
    # a row whose message is not JSON: stats and the report count it, never crash
    db.execute("UPDATE results SET message = 'not json {' WHERE task = (SELECT MAX(task) "
               "FROM results)")
    db.commit()
    db.close()
    for args in (("stats",), ("stats", "--json"), ("report", "--text")):
        out = cli(args[0], str(run_dir), *args[1:])
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    stats = json.loads(cli("stats", str(run_dir), "--json").stdout)
    assert stats["unreadable"]["count"] == 2 and stats["total"]["samples"] == 10
    assert "2 stored sample(s) damaged or inconsistent" in cli("stats", str(run_dir)).stdout


def test_filters_that_leave_nothing_say_so_and_fail(run_dir, tmp_path):
    out = cli("export", str(run_dir), "-f", "openai", "-o", str(tmp_path / "f.jsonl"),
              "--min-trainable-tokens", "100000", "--dedup")
    assert out.returncode != 0
    assert "no sample yet" not in out.stderr
    assert "every sample was left out: 12 by the sample filters (--min-trainable-tokens " \
           "100000, --dedup" in out.stderr


def unwritable_dir() -> Path | None:
    """A directory os.access calls writable that takes no new entry (root under /sys or
    /dev/pts), or None on a machine without one."""
    for d in (Path("/sys/kernel"), Path("/dev/pts"), Path("/proc/sys/kernel")):
        probe = d / f"specgen-check-{os.getpid()}"
        if not d.is_dir() or not os.access(d, os.W_OK | os.X_OK):
            continue
        try:
            probe.mkdir()
        except OSError:
            return d
        probe.rmdir()
    return None


def test_probe_out_that_cannot_be_written_is_found_before_a_canary(tmp_path):
    from test_probe import SIM, config
    from test_sim_support import SimProcess

    where = unwritable_dir()
    if where is None:
        pytest.skip("no directory here that os.access calls writable and is not")
    (tmp_path / "sim").mkdir()
    sim = SimProcess(tmp_path / "sim", SIM)
    try:
        path = tmp_path / "run.toml"
        path.write_text(config(tmp_path, sim.url))
        status, _, body = sim.request("GET", "/sim/stats")
        before = json.loads(body)["requests"]
        out = cli("probe", str(path), "--per-provider", "1", "--out",
                  str(where / "new" / "probe.json"))
        assert out.returncode == 2, out.stdout + out.stderr
        assert "cannot create" in out.stderr and "worst case" not in out.stderr
        assert json.loads(sim.request("GET", "/sim/stats")[2])["requests"] == before
    finally:
        sim.stop()


HOSTILE = "Evil\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e"


@pytest.mark.parametrize("mode", ["live", "batch"])
def test_hostile_provider_names_and_batch_ids_are_printed_sanitised(tmp_path, mode):
    api = EchoApi(provider=HOSTILE, batch_prefix="job\x1b[31m-")
    try:
        out, rd = run(tmp_path, api, "", mode, n=4)
    finally:
        api.stop()
    assert out.returncode == 0, out.stdout + out.stderr
    db = sqlite3.connect(rd / "state.sqlite")
    assert {p for (p,) in db.execute("SELECT provider FROM results")} == {HOSTILE}  # as sent
    db.close()
    status = cli("status", str(rd))
    report = cli("report", str(rd), "--text")
    stats = cli("stats", str(rd))
    verify = cli("verify", str(rd))
    texts = {"run stdout": out.stdout, "run stderr": out.stderr, "status": status.stdout,
             "report": report.stdout, "stats": stats.stdout, "verify": verify.stdout,
             "log": (rd / "specgen.log").read_text()}
    raw = [where for where, text in texts.items()
           if any(c in text for c in "\x1b\x07\x9b\u202e")]
    assert not raw
    assert "Evil\\x1b]0;pwned\\x07" in status.stdout + report.stdout
    if mode == "batch":
        assert "job\\x1b[31m-0" in texts["log"]


def test_a_relay_repeat_the_reasoning_count_places_is_repaired(tmp_path):
    """Half the answers carry one stream event sent twice; the sim's model also repeats words
    itself, so taking out either repeat fits the completion count. The provider's
    reasoning_tokens (exact on its plain answers) says which field held the relay's repeat:
    those answers are repaired, and every sample vouched for equals the clean run's."""
    from specgen.store import Store
    from test_engine_witness import run as witness_run

    quirky, _ = witness_run(tmp_path, "duplicated", 80, true_ids=False, name="dup",
                            rows=prompt_rows, endpoint="concurrency = 1\nmin_concurrency = 1")
    clean, _ = witness_run(tmp_path, "clean", 80, true_ids=False, name="clean",
                           rows=prompt_rows, endpoint="concurrency = 1\nmin_concurrency = 1")
    with Store.open(clean.run_dir) as s:
        truth = {r.conv_id: r.input_ids for r in s.iter_results()}
    with Store.open(quirky.run_dir) as s:
        got = list(s.iter_results())
    backed = [r for r in got if "count:reasoning_count" in r.repairs]
    assert backed, [r.repairs for r in got]
    for r in got:
        if r.count_check != "unverified":
            assert r.input_ids == truth[r.conv_id], r.repairs


# -- a full disk at start; a rescue file that could not go in the run dir ---------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (root only), unmounted afterwards whatever happens."""
    import shutil

    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full disk needs a small tmpfs, and mounting one needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill_but(disk: Path, free_kib: int) -> None:
    """Fill `disk`, then give back `free_kib` KiB."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as f:
        try:
            while True:
                f.write(bytes(1 << 12))
        except OSError:
            pass
    os.truncate(filler, max(0, filler.stat().st_size - free_kib * 1024))


def test_a_full_disk_at_start_says_the_disk_is_full(small_disk, tmp_path):
    api = EchoApi()
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(3))
        path = write_config(tmp_path, api.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="fetch_endpoints = false\nstream = false\n")
        path.write_text(path.read_text().replace(str(tmp_path / "run-dir"),
                                                 str(small_disk / "rd")))
        first = cli("run", str(path), "--no-live")
        assert first.returncode == 0, first.stderr[-2000:]
        chats = api.chats
        for free in (0, 4, 8, 16):
            fill_but(small_disk, free)
            out = cli("run", str(path), "--no-live")
            assert out.returncode == 2, (free, out.stdout + out.stderr)
            assert "disk" in out.stderr and "is full" in out.stderr, (free, out.stderr)
            assert "specgen store" not in out.stderr and "Traceback" not in out.stderr
            (small_disk / "filler").unlink()
        assert api.chats == chats  # nothing sent
    finally:
        api.stop()


def test_a_rescue_file_outside_the_run_dir_is_imported_and_says_what_to_do(tmp_path,
                                                                           monkeypatch):
    import time
    from types import SimpleNamespace

    from specgen.engine.store_guard import fallback_dir, rescue_note, rescue_results
    from specgen.records import ResultRecord

    api = EchoApi()
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(6))
        path = write_config(tmp_path, api.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="fetch_endpoints = false\nstream = false\n")
        assert cli("run", str(path), "--no-live").returncode == 0
        run_dir = tmp_path / "run-dir"
        db = sqlite3.connect(run_dir / "state.sqlite", isolation_level=None)
        cols = ", ".join(ResultRecord._fields)
        rows = [ResultRecord(*r) for r in db.execute(
            f"SELECT {cols} FROM results ORDER BY task LIMIT 2")]
        tasks = [r.task for r in rows]
        # the run dir takes no new file (here: a name already taken), so the rescue file
        # goes to the temp dir
        monkeypatch.setattr(time, "time", lambda: 1000.0)
        (run_dir / "rescued-session-9-1000.jsonl").symlink_to(tmp_path / "elsewhere")
        where = rescue_results(SimpleNamespace(results=rows), run_dir, 9)
        monkeypatch.undo()
        (run_dir / "rescued-session-9-1000.jsonl").unlink()
        assert where is not None and where.startswith(str(fallback_dir(run_dir)))
        note = rescue_note(where, run_dir)
        assert where in note and "next run of this run dir imports it" in note
        assert "rerun the same command" in note
        db.execute(f"DELETE FROM results WHERE task IN ({tasks[0]}, {tasks[1]})")
        db.execute(f"UPDATE tasks SET status='pending' WHERE id IN ({tasks[0]}, {tasks[1]})")
        db.execute("UPDATE conversations SET status='active', end_reason=NULL WHERE id IN "
                   f"(SELECT conversation FROM tasks WHERE id IN ({tasks[0]}, {tasks[1]}))")
        db.close()
        chats = api.chats
        out = cli("run", str(path), "--no-live")
        assert out.returncode == 0, out.stderr[-2000:]
        assert "imported 2 rescued result(s)" in out.stderr
        assert api.chats == chats  # none paid twice
        assert not os.path.exists(where) and os.path.exists(where + ".imported")
        os.unlink(where + ".imported")
    finally:
        api.stop()
