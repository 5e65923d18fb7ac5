"""True ids first, the count witness in the tokens export, mismatches kept out of default
exports, and verify's per-provider count_check table with the true-id reconstruction rate.

Stores are real SQLite run stores written through `Store.create` + `Store.write(Batch(...))`
(the engine's write path), with samples rendered by the real K2.5 renderer and demo tokenizer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from specgen.conversation import AssistantMessage
from specgen.export import ExportOptions, export_run
from specgen.records import ResultRecord
from specgen.render import get_renderer
from specgen.report import build_report
from specgen.store import Batch, Store, pack_ids, pack_json
from specgen.tokenizer import load_tokenizer
from specgen.verify import format_report, verify_run
from test_export_support import chat

REPO = Path(__file__).resolve().parents[1]
TOK = load_tokenizer("demo")
RENDERER = get_renderer("kimi-k2.5", TOK, thinking=True)
URL_A, URL_B = "http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1"


def build(run_dir: Path, convs: list[dict], decide: Callable[[dict], dict] | None = None,
          *, dataset: str = "d") -> Path:
    """A finished run store of `convs` (every assistant turn a sample). `decide(ctx)` gets
    {dataset, conv_id, turn, index, prompt, completion} and returns overrides of the sample:
    provider, base_url, count_check, true_prompt, true_completion, prompt_tokens,
    completion_tokens, repairs."""
    store = Store.create(run_dir)
    config = {"target": {"model": "moonshotai/kimi-k2.5", "tokenizer": "demo",
                         "renderer": "kimi-k2.5"}}
    b = Batch(meta={"config_hash": "h", "config_json": orjson.dumps(config).decode(),
                    "tokenizer_fingerprint": TOK.fingerprint, "renderer": "kimi-k2.5",
                    "model": "moonshotai/kimi-k2.5", "thinking": "1", "shard": ""})
    b.datasets[dataset] = (dataset, 0, f"/data/{dataset}.jsonl", "auto", len(convs), 0, 0, 0,
                           1, "done", "h")
    task = index = 0
    now = time.time()
    for row, conv in enumerate(convs, start=1):
        b.conversations.append((row, dataset, conv["id"], row - 1, "done", None, pack_json(conv)))
        msgs = conv["messages"]
        for turn in [i for i, m in enumerate(msgs) if m["role"] == "assistant"]:
            task += 1
            request = {"messages": msgs[:turn], "tools": conv.get("tools")}
            answer = AssistantMessage.from_openai(msgs[turn]).to_openai()
            prompt = RENDERER.prompt_ids(request["messages"], request["tools"])
            completion = RENDERER.completion_ids(answer)
            o: dict[str, Any] = {"provider": "alpha", "base_url": URL_A, "count_check": "exact",
                                 "true_prompt": None, "true_completion": None,
                                 "prompt_tokens": len(prompt),
                                 "completion_tokens": len(completion), "repairs": []}
            if decide:
                o.update(decide({"dataset": dataset, "conv_id": conv["id"], "turn": turn,
                                 "index": index, "prompt": prompt, "completion": completion}))
            index += 1
            b.tasks[task] = (task, row, dataset, turn, "done", 1, None)
            b.attempts.append((task, 1, o["base_url"], o["provider"], "m", now, now, now + 1,
                               "ok", 200, None, o["prompt_tokens"], o["completion_tokens"],
                               0.001, f"gen-{task}", dataset, now))
            values = (task, row, dataset, turn, o["provider"], "moonshotai/kimi-k2.5",
                      "tool_calls" if answer.get("tool_calls") else "stop", "stop",
                      pack_json(request), orjson.dumps(answer).decode(),
                      pack_ids(prompt + completion), len(prompt),
                      None if o["true_prompt"] is None else pack_ids(o["true_prompt"]),
                      None if o["true_completion"] is None else pack_ids(o["true_completion"]),
                      o["prompt_tokens"], o["completion_tokens"], 2, 0.001,
                      orjson.dumps(o["repairs"]).decode(), 0.5, now, o["count_check"], None,
                      o.get("quantization"), None)
            b.results.append(ResultRecord(*values))
    store.write(b)
    store.close()
    return run_dir


def resegmented(ids: list[int]) -> tuple[list[int], int]:
    """The same text with one multi-byte token split in two (what a server may sample)."""
    for i, t in enumerate(ids):
        text = TOK.decode([t])
        if not TOK.is_special(t) and len(text) >= 2 and text.isascii():
            a, rest = TOK.encode(text[0]), TOK.encode(text[1:])
            if a + rest != [t]:
                return ids[:i] + a + rest + ids[i + 1:], i
    raise AssertionError("no splittable token")


def read(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text().splitlines()]


def specgen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specgen", *args], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


# -- 1. true ids first ------------------------------------------------------------------------
def test_true_ids_are_exported_instead_of_ours(tmp_path):
    """c0000: the server's prompt has an extra token and its completion is segmented
    differently: that is the sample. c0001: no true ids: ours. c0002: true ids equal ours."""
    truth: dict[str, tuple[list[int], list[int]]] = {}

    def decide(ctx):
        if ctx["conv_id"] == "c0000":
            tp = [TOK.token_id("<|im_end|>"), *ctx["prompt"]]
            tc, _ = resegmented(ctx["completion"])
            truth["c0000"] = (tp, tc)
            return {"true_prompt": tp, "true_completion": tc, "count_check": None}
        if ctx["conv_id"] == "c0002":
            return {"true_prompt": ctx["prompt"], "true_completion": ctx["completion"],
                    "count_check": "true_ids", "repairs": ["witness:exact"]}
        return {}

    run = build(tmp_path / "run", [chat(i) for i in range(3)], decide)
    with Store.open(run) as s:
        ours = {r.conv_id: r for r in s.iter_results()}
    for fmt_jsonl in (False, True):
        out = tmp_path / ("t.jsonl" if fmt_jsonl else "t.parquet")
        m = export_run(run, ExportOptions(format="tokens", jsonl=fmt_jsonl, out=out))
        rows = {r["conv_id"]: r for r in read(out)}
        tp, tc = truth["c0000"]
        r0 = rows["c0000"]
        assert r0["input_ids"] == tp + tc != ours["c0000"].input_ids
        assert r0["loss_mask"] == [0] * len(tp) + [1] * len(tc)
        assert (r0["n_prompt"], r0["length"], r0["num_loss_tokens"]) == (
            len(tp), len(tp) + len(tc), len(tc))
        assert r0["count_check"] == "true_ids"  # stored None, but the ids are the backend's
        assert rows["c0001"]["input_ids"] == ours["c0001"].input_ids
        assert rows["c0001"]["loss_mask"] == ours["c0001"].loss_mask
        assert rows["c0001"]["count_check"] == "exact"
        assert rows["c0002"]["input_ids"] == ours["c0002"].input_ids
        assert rows["c0002"]["count_check"] == "true_ids"
        assert m["totals"]["true_id_samples"] == 2
        assert m["totals"]["tokens"] == sum(r["length"] for r in rows.values())
        assert m["totals"]["loss_tokens"] == sum(r["num_loss_tokens"] for r in rows.values())
        assert m["totals"]["count_checks"] == {"exact": 1, "true_ids": 2}


def test_merge_prefix_merges_on_the_exported_ids(tmp_path):
    """A tool loop: the call (turn 2) is an id-level prefix of the answer after the tool
    result (turn 4). With true ids equal to ours they merge; when the server segmented the
    call differently, its true ids are no prefix of the next sample's, so they stay apart."""
    def same(ctx):
        return {"true_prompt": ctx["prompt"], "true_completion": ctx["completion"],
                "count_check": "true_ids"}

    def split_call(ctx):
        o = same(ctx)
        if ctx["turn"] == 2:
            o["true_completion"], _ = resegmented(ctx["completion"])
        return o

    a = build(tmp_path / "a", [chat(1, 2, tools=True)], same)
    b = build(tmp_path / "b", [chat(1, 2, tools=True)], split_call)
    export_run(a, ExportOptions(format="tokens", merge_prefix=True, out=tmp_path / "a.parquet"))
    export_run(b, ExportOptions(format="tokens", merge_prefix=True, out=tmp_path / "b.parquet"))
    ra, rb = read(tmp_path / "a.parquet"), read(tmp_path / "b.parquet")
    assert [r["merged_turns"] for r in ra] == [[2, 4], [6]]
    assert [r["merged_turns"] for r in rb] == [[2], [4], [6]]
    with Store.open(b) as s:
        samples = list(s.iter_results())
    for row, sample in zip(rb, samples, strict=True):
        assert row["input_ids"] == sample.true_prompt_ids + sample.true_completion_ids
        assert row["n_prompt"] == len(sample.true_prompt_ids)


# -- 2. witness columns -----------------------------------------------------------------------
def test_witness_columns_in_parquet_and_jsonl(tmp_path):
    verdicts = {
        0: {"count_check": "exact"},
        1: {"count_check": "repaired", "repairs": ["count:arguments_spaced"]},
        2: {"count_check": "unverified", "prompt_tokens": None, "completion_tokens": None},
        3: {"count_check": None, "repairs": ["strip_im_end", "flag:arguments_compact"]},
    }
    run = build(tmp_path / "run", [chat(i) for i in range(4)],
                lambda ctx: verdicts[ctx["index"]])
    out = tmp_path / "t.parquet"
    export_run(run, ExportOptions(format="tokens", out=out))
    schema = pq.read_schema(out)
    assert schema.field("usage_prompt_tokens").type == pa.int64()
    assert schema.field("usage_completion_tokens").type == pa.int64()
    assert schema.field("count_check").type == pa.string()
    assert schema.field("repairs").type == pa.list_(pa.string())
    old = ["id", "dataset", "conv_id", "turn", "input_ids", "loss_mask", "length", "n_prompt",
           "num_loss_tokens", "provider", "model", "finish_reason", "prompt_tokens",
           "completion_tokens", "reasoning_tokens", "cost_usd"]
    assert schema.names[: len(old)] == old  # the existing columns, unchanged and first
    with Store.open(run) as s:
        stored = list(s.iter_results())
    export_run(run, ExportOptions(format="tokens", jsonl=True, out=tmp_path / "t.jsonl"))
    for rows in (read(out), read(tmp_path / "t.jsonl")):
        for row, r in zip(rows, stored, strict=True):
            assert row["usage_prompt_tokens"] == r.prompt_tokens
            assert row["usage_completion_tokens"] == r.completion_tokens
            assert row["count_check"] == r.count_check
            assert row["repairs"] == r.repairs
        assert [r["count_check"] for r in rows] == ["exact", "repaired", "unverified", None]
        assert rows[1]["repairs"] == ["count:arguments_spaced"]
        assert rows[2]["usage_prompt_tokens"] is None and rows[2]["usage_completion_tokens"] is None
        assert rows[0]["usage_prompt_tokens"] == rows[0]["n_prompt"]
        assert rows[0]["usage_completion_tokens"] == rows[0]["num_loss_tokens"]


def test_witness_of_a_merged_row(tmp_path):
    """A merged row: the first sample's prompt count (what n_prompt counts), the sum of the
    completion counts (what num_loss_tokens counts), the least trusted verdict, all repairs."""
    def decide(ctx):
        if ctx["turn"] == 4:
            return {"count_check": "repaired", "repairs": ["count:content_whitespace"]}
        return {"repairs": ["strip_im_end"]}

    run = build(tmp_path / "run", [chat(2, 2, tools=True)], decide)
    out = tmp_path / "m.jsonl"
    export_run(run, ExportOptions(format="tokens", jsonl=True, merge_prefix=True, out=out))
    first = read(out)[0]
    assert first["merged_turns"] == [2, 4]
    assert first["usage_prompt_tokens"] == first["n_prompt"]
    assert first["usage_completion_tokens"] == first["num_loss_tokens"]
    assert first["count_check"] == "repaired"
    assert first["repairs"] == ["strip_im_end", "count:content_whitespace"]


# -- 3. mismatches never reach a default export -----------------------------------------------
def test_mismatch_excluded_by_default_and_included_on_request(tmp_path):
    def decide(ctx):
        if ctx["conv_id"] == "c0001":
            return {"count_check": "mismatch", "completion_tokens": 999}
        if ctx["conv_id"] == "c0002":  # a mismatch verdict on our ids, but the ids are true
            return {"count_check": "mismatch", "true_prompt": ctx["prompt"],
                    "true_completion": ctx["completion"]}
        return {}

    run = build(tmp_path / "run", [chat(i) for i in range(4)], decide)
    out = tmp_path / "t.parquet"
    proc = specgen("export", str(run), "--format", "tokens", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "left out 1 sample(s)" in proc.stdout and "--include-mismatched" in proc.stdout
    ids = [r["conv_id"] for r in read(out)]
    assert ids == ["c0000", "c0002", "c0003"]
    assert read(out)[1]["count_check"] == "true_ids"
    manifest = json.loads((tmp_path / "t.manifest.json").read_text())
    assert manifest["excluded"]["samples"] == 1
    assert manifest["excluded"]["by_reason"] == {"count_mismatch": 1, "provider_excluded": 0,
                                                 "witness_pending": 0, "prompt_check": 0}
    assert "count_check = mismatch" in manifest["excluded"]["why"]
    assert manifest["totals"]["excluded_mismatch"] == 1 == manifest["per_dataset"]["d"][
        "excluded_mismatch"]
    assert manifest["totals"]["samples"] == manifest["totals"]["rows"] == 3
    assert manifest["options"]["include_mismatched"] is False

    proc = specgen("export", str(run), "--format", "tokens", "-o", str(out),
                   "--include-mismatched")
    assert proc.returncode == 0, proc.stderr
    rows = read(out)
    assert [r["conv_id"] for r in rows] == ["c0000", "c0001", "c0002", "c0003"]
    assert rows[1]["count_check"] == "mismatch" and rows[1]["usage_completion_tokens"] == 999
    manifest = json.loads((tmp_path / "t.manifest.json").read_text())
    assert manifest["excluded"]["samples"] == 0 and manifest["totals"]["samples"] == 4
    assert manifest["options"]["include_mismatched"] is True
    assert manifest["totals"]["count_checks"]["mismatch"] == 1

    # every format leaves it out by default
    for fmt in ("specforge", "openai"):
        o = tmp_path / f"{fmt}.jsonl"
        assert specgen("export", str(run), "--format", fmt, "-o", str(o)).returncode == 0
        assert [r["id"] for r in read(o)] == ["d/c0000", "d/c0002", "d/c0003"]
        assert specgen("export", str(run), "--format", fmt, "-o", str(o),
                       "--include-mismatched").returncode == 0
        assert len(read(o)) == 4


# -- 4. verify per provider -------------------------------------------------------------------
def verify_run_dir(tmp_path) -> tuple[Path, dict]:
    """alpha (URL_A): exact, repaired, mismatch; beta (URL_B): true ids, one of whose
    completions differs from ours at one token; gamma: unverified, stored before the check."""
    flipped: dict[str, Any] = {}

    def decide(ctx):
        i = ctx["index"]
        if i < 3:
            return {"count_check": ("exact", "repaired", "mismatch")[i],
                    "repairs": ["count:arguments_spaced"] if i == 1 else []}
        if i < 7:
            tc = list(ctx["completion"])
            verdict = "exact"
            if i == 5:
                at = 3
                flipped.update(at=at, ours=tc[at], theirs=tc[at] ^ 1, conv_id=ctx["conv_id"])
                tc[at] = tc[at] ^ 1
                verdict = "mismatch"
            return {"provider": "beta", "base_url": URL_B, "count_check": "true_ids",
                    "true_prompt": ctx["prompt"], "true_completion": tc,
                    "repairs": [f"witness:{verdict}"]}
        return {"provider": "gamma", "base_url": URL_B,
                "count_check": "unverified" if i == 7 else None}

    run = build(tmp_path / "run", [chat(i) for i in range(9)], decide)
    return run, flipped


def test_verify_per_provider_count_checks_and_true_id_reconstruction(tmp_path):
    run, flipped = verify_run_dir(tmp_path)
    r = verify_run(run, max_true_mismatch=1)
    assert r.ok and not r.failures  # a count_check mismatch is no verify failure
    by = {k: pc for k, pc in r.providers.items()}
    alpha, beta, gamma = by[("alpha", URL_A)], by[("beta", URL_B)], by[("gamma", URL_B)]
    assert dict(alpha.count_checks) == {"exact": 1, "repaired": 1, "mismatch": 1}
    assert dict(beta.count_checks) == {"true_ids": 4}
    assert dict(gamma.count_checks) == {"unverified": 1, "unchecked": 1}
    assert alpha.prompt.checked == alpha.completion.checked == 0 and alpha.prompt.rate is None
    assert (beta.prompt.checked, beta.prompt.equal, beta.prompt.rate) == (4, 4, 1.0)
    assert (beta.completion.checked, beta.completion.equal, beta.completion.mismatched) == (4, 3, 1)
    assert beta.completion.rate == 0.75
    assert beta.mismatches == [{
        "task": 6, "dataset": "d", "conv_id": flipped["conv_id"], "turn": 2,
        "kind": "completion", "index": flipped["at"], "ours": flipped["ours"],
        "theirs": flipped["theirs"], "ours_len": beta.mismatches[0]["ours_len"],
        "theirs_len": beta.mismatches[0]["ours_len"]}]
    # the witness measured against the truth: its one "mismatch" verdict was right
    assert {k: dict(v) for k, v in beta.witness.items()} == {
        "exact": {"reconstructed": 3}, "mismatch": {"differ": 1}}

    text = format_report(r)
    assert "per provider" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("beta"))
    assert URL_B in line and "4/4 (100.00%)" in line and "3/4 (75.00%)" in line
    assert (f"{flipped['conv_id']} turn 2 completion: first difference at token "
            f"{flipped['at']}: ours {flipped['ours']} vs theirs {flipped['theirs']}") in text

    # through the CLI: the exit-status rules are unchanged (1/4 completions differ > 2%)
    proc = specgen("verify", str(run), "--json")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    providers = {(p["provider"], p["base_url"]): p for p in data["providers"]}
    assert providers[("alpha", URL_A)]["count_checks"] == {"exact": 1, "mismatch": 1,
                                                            "repaired": 1}
    beta_json = providers[("beta", URL_B)]["true_ids"]
    assert beta_json["completion"]["rate"] == 0.75 and beta_json["prompt"]["rate"] == 1.0
    assert beta_json["mismatches"][0]["index"] == flipped["at"]
    assert specgen("verify", str(run), "--max-true-mismatch", "1").returncode == 0


def test_verify_caps_the_mismatch_list(tmp_path, monkeypatch):
    import specgen.verify as verify

    def decide(ctx):
        tc = list(ctx["completion"])
        tc[0] ^= 1
        return {"true_prompt": ctx["prompt"], "true_completion": tc, "count_check": "true_ids"}

    run = build(tmp_path / "run", [chat(i) for i in range(5)], decide)
    monkeypatch.setattr(verify, "MISMATCH_LIST", 2)
    r = verify_run(run, max_true_mismatch=1)
    pc = r.providers[("alpha", URL_A)]
    assert pc.completion.mismatched == 5 and len(pc.mismatches) == 2
    assert all(m["index"] == 0 for m in pc.mismatches)
    assert "5 true-id mismatch(es) (first 2)" in format_report(r)


def test_report_per_provider_table_has_count_checks(tmp_path):
    run, _ = verify_run_dir(tmp_path)
    text = build_report(run, text=True)
    block = text[text.index("Per provider:"):]
    alpha = next(x for x in block.splitlines() if x.strip().startswith("alpha"))
    assert alpha.rstrip().endswith("exact 1, mismatch 1, repaired 1")
    gamma = next(x for x in block.splitlines() if x.strip().startswith("gamma"))
    assert gamma.rstrip().endswith("unchecked 1, unverified 1")
    assert "count checks" in build_report(run)


def test_a_sample_pending_judgement_is_not_exported(tmp_path):
    # a run killed before its end left a sample whose prompt side is not judged yet
    def decide(ctx):
        return {"count_check": "pending"} if ctx["conv_id"] == "c0001" else {}

    run = build(tmp_path / "run", [chat(i) for i in range(3)], decide)
    out = tmp_path / "t.parquet"
    proc = specgen("export", str(run), "--format", "tokens", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert [r["conv_id"] for r in read(out)] == ["c0000", "c0002"]
    manifest = json.loads((tmp_path / "t.manifest.json").read_text())
    assert manifest["excluded"]["by_reason"]["witness_pending"] == 1
