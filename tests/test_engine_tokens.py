"""Token-in mode end to end: `specgen run` with `[endpoint] mode = "tokens"` against the
simulator's vLLM- and SGLang-shaped endpoints. Multi-turn tool loops run through; every
sample's prompt is exactly the ids we sent and its completion exactly the ids the server
sampled; the next turn's history holds the answer parsed from those ids; retries work."""

from __future__ import annotations

import json
import urllib.request

import pytest

from specgen.engine.status import run_status
from specgen.render import get_renderer
from specgen.store import Store
from specgen.tokenizer import load_tokenizer
from specgen.verify import verify_run
from test_engine_sim import go
from test_engine_support import (
    SimProcess,
    multi_turn_rows,
    prompt_rows,
    tool_rows,
    write_config,
    write_jsonl,
)

SIM = """
[length]
distribution = "fixed"
tokens = 40
[tool_calls]
rate = 0.6
[[providers]]
name = "engine"
{provider}
"""


def sim_stats(sim: SimProcess) -> dict:
    with urllib.request.urlopen(sim.root + "/sim/stats", timeout=10) as r:
        return json.loads(r.read())


def run_tokens(tmp_path, datasets: list[dict], *, api: str = "vllm", stream: bool = True,
               provider: str = "", name: str = "run"):
    sim = SimProcess(tmp_path, SIM.format(provider=provider), name=f"{name}-sim")
    try:
        endpoint = (f'mode = "tokens"\ntoken_api = "{api}"\nstream = {str(stream).lower()}\n'
                    'fetch_endpoints = false')
        path = write_config(tmp_path, sim.url, datasets, endpoint=endpoint, name=name,
                            sampling="max_tokens = 4096\nseed = 7")
        cfg, outcome = go(path)
        stats = sim_stats(sim)
    finally:
        sim.stop()
    return cfg, outcome, stats


def results(run_dir) -> list:
    with Store.open(run_dir) as s:
        (quarantined,) = s.conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()
        assert quarantined == 0
        return sorted(s.iter_results(), key=lambda r: (r.conv_id, r.turn))


RENDERER = get_renderer("kimi-k2.5", load_tokenizer("demo"), thinking=True)


def check_exact(rows, *, api: str) -> None:
    """Each sample: the prompt is what we rendered and sent, the completion what the server
    sampled, ending in a stop id; and a later turn's history holds the earlier answer as
    parsed from its ids."""
    for r in rows:
        assert r.count_check == "true_ids"
        prompt = RENDERER.prompt_ids(r.request["messages"], r.request["tools"])
        assert r.input_ids[: r.n_prompt] == prompt == r.true_prompt_ids
        assert r.input_ids[r.n_prompt:] == r.true_completion_ids
        assert r.true_completion_ids[-1] in RENDERER.stop_token_ids
        if api == "sglang":  # /generate leaves the matched stop id out: put back
            assert "stop_token_appended" in r.repairs
    for earlier, later in zip(rows, rows[1:], strict=False):
        if earlier.conv_id != later.conv_id:
            continue
        sent = later.request["messages"]
        answer = sent[len(earlier.request["messages"])]
        parsed = RENDERER.parse_completion(earlier.true_completion_ids)
        assert answer["role"] == "assistant" and answer["content"] == parsed.content
        assert answer.get("reasoning_content") == parsed.reasoning
        assert [c["id"] for c in answer.get("tool_calls", [])] == [
            c.id for c in parsed.tool_calls]


@pytest.mark.parametrize("api, stream", [("vllm", True), ("vllm", False), ("sglang", False)])
def test_token_mode_samples_are_the_servers_own_ids(tmp_path, api, stream):
    write_jsonl(tmp_path / "p.jsonl", prompt_rows(10))
    write_jsonl(tmp_path / "m.jsonl", multi_turn_rows(8))
    write_jsonl(tmp_path / "t.jsonl", tool_rows(10))
    cfg, outcome, stats = run_tokens(tmp_path, [
        {"name": "p", "path": "p.jsonl"}, {"name": "m", "path": "m.jsonl", "turns": "all"},
        # strict: the model's calls never equal the recorded ones, so one sample per row
        {"name": "t", "path": "t.jsonl", "turns": "first", "tool_results": "strict"}],
        api=api, stream=stream)
    assert outcome.state == "finished" and outcome.exit_code == 0, outcome
    rows = results(cfg.run_dir)
    assert len(rows) == 10 + 16 + 10
    check_exact(rows, api=api)
    assert any(c.name == "get_weather" for r in rows
               for c in RENDERER.parse_completion(r.true_completion_ids).tool_calls)
    # every id the server sampled is in a sample (nothing lost, nothing invented)
    assert sum(len(r.true_completion_ids) for r in rows) == stats["completion_tokens"]
    report = verify_run(cfg.run_dir)
    assert report.ok and report.true_completion.checked == len(rows)
    assert report.true_completion.equal == len(rows)


def test_a_tool_loop_runs_on_in_token_mode(tmp_path):
    """The model's own calls (from a first run) recorded with results as a dataset: a second
    run on-policy meets the same calls, so the loop goes on with the recorded results and the
    next request's history is the call parsed from the sampled ids."""
    write_jsonl(tmp_path / "t.jsonl", tool_rows(12))
    cfg, outcome, _ = run_tokens(tmp_path, [{"name": "t", "path": "t.jsonl", "turns": "first",
                                             "tool_results": "strict"}], name="first")
    rows = []
    for r in results(cfg.run_dir):
        calls = RENDERER.parse_completion(r.true_completion_ids).tool_calls
        if not calls:
            continue
        rows.append({"id": f"loop{len(rows)}", "tools": r.request["tools"], "messages": [
            *r.request["messages"],
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": f"call_{k}", "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for k, c in enumerate(calls)]},
            *({"role": "tool", "tool_call_id": f"call_{k}", "content": f"result {k}"}
              for k in range(len(calls))),
            {"role": "assistant", "content": "Done."}]})
    assert rows, "the simulated model never called a tool"
    write_jsonl(tmp_path / "loops.jsonl", rows)
    cfg, outcome, _ = run_tokens(tmp_path, [{"name": "l", "path": "loops.jsonl",
                                             "turns": "all"}], name="loops")
    assert outcome.state == "finished", outcome
    done = results(cfg.run_dir)
    second = [r for r in done if r.turn > 1]
    assert len(second) == len(rows)  # every loop reached the answer after the results
    check_exact(done, api="vllm")
    for r in second:
        tool_msgs = [m for m in r.request["messages"] if m["role"] == "tool"]
        assert tool_msgs and tool_msgs[0]["content"] == "result 0"
        assert tool_msgs[0]["tool_call_id"].startswith("functions.get_weather:")


def test_token_mode_retries_what_the_engine_refuses(tmp_path):
    write_jsonl(tmp_path / "p.jsonl", prompt_rows(10))
    cfg, outcome, stats = run_tokens(
        tmp_path, [{"name": "p", "path": "p.jsonl"}],
        provider="faults = { rate_limit = 0.2, unavailable = 0.1, mid_stream_error = 0.1 }")
    assert outcome.state == "finished", outcome
    st = run_status(cfg.run_dir)
    assert st["datasets"]["p"]["done"] == 10 and st["datasets"]["p"]["failed"] == 0
    with Store.open(cfg.run_dir) as s:
        kinds = {k for (k,) in s.conn.execute("SELECT DISTINCT outcome FROM attempts")}
    assert "ok" in kinds and len(kinds) > 1  # errors happened and were retried
