"""`specgen export`: tokens (Parquet/JSONL), specforge and openai files, manifest, options."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import pyarrow.parquet as pq
import pytest

from specgen.cli import main
from specgen.conversation import AssistantMessage
from specgen.export import ExportError, ExportOptions, export_run, manifest_path
from specgen.store import Store, pack_ids, pack_json, unpack_json
from test_export_support import build_store, chat


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two datasets: plain multi-turn chats, and tool loops (turns = all)."""
    d = tmp_path_factory.mktemp("export") / "run"
    return build_store(d, {"chat": [chat(i, 2) for i in range(6)],
                           "tools": [chat(i, 2, tools=True) for i in range(4)]}, turns="all")


def stored(run, datasets=None):
    with Store.open(run) as s:
        return list(s.iter_results(datasets))


def jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tokens_parquet_round_trip_pyarrow_and_datasets(run, tmp_path):
    out = tmp_path / "t.parquet"
    m = export_run(run, ExportOptions(format="tokens", out=out))
    want = stored(run)
    table = pq.read_table(out).to_pylist()
    assert len(table) == len(want) == m["totals"]["rows"] == m["totals"]["samples"]
    for row, r in zip(table, want, strict=True):
        assert row["input_ids"] == r.input_ids
        assert row["loss_mask"] == r.loss_mask
        assert row["id"] == f"{r.dataset}/{r.conv_id}/{r.turn}"
        assert (row["dataset"], row["turn"], row["provider"], row["finish_reason"]) == (
            r.dataset, r.turn, r.provider, r.finish_reason)
        assert (row["prompt_tokens"], row["completion_tokens"], row["cost_usd"]) == (
            r.prompt_tokens, r.completion_tokens, r.cost_usd)
        assert row["num_loss_tokens"] == len(r.input_ids) - r.n_prompt > 0

    import datasets

    ds = datasets.load_dataset("parquet", data_files=str(out), split="train")
    assert len(ds) == len(want)
    assert [list(x) for x in ds["input_ids"]] == [r.input_ids for r in want]
    assert [list(x) for x in ds["loss_mask"]] == [r.loss_mask for r in want]


def test_tokens_jsonl_round_trip_with_datasets(run, tmp_path):
    out = tmp_path / "t.jsonl"
    export_run(run, ExportOptions(format="tokens", jsonl=True, out=out))
    import datasets

    ds = datasets.load_dataset("json", data_files=str(out), split="train")
    want = stored(run)
    assert ds["input_ids"] == [r.input_ids for r in want]
    assert ds["loss_mask"] == [r.loss_mask for r in want]


def test_parquet_is_written_in_row_groups(run, tmp_path, monkeypatch):
    from specgen.export import writers

    monkeypatch.setattr(writers, "ROW_GROUP_ROWS", 4)
    out = tmp_path / "t.parquet"
    export_run(run, ExportOptions(format="tokens", out=out))
    n = len(stored(run))
    meta = pq.ParquetFile(out).metadata
    assert meta.num_rows == n
    assert meta.num_row_groups == -(-n // 4)


@pytest.mark.parametrize("fmt,jsonl_", [("tokens", False), ("tokens", True),
                                        ("specforge", False), ("openai", False)])
def test_same_store_gives_byte_identical_files(run, tmp_path, fmt, jsonl_):
    a = export_run(run, ExportOptions(format=fmt, jsonl=jsonl_, out=tmp_path / f"a/{fmt}.x"))
    b = export_run(run, ExportOptions(format=fmt, jsonl=jsonl_, out=tmp_path / f"b/{fmt}.x"))
    assert (tmp_path / f"a/{fmt}.x").read_bytes() == (tmp_path / f"b/{fmt}.x").read_bytes()
    assert a["files"][0]["sha256"] == b["files"][0]["sha256"]


def test_manifest_counts_totals_and_provenance(run, tmp_path):
    out = tmp_path / "t.parquet"
    m = export_run(run, ExportOptions(format="tokens", out=out))
    on_disk = json.loads(manifest_path(out, False).read_text())
    assert manifest_path(out, False) == tmp_path / "t.manifest.json"
    assert on_disk["totals"] == m["totals"]
    rows = stored(run)
    with Store.open(run) as s:
        meta = s.meta()
    assert on_disk["config_hash"] == meta["config_hash"]
    assert on_disk["tokenizer_fingerprint"] == meta["tokenizer_fingerprint"]
    assert (on_disk["renderer"], on_disk["model"]) == ("kimi-k2.5", "moonshotai/kimi-k2.5")
    assert on_disk["specgen_version"] and on_disk["created_at"]
    assert on_disk["options"]["format"] == "tokens" and on_disk["options"]["merge_prefix"] is False
    for name in ("chat", "tools"):
        mine = [r for r in rows if r.dataset == name]
        per = on_disk["per_dataset"][name]
        assert per["samples"] == per["rows"] == len(mine)
        assert per["conversations"] == len({r.conv_id for r in mine})
        assert per["tokens"] == sum(len(r.input_ids) for r in mine)
        assert per["loss_tokens"] == sum(sum(r.loss_mask) for r in mine)
        assert per["completion_tokens"] == sum(r.completion_tokens for r in mine)
        assert per["cost_usd"] == pytest.approx(sum(r.cost_usd for r in mine))
    f = on_disk["files"][0]
    assert f["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert f["bytes"] == out.stat().st_size and f["rows"] == len(rows)


def test_dataset_filter_and_unknown_dataset(run, tmp_path):
    out = tmp_path / "t.jsonl"
    m = export_run(run, ExportOptions(format="tokens", jsonl=True, out=out, datasets=["tools"]))
    assert {r["dataset"] for r in jsonl(out)} == {"tools"}
    assert list(m["per_dataset"]) == ["tools"]
    with pytest.raises(ExportError, match="no dataset named 'nope'.*datasets: chat, tools"):
        export_run(run, ExportOptions(format="tokens", out=tmp_path / "x", datasets=["nope"]))


def test_split_by_dataset(run, tmp_path):
    out = tmp_path / "split"
    m = export_run(run, ExportOptions(format="specforge", out=out, split_by_dataset=True))
    assert sorted(p.name for p in out.iterdir()) == ["chat.jsonl", "manifest.json", "tools.jsonl"]
    assert [(f["path"], f["dataset"]) for f in m["files"]] == [
        ("chat.jsonl", "chat"), ("tools.jsonl", "tools")]
    assert all(r["id"].startswith("tools/") for r in jsonl(out / "tools.jsonl"))
    # the default location, when no -o is given
    m = export_run(run, ExportOptions(format="tokens", split_by_dataset=True))
    assert (run / "exports" / "tokens" / "chat.parquet").exists()
    assert (run / "exports" / "tokens" / "manifest.json").exists()


def test_merge_prefix_merges_only_id_level_prefixes(run, tmp_path):
    out = tmp_path / "m.jsonl"
    m = export_run(run, ExportOptions(format="tokens", jsonl=True, merge_prefix=True, out=out))
    rows = {(r["dataset"], r["conv_id"]): [] for r in jsonl(out)}
    for r in jsonl(out):
        rows[(r["dataset"], r["conv_id"])].append(r)
    samples = stored(run)
    by_conv: dict = {}
    for s in samples:
        by_conv.setdefault((s.dataset, s.conv_id), []).append(s)
    for key, group in by_conv.items():
        merged = rows[key]
        assert sum(len(r["merged_turns"]) for r in merged) == len(group)
        for r in merged:
            parts = [s for s in group if s.turn in r["merged_turns"]]
            # each part is an id-level prefix of the merged row, its sampled span is masked,
            # and nothing else is
            for s in parts:
                assert r["input_ids"][: len(s.input_ids)] == s.input_ids
                assert all(r["loss_mask"][s.n_prompt: len(s.input_ids)])
            assert sum(r["loss_mask"]) == sum(len(s.input_ids) - s.n_prompt for s in parts)
            assert r["input_ids"] == parts[-1].input_ids
    # K2.5 drops the reasoning of a finished turn from history, so plain chats never merge;
    # inside a tool loop (reasoning kept) the call and the answer after the result merge.
    assert all(len(rs) == 2 for k, rs in rows.items() if k[0] == "chat")
    assert all([r["merged_turns"] for r in rs] == [[2, 4], [6]]
               for k, rs in rows.items() if k[0] == "tools")
    assert m["totals"]["rows"] < m["totals"]["samples"]
    assert m["totals"]["exported_tokens"] < m["totals"]["tokens"]


def test_specforge_rows(run, tmp_path):
    out = tmp_path / "sf.jsonl"
    export_run(run, ExportOptions(format="specforge", out=out))
    rows = jsonl(out)
    assert len(rows) == 10  # one per conversation
    samples = stored(run)
    for row in rows:
        assert set(row) <= {"id", "conversations", "tools"}
        ds, conv_id = row["id"].split("/")
        mine = [s for s in samples if (s.dataset, s.conv_id) == (ds, conv_id)]
        last = mine[-1]
        msgs = row["conversations"]
        assert len(msgs) == len(last.request["messages"]) + 1
        assert {m["role"] for m in msgs} <= {"system", "user", "assistant", "tool"}
        for s in mine:  # every regenerated answer, in full, with its reasoning
            got = msgs[len(s.request["messages"])]
            assert AssistantMessage.from_openai(got) == AssistantMessage.from_openai(s.message)
            assert got["reasoning_content"]
        if ds == "tools":
            assert json.loads(row["tools"]) == last.request["tools"]
            assert msgs[2]["tool_calls"][0]["function"]["arguments"].startswith('{"a":')
            assert msgs[3] == {"role": "tool", "tool_call_id": "functions.add:0",
                               "content": msgs[3]["content"]}
        else:
            assert "tools" not in row
    import datasets

    ds = datasets.load_dataset("json", data_files=str(out), split="train")
    assert len(ds) == 10 and "conversations" in ds.column_names


def test_openai_rows(run, tmp_path):
    out = tmp_path / "oa.jsonl"
    export_run(run, ExportOptions(format="openai", out=out))
    rows = jsonl(out)
    samples = stored(run)
    for row in rows:
        mine = [s for s in samples if (s.dataset, s.conv_id) == (row["dataset"], row["conv_id"])]
        assert row["turns"] == [s.turn for s in mine]
        assert row["messages"][: len(mine[-1].request["messages"])] != []
        for pos, s in zip(row["regenerated"], mine, strict=True):
            assert row["messages"][pos] == s.message
        assert row["messages"][-1] == mine[-1].message
        assert ("tools" in row) == (row["dataset"] == "tools")


def test_samples_that_are_not_one_chain_become_separate_conversations(tmp_path):
    run = build_store(tmp_path / "run", {"d": [chat(1, 2)]}, turns="all")
    conn = sqlite3.connect(run / "state.sqlite")
    task, blob = conn.execute("SELECT task, request FROM results ORDER BY turn DESC").fetchone()
    req = unpack_json(blob)
    req["messages"][2] = {"role": "assistant", "content": "an answer from the dataset"}
    conn.execute("UPDATE results SET request=? WHERE task=?", (pack_json(req), task))
    conn.commit()
    conn.close()
    export_run(run, ExportOptions(format="openai", out=tmp_path / "o.jsonl"))
    rows = jsonl(tmp_path / "o.jsonl")
    assert [r["id"] for r in rows] == ["d/c0001/2", "d/c0001/4"]
    assert rows[1]["messages"][2]["content"] == "an answer from the dataset"


def test_export_of_a_running_run_sees_one_snapshot(run, tmp_path):
    """A writer mid-transaction neither blocks the export nor leaks into it."""
    writer = sqlite3.connect(run / "state.sqlite", isolation_level=None, timeout=30)
    writer.execute("BEGIN IMMEDIATE")
    task, blob = writer.execute("SELECT task, input_ids FROM results LIMIT 1").fetchone()
    writer.execute("UPDATE results SET input_ids=? WHERE task=?", (pack_ids([1, 2, 3]), task))
    try:
        m = export_run(run, ExportOptions(format="tokens", jsonl=True, out=tmp_path / "t.jsonl"))
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert m["totals"]["samples"] == len(stored(run))
    assert [1, 2, 3] not in [r["input_ids"] for r in jsonl(tmp_path / "t.jsonl")]


def test_unreadable_sample_fails_cleanly_without_partial_file(tmp_path):
    run = build_store(tmp_path / "run", {"d": [chat(i) for i in range(3)]})
    conn = sqlite3.connect(run / "state.sqlite")
    task, blob = conn.execute("SELECT task, input_ids FROM results LIMIT 1 OFFSET 1").fetchone()
    conn.execute("UPDATE results SET input_ids=? WHERE task=?", (blob[:-1], task))
    conn.commit()
    conn.close()
    out = tmp_path / "out" / "t.parquet"
    with pytest.raises(ExportError, match="specgen verify"):
        export_run(run, ExportOptions(format="tokens", out=out))
    assert not out.exists() and not list(out.parent.glob("*.partial"))


def test_bad_options(run, tmp_path):
    with pytest.raises(ExportError, match="--merge-prefix applies to --format tokens"):
        export_run(run, ExportOptions(format="openai", merge_prefix=True, out=tmp_path / "x"))
    with pytest.raises(ExportError, match="is a directory"):
        export_run(run, ExportOptions(format="tokens", out=tmp_path))


def test_cli(run, tmp_path, capsys):
    out = tmp_path / "cli.parquet"
    assert main(["export", str(run), "--format", "tokens", "-o", str(out), "--merge-prefix",
                 "--dataset", "tools"]) == 0
    printed = capsys.readouterr().out
    assert f"rows to {out}" in printed and "manifest" in printed
    assert pq.read_table(out).column_names[-1] == "merged_turns"
    assert main(["export", str(tmp_path / "nowhere"), "--format", "tokens"]) == 2
    assert "no specgen run here" in capsys.readouterr().err


def test_parquet_and_jsonl_tokens_exports_keep_their_own_manifests(run):
    """Issue 35: after a `--jsonl` export the Parquet export beside it kept a manifest that
    described tokens.jsonl (one `tokens.manifest.json` for both)."""
    from pathlib import Path

    parquet = export_run(run, ExportOptions(format="tokens"))
    jsonl = export_run(run, ExportOptions(format="tokens", jsonl=True))
    exports = run / "exports"
    assert Path(parquet["manifest_path"]) == exports / "tokens.manifest.json"
    assert Path(jsonl["manifest_path"]) == exports / "tokens.jsonl.manifest.json"
    for name, data in (("tokens.manifest.json", "tokens.parquet"),
                       ("tokens.jsonl.manifest.json", "tokens.jsonl")):
        manifest = json.loads((exports / name).read_text())
        assert [Path(f["path"]).name for f in manifest["files"]] == [data]
        assert Path(manifest["options"]["out"]).name == data
