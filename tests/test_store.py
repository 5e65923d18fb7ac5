"""The run store's batched writes and the reads resume and status rely on (real SQLite)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import orjson
import pytest

from specgen.queries import detail_text, quarantine_details
from specgen.records import QuarantineRecord, ResultRecord, VerdictRecord
from specgen.store import (
    Batch,
    Store,
    StoreError,
    encode_tool_matches,
    pack_ids,
    pack_json,
    unpack_ids,
    unpack_json,
)


def conv_row(cid: int, ds: str = "a", conv_id: str | None = None, row: int = 0,
             status: str = "pending"):
    data = {"id": conv_id or f"c{cid}", "messages": [{"role": "user", "content": f"q{cid}"}]}
    return (cid, ds, conv_id or f"c{cid}", row, status, None, pack_json(data))


def result_row(task: int, conv: int, ds: str = "a", turn: int = 1, ids=(1, 2, 3, 4),
               n_prompt: int = 2):
    return ResultRecord(task, conv, ds, turn, "p1", "m", "stop", "stop",
            pack_json({"messages": [{"role": "user", "content": "q"}], "tools": None}),
            orjson.dumps({"role": "assistant", "content": "a"}).decode(), pack_ids(ids),
            n_prompt, None, None, 10, 5, 0, 0.01, "[]", 0.5, time.time(), "exact", None, "fp8", None)


def attempt_row(task: int, ds: str = "a", outcome: str = "ok", cost: float | None = 0.01,
                ct: int = 5):
    return (task, 1, "http://x", "p1", "m", 1.0, 1.1, 1.2, outcome, 200, None, 10, ct, cost,
            "gen", ds, 1.15)


def seeded(tmp_path) -> Store:
    store = Store.create(tmp_path)
    b = Batch()
    b.datasets["a"] = ("a", 0, "/d/a.jsonl", "auto", 3, 1, 0, 0, 0, "active", "h")
    b.conversations += [conv_row(1, row=0), conv_row(2, row=1), conv_row(3, row=2)]
    b.tasks[1] = (1, 1, "a", 1, "done", 1, None)
    b.tasks[2] = (2, 2, "a", 1, "failed", 6, "server: boom")
    b.tasks[3] = (3, 3, "a", 1, "pending", 0, None)
    b.conv_status[1] = ("done", None)
    b.conv_status[2] = ("failed", "failed:server")
    b.attempts += [attempt_row(1), attempt_row(2, outcome="retry:server", cost=None, ct=0)]
    b.results.append(result_row(1, 1))
    store.write(b)
    return store


def test_encodings_round_trip():
    ids = [0, 1, 163_839, 2**32 - 1]
    assert unpack_ids(pack_ids(ids)) == ids
    assert pack_ids([1]) == b"\x01\x00\x00\x00"  # little-endian uint32
    assert unpack_json(pack_json({"a": [1, "é"]})) == {"a": [1, "é"]}
    assert unpack_ids(None) is None and unpack_json(None) is None


def test_batch_write_and_reads(tmp_path):
    store = seeded(tmp_path)
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.task_counts() == {"a": {"done": 1, "failed": 1, "pending": 1}}
    assert store.conversation_counts() == {"a": {"done": 1, "failed": 1, "pending": 1}}
    spend = store.spend()["a"]
    assert spend["attempts"] == 2 and spend["completion_tokens"] == 5
    assert spend["cost_usd"] == pytest.approx(0.01) and spend["attempts_with_cost"] == 1
    assert store.result_totals()["a"]["samples"] == 1
    assert [r[0] for r in store.open_conversations()] == [3]
    assert store.answers_of(1) == {1: {"role": "assistant", "content": "a"}}
    assert store.tasks_of(2) == {1: (2, "failed", 6, "server: boom")}
    assert store.has_conversation("a", "c1") and not store.has_conversation("a", "zz")
    assert store.max_id("tasks") == 3 and store.max_id("conversations") == 3
    assert store.datasets_table()["a"]["rows_read"] == 3
    (row,) = list(Store.open(tmp_path).iter_results())
    assert row.input_ids == [1, 2, 3, 4] and row.loss_mask == [0, 0, 1, 1]
    assert row.conv_id == "c1" and row.request["messages"][0]["content"] == "q"
    prov = store.provider_totals()["p1"]
    assert prov["requests"] == 2 and prov["outcomes"] == {"ok": 1, "retry:server": 1}


def test_a_failing_batch_commits_nothing(tmp_path):
    store = seeded(tmp_path)
    b = Batch()
    b.conversations.append(conv_row(9, row=9))
    b.tasks[9] = (9, 9, "a", 1, "done", 1, None)
    b.results.append(result_row(1, 1))  # duplicate result of task 1: must roll back
    with pytest.raises(sqlite3.IntegrityError):
        store.write(b)
    assert not store.has_conversation("a", "c9")
    assert store.max_id("tasks") == 3
    store.write(Batch(conversations=[conv_row(9, row=9)]))  # the store still works
    assert store.has_conversation("a", "c9")


def test_upserts_replace_and_session_rows(tmp_path):
    store = seeded(tmp_path)
    sid = store.start_session(123, "host", "[]", 1.0)
    b = Batch()
    b.tasks[3] = (3, 3, "a", 1, "done", 2, None)
    b.datasets["a"] = ("a", 0, "/d/a.jsonl", "auto", 7, 1, 2, 0, 1, "done", "h")
    b.session = (5.0, "finished", "all datasets done", 5.0, sid)
    store.write(b)
    assert store.tasks_of(3)[1] == (3, "done", 2, None)
    assert store.datasets_table()["a"]["rows_read"] == 7
    (s,) = store.sessions()
    assert (s["pid"], s["state"], s["stop_reason"], s["ended_at"]) == \
        (123, "finished", "all datasets done", 5.0)


def test_reset_failed_tasks(tmp_path):
    store = seeded(tmp_path)
    assert store.reset_failed_tasks() == 1
    assert store.tasks_of(2)[1] == (2, "pending", 0, None)  # a fresh attempt budget
    assert sorted(r[0] for r in store.open_conversations()) == [2, 3]


def test_readonly_reader_sees_commits_while_a_writer_holds_the_file(tmp_path):
    store = seeded(tmp_path)
    reader = Store.open(tmp_path)
    with pytest.raises(StoreError):
        reader.write(Batch())
    store.conn.execute("BEGIN IMMEDIATE")  # a writer mid-transaction does not block reads
    assert reader.task_counts()["a"]["done"] == 1
    store.conn.execute("COMMIT")
    store.write(Batch(tasks={3: (3, 3, "a", 1, "done", 1, None)}))
    assert reader.task_counts()["a"]["done"] == 2


def test_open_errors(tmp_path):
    with pytest.raises(StoreError, match="no specgen run here"):
        Store.open(tmp_path / "none")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "state.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a specgen store"):
        Store.open(tmp_path / "junk")


def test_committed_batches_survive_kill_9(tmp_path):
    """A writer killed with SIGKILL right after commit leaves every committed row readable."""
    code = f"""
import os, sys
sys.path.insert(0, {str(tmp_path)!r})
from specgen.store import Batch, Store, pack_json
store = Store.create({str(tmp_path / 'run')!r})
for i in range(1, 201):
    b = Batch(conversations=[(i, "a", f"c{{i}}", i, "pending", None, pack_json({{"id": i}}))])
    store.write(b)
print("committed", flush=True)
os.kill(os.getpid(), 9)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert "committed" in proc.stdout and proc.returncode == -9
    store = Store.open(tmp_path / "run")
    assert store.max_id("conversations") == 200


def test_totals_follow_every_attempt_insert_and_are_rebuilt_for_old_stores(tmp_path):
    store = seeded(tmp_path)
    # any writer (here raw SQL, as `specgen merge` does) keeps the totals right via the trigger
    store.conn.execute(
        "INSERT INTO attempts(task, outcome, provider, prompt_tokens, completion_tokens, "
        "cost_usd, dataset) VALUES(3, 'rejected:quantization:fp4', 'p2', 7, 9, 0.5, 'a')")
    scan = store.conn.execute(
        "SELECT COUNT(*), SUM(completion_tokens), SUM(cost_usd) FROM attempts").fetchone()
    spend = store.spend()["a"]
    assert (spend["attempts"], spend["completion_tokens"]) == (scan[0], scan[1])
    assert spend["cost_usd"] == pytest.approx(scan[2])
    assert store.provider_totals()["p2"]["outcomes"] == {"rejected:quantization:fp4": 1}
    assert store.result_totals()["a"]["samples"] == 1
    # a store written before the totals existed: rebuilt once when opened for writing
    store.conn.executescript("DROP TRIGGER attempts_totals; DROP TABLE totals;")
    ro = Store.open(tmp_path)
    assert ro.spend()["a"]["attempts"] == 3  # read-only: computed from the attempts
    store.close()
    again = Store.create(tmp_path)
    assert again.conn.execute("SELECT SUM(attempts) FROM totals").fetchone()[0] == 3
    assert again.spend() == ro.spend()


def test_tool_matches_are_stored_and_old_stores_stay_readable(tmp_path):
    from specgen.engine.status import run_status

    store = seeded(tmp_path)
    b = Batch()
    b.conversations.append(conv_row(4, row=3))
    b.tasks[4] = (4, 4, "a", 3, "done", 1, None)
    b.conv_status[4] = ("ended", "tool_name_mismatch")
    b.attempts.append(attempt_row(4))
    b.results.append(result_row(4, 4, turn=3)._replace(
        tool_matches=encode_tool_matches(["exact", "name"]), quantization="fp8", sampling=None))
    store.write(b)
    rows = {r.task: r.tool_matches for r in store.iter_results()}
    assert rows == {1: [], 4: ["exact", "name"]}
    assert store.conn.execute("SELECT tool_matches FROM results WHERE task=1").fetchone() == (None,)
    st = run_status(tmp_path)["datasets"]["a"]
    assert st["tool_matches"] == {"name": 1}  # a sample counts under its weakest match
    assert st["end_reasons"] == {"failed:server": 1, "tool_name_mismatch": 1}
    assert st["turns_per_conversation"] == {"1": 2}
    # a store made before the column: read-only readers see no matches, a writer adds it
    store.conn.execute("ALTER TABLE results DROP COLUMN tool_matches")
    store.close()
    with Store.open(tmp_path) as ro:
        assert {r.task: r.tool_matches for r in ro.iter_results()} == {1: [], 4: []}
    assert run_status(tmp_path)["datasets"]["a"]["tool_matches"] == {}
    with Store.create(tmp_path) as again:
        cols = {row[1] for row in again.conn.execute("PRAGMA table_info(results)")}
        assert "tool_matches" in cols


def test_a_store_from_before_quarantine_detail_migrates_on_open(tmp_path):
    # main before the column (cb20c34) created quarantine without `detail`: build exactly that
    with Store.create(tmp_path) as store:
        store.conn.execute("DROP TABLE quarantine")
        store.conn.execute(
            "CREATE TABLE quarantine(id INTEGER PRIMARY KEY, task INTEGER, dataset TEXT, "
            "provider TEXT, reason TEXT NOT NULL, response BLOB, created_at REAL)")
        store.conn.execute("INSERT INTO quarantine(task, dataset, provider, reason, response, "
                           "created_at) VALUES (1, 'a', 'P', 'count_mismatch', x'', 1.0)")
    with Store.open(tmp_path) as ro:  # read-only readers: counts, no figures, no error
        assert ro.quarantine_counts() == {"a": {"count_mismatch": 1}}
        assert quarantine_details(ro) == {}
    with Store.create(tmp_path) as store:  # a writer adds the column; old rows keep NULL
        cols = [row[1] for row in store.conn.execute("PRAGMA table_info(quarantine)")]
        assert cols[-1] == "detail"
        b = Batch()
        figures = {"check": "mismatch", "prompt": {"ours": 209, "provider": 229}}
        b.quarantine.append(QuarantineRecord(2, "a", "P", "count_mismatch", b"", 2.0,
                                             json.dumps(figures)))
        store.write(b)
        assert quarantine_details(store) == {"a": {"count_mismatch": figures}}
        assert store.quarantine_counts() == {"a": {"count_mismatch": 2}}
    assert detail_text(figures) == "check: mismatch; prompt: ours 209, provider 229"


def test_older_stores_get_the_witness_side_columns_on_open(tmp_path):
    store = seeded(tmp_path)
    added = ("prompt_delta", "completion_delta", "prompt_check", "completion_check",
             "prompt_shape")
    for name in added:
        store.conn.execute(f"ALTER TABLE results DROP COLUMN {name}")
    store.close()
    with Store.open(tmp_path, readonly=True) as old:  # read as it is: the sides unknown
        rows = list(old.iter_results())
        assert rows and all(r.prompt_check is None and r.prompt_delta is None for r in rows)
    store = Store.create(tmp_path)  # opened to write: the columns are added
    have = {row[1] for row in store.conn.execute("PRAGMA table_info(results)")}
    assert set(added) <= have
    b = Batch()
    b.tasks[9] = (9, 1, "a", 7, "done", 1, None)
    b.results.append(result_row(9, 1, turn=7)._replace(
        prompt_delta=9, completion_delta=0, prompt_check="pending", completion_check="exact",
        prompt_shape="abc"))
    store.write(b)
    b = Batch()
    b.verdicts[9] = VerdictRecord(9, "exact", "rendering", "exact")  # judged again: shape known
    store.write(b)
    (r,) = [r for r in store.iter_results() if r.task == 9]
    assert (r.count_check, r.prompt_check, r.prompt_delta, r.prompt_shape) == (
        "exact", "rendering", 9, "abc")
    store.close()
