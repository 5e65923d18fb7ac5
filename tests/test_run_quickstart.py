"""The quickstart config runs end to end (against its simulator, latencies zeroed), every
sample's ids equal the true ids the simulator reports, and its tool loops run on past the
first call: recorded results are reused by name, the match is on the sample, its export and
the run summary."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from specgen.commands.run import print_summary
from specgen.config import load_config
from specgen.conversation import AssistantMessage
from specgen.engine.runner import RunOptions, run
from specgen.engine.status import run_status
from specgen.export import ExportOptions, export_run
from specgen.sim import load_sim_config
from specgen.store import Store
from test_engine_support import check_store

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    cfg = load_config(REPO / "examples" / "quickstart.toml")
    assert cfg.endpoint.is_sim and cfg.target.tokenizer == "demo"
    assert [d.name for d in cfg.datasets] == ["glaive_tools", "reasoning"]
    sim = load_sim_config(cfg.sim.config)
    for p in sim.providers:  # the quickstart's pace is for humans; tests need not wait
        p.latency_s, p.tokens_per_second = 0.0, 0.0
    cfg.sim.config = sim
    cfg.run_dir = tmp_path_factory.mktemp("quickstart") / "qs"
    outcome = run(cfg, RunOptions(live=False))
    return cfg, outcome


def test_quickstart_runs_and_samples_are_exact(quickstart):
    cfg, outcome = quickstart
    assert outcome.state == "finished" and outcome.exit_code == 0, outcome
    st = run_status(cfg.run_dir)
    assert st["state"] == "finished"
    for name in ("glaive_tools", "reasoning"):
        d = st["datasets"][name]
        assert d["done"] > 20 and d["pending"] == 0 and d["exhausted"]
    assert st["cost_usd"] <= 1.0
    assert "DeepInfra" not in {p for p, v in st["providers"].items()
                               if v["outcomes"].get("ok")}  # FP4 excluded by the policy
    check_store(cfg.run_dir)
    with Store.open(cfg.run_dir) as s:
        rows = list(s.iter_results())
    assert any(r.request.get("tools") for r in rows if r.dataset == "glaive_tools")
    assert all(r.input_ids == r.true_prompt_ids + r.true_completion_ids for r in rows)
    with Store.open(cfg.run_dir) as s:  # streamed: the first token after the headers
        times = s.conn.execute("SELECT started_at, first_byte_at, first_token_at, ended_at "
                               "FROM attempts WHERE outcome = 'ok'").fetchall()
    assert times and all(a <= b <= c <= d for a, b, c, d in times)


def test_quickstart_tool_loops_reuse_results_by_name(quickstart):
    cfg, _ = quickstart
    with Store.open(cfg.run_dir) as s:
        rows = [r for r in s.iter_results(["glaive_tools"])]
    reused = [r for r in rows if r.tool_matches]
    assert len(reused) >= 8  # most tool loops get past the model's own call
    by_turn = {(r.conversation, r.turn): r for r in sorted(rows, key=lambda r: r.turn)}
    for r in reused:
        msgs = r.request["messages"]
        results = [m for m in msgs if m["role"] == "tool"]
        assert len(results) == len(r.tool_matches)
        assert set(r.tool_matches) <= {"exact", "name"}  # no "position" under "name"
        # each result answers the regenerated call just before it, under the model's id
        for k, m in enumerate(msgs):
            if m["role"] == "assistant" and m.get("tool_calls"):
                ids = [c["id"] for c in m["tool_calls"]]
                after = [x["tool_call_id"] for x in msgs[k + 1: k + 1 + len(ids)]]
                assert sorted(after) == sorted(ids)
        # the answer that made the calls is stored as the sample of an earlier turn
        calls = [c["id"] for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
        stored = [c.id for (conv, t), x in by_turn.items() if conv == r.conversation
                  and t < r.turn for c in AssistantMessage.from_openai(x.message).tool_calls]
        assert calls == stored
    st = run_status(cfg.run_dir)["datasets"]["glaive_tools"]
    assert sum(st["tool_matches"].values()) == len(reused)
    assert sum(n for k, n in st["turns_per_conversation"].items() if int(k) >= 2) >= 8
    assert max(map(int, st["turns_per_conversation"])) >= 3  # a loop, then another user turn
    assert "tool_mismatch" not in st["end_reasons"]  # the reasons are specific now


def test_quickstart_exports_carry_the_match_and_the_summary_shows_turns(quickstart, capsys,
                                                                         tmp_path):
    cfg, outcome = quickstart
    with Store.open(cfg.run_dir) as s:
        want = {f"{r.dataset}/{r.conv_id}/{r.turn}": r.tool_matches for r in s.iter_results()}
    assert any(want.values())
    m = export_run(cfg.run_dir, ExportOptions(format="tokens", out=tmp_path / "t.parquet"))
    got = {row["id"]: row["tool_matches"] for row in pq.read_table(tmp_path / "t.parquet")
           .select(["id", "tool_matches"]).to_pylist()}
    assert got == want
    assert m["per_dataset"]["glaive_tools"]["tool_matches"]["name"] > 0
    assert m["per_dataset"]["reasoning"]["tool_matches"] == {}
    # an openai row is a whole conversation: its last request holds every reused result
    last = {}
    for key, matches in sorted(want.items(), key=lambda kv: int(kv[0].rsplit("/", 1)[1])):
        last[key.rsplit("/", 1)[0]] = matches
    export_run(cfg.run_dir, ExportOptions(format="openai", out=tmp_path / "o.jsonl"))
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert {r["id"]: r["tool_matches"] for r in rows} == last
    print_summary(run_status(cfg.run_dir), outcome.state, outcome.stop_reason)
    out = capsys.readouterr().out
    glaive = out.split("glaive_tools [")[1].split("reasoning [")[0]
    assert "turns per conversation: 1 x" in glaive and "2 x" in glaive
    assert "samples reusing tool results, by weakest match: name " in glaive


def test_preview_plans_a_range_holding_what_the_run_made(quickstart):
    from specgen.preview import preview
    from specgen.render import target_renderer
    from specgen.tokenizer import load_tokenizer

    cfg, _ = quickstart
    result = preview(cfg, target_renderer(cfg, load_tokenizer("demo")), n=0)
    st = run_status(cfg.run_dir)["datasets"]
    for d in result.datasets:
        made = st[d.name]["total"]
        assert d.est_requests_min <= made <= d.est_requests, (d.name, made)
    glaive = next(d for d in result.datasets if d.name == "glaive_tools")
    assert glaive.est_requests_min < glaive.est_requests  # its tool calls decide
