"""`specgen merge`: shard stores combine without duplicates, re-keyed, and export like one run."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from specgen.cli import main
from specgen.export import ExportOptions, export_run
from specgen.merge import MergeError, merge_runs
from specgen.report import build_report
from specgen.verify import verify_run
from test_export_support import build_store, chat


def shard_of(conv_id: str, n: int) -> int:
    return int.from_bytes(hashlib.sha256(conv_id.encode()).digest()[:8], "big") % n


def datasets(n: int = 12) -> dict[str, list[dict]]:
    return {"chat": [dict(chat(i, 2), _row=i) for i in range(n)],
            "tools": [dict(chat(i, 1, tools=True), _row=i) for i in range(n // 2)]}


def sharded(tmp_path, n_shards: int) -> list:
    full = datasets()
    runs = []
    for k in range(n_shards):
        share = {name: [c for c in convs if shard_of(c["id"], n_shards) == k]
                 for name, convs in full.items()}
        runs.append(build_store(tmp_path / f"shard{k}", share, turns="all",
                                shard=f"{k}/{n_shards}"))
    return runs


def exports(run, tmp_path, tag) -> dict[str, bytes]:
    out = {}
    for fmt, jsonl_ in (("tokens", False), ("specforge", False), ("openai", False)):
        path = tmp_path / f"{tag}-{fmt}.out"
        export_run(run, ExportOptions(format=fmt, jsonl=jsonl_, out=path))
        out[fmt] = path.read_bytes()
    return out


def test_merged_shards_export_like_one_run(tmp_path):
    single = build_store(tmp_path / "single", datasets(), turns="all")
    shards = sharded(tmp_path, 3)
    summary = merge_runs(shards, tmp_path / "merged")
    assert summary.duplicate_conversations == 0
    assert summary.conversations == 18 and summary.sessions == 3
    assert exports(tmp_path / "merged", tmp_path, "m") == exports(single, tmp_path, "s")
    assert verify_run(tmp_path / "merged").ok
    conn = sqlite3.connect(tmp_path / "merged" / "state.sqlite")
    assert conn.execute("SELECT value FROM meta WHERE key='shard'").fetchone()[0] == ""
    assert "0/3" in conn.execute("SELECT value FROM meta WHERE key='merged_from'").fetchone()[0]
    # every attempt, quarantined answer and event of every shard is kept, re-keyed
    n_attempts = sum(sqlite3.connect(s / "state.sqlite").execute(
        "SELECT COUNT(*) FROM attempts").fetchone()[0] for s in shards)
    assert conn.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == n_attempts
    assert conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()[0] == 3
    assert conn.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 6
    assert conn.execute("SELECT COUNT(DISTINCT session) FROM attempts").fetchone()[0] == 3
    assert conn.execute(
        "SELECT COUNT(*) FROM attempts a LEFT JOIN tasks t ON t.id = a.task "
        "WHERE t.id IS NULL").fetchone()[0] == 0
    assert "Summary" in build_report(tmp_path / "merged", text=True)


def test_duplicates_keep_the_most_complete_copy(tmp_path):
    full = datasets(6)
    a = build_store(tmp_path / "a", {"chat": full["chat"][:4]}, turns="all")
    b = build_store(tmp_path / "b", {"chat": full["chat"][2:]}, turns="all")
    # conversation c0002 is complete in b only; in a it failed
    ca = sqlite3.connect(a / "state.sqlite")
    ca.execute("UPDATE conversations SET status='failed' WHERE conv_id='c0002'")
    ca.execute("DELETE FROM results WHERE conversation = "
               "(SELECT id FROM conversations WHERE conv_id='c0002') AND turn = 4")
    ca.execute("UPDATE tasks SET status='failed' WHERE turn = 4 AND conversation = "
               "(SELECT id FROM conversations WHERE conv_id='c0002')")
    ca.commit()
    ca.close()
    summary = merge_runs([a, b], tmp_path / "m")
    assert summary.duplicate_conversations == 2  # c0002 and c0003
    conn = sqlite3.connect(tmp_path / "m" / "state.sqlite")
    assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT conv_id) FROM conversations").fetchone() == (6, 6)
    assert conn.execute("SELECT status FROM conversations WHERE conv_id='c0002'").fetchone()[0] == "done"
    assert conn.execute("SELECT COUNT(*) FROM results r JOIN conversations c ON c.id = "
                        "r.conversation WHERE c.conv_id='c0002'").fetchone()[0] == 2
    # the dropped copy's attempts now point at the kept copy's tasks
    n_attempts = sum(sqlite3.connect(s / "state.sqlite").execute(
        "SELECT COUNT(*) FROM attempts").fetchone()[0] for s in (a, b))
    assert summary.attempts == n_attempts and summary.attempts_left_out == 0
    r = verify_run(tmp_path / "m")
    assert r.ok, r.problems


def test_different_configs_are_refused(tmp_path, capsys):
    a = build_store(tmp_path / "a", {"d": [chat(1)]}, config_hash="h-one")
    b = build_store(tmp_path / "b", {"d": [chat(2)]}, config_hash="h-two")
    with pytest.raises(MergeError, match="different config hashes.*h-one.*h-two"):
        merge_runs([a, b], tmp_path / "m")
    assert not (tmp_path / "m" / "state.sqlite").exists()
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "m")]) == 2
    assert "same config" in capsys.readouterr().err


def test_output_must_be_new(tmp_path):
    a = build_store(tmp_path / "a", {"d": [chat(1)]})
    b = build_store(tmp_path / "b", {"d": [chat(2)]})
    with pytest.raises(MergeError, match="already holds a run"):
        merge_runs([a], b)
    with pytest.raises(MergeError, match="given twice"):
        merge_runs([a, a], tmp_path / "m")
    with pytest.raises(MergeError, match="no specgen run here|not found"):
        merge_runs([a, tmp_path / "nope"], tmp_path / "m2")


def test_cli(tmp_path, capsys):
    shards = sharded(tmp_path, 2)
    assert main(["merge", *map(str, shards), "-o", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "(0/2," in out and "(1/2," in out and "18 conversations" in out


def test_dataset_counters_of_a_complete_merge(tmp_path):
    shards = sharded(tmp_path, 2)
    for k, s in enumerate(shards):
        conn = sqlite3.connect(s / "state.sqlite")
        conn.execute("UPDATE datasets SET rows_read = 12, rows_other_shard = ?, rows_duplicate = 1",
                     (5 + k,))
        conn.commit()
        conn.close()
    merge_runs(shards, tmp_path / "all")
    merge_runs(shards[:1], tmp_path / "part")
    q = "SELECT rows_read, rows_other_shard, rows_duplicate FROM datasets WHERE name='chat'"
    assert sqlite3.connect(tmp_path / "all" / "state.sqlite").execute(q).fetchone() == (12, 0, 2)
    assert sqlite3.connect(tmp_path / "part" / "state.sqlite").execute(q).fetchone() == (12, 5, 1)
