"""The count witness end to end against simulated providers whose usage is counted from what
the model really sampled: every transformation is repaired to the true ids or caught, never
kept wrong; offsets are learned; unusable counts are detected; mismatches are quarantined
(or flagged and kept out of exports)."""

from __future__ import annotations

import json

import pytest

from specgen.engine.status import conversation_lines, run_status
from specgen.export.snapshot import read_snapshot
from specgen.judgement import judge
from specgen.quality.witness import UNUSABLE_AFTER
from specgen.report.stats import collect
from specgen.store import Store
from specgen.verify import format_report, verify_run
from test_engine_sim import go
from test_engine_support import SimProcess, prompt_rows, tool_rows, write_config, write_jsonl

SIM = """
[length]
distribution = "fixed"
tokens = 60
[tool_calls]
rate = 0.5
compact_arguments_rate = 0.5
[[providers]]
name = "P"
tag = "p/int4"
quantization = "int4"
{provider}
"""

PROVIDERS = {
    "compact": "quirks = { reserialize_arguments = 1.0 }",
    "padded": "quirks = { pad_whitespace = 0.5 }",
    "offset": "usage_completion_offset = -1",
    "noisy": "usage_noise = 0.5",
    "hidden": "hidden_system_prompt_tokens = 20",
    "clean": "",
    "duplicated": "quirks = { duplicate_events = 0.5 }",
}


def run(tmp_path, kind: str, n: int, *, true_ids: bool | None, quality: str = "",
        name: str = "run", rows=tool_rows, turns: str = "first", endpoint: str = ""):
    """A run of n rows against a sim with provider `kind` (PROVIDERS, or a TOML line);
    `true_ids` None leaves return_token_ids unset."""
    sim = SimProcess(tmp_path, SIM.format(provider=PROVIDERS.get(kind, kind)), name=name)
    try:
        write_jsonl(tmp_path / "t.jsonl", rows(n))
        if true_ids is not None:
            endpoint = f"return_token_ids = {str(true_ids).lower()}\n{endpoint}"
        # strict: the model's calls never equal the recorded ones, so one sample per row
        path = write_config(tmp_path, sim.url,
                            [{"name": "t", "path": "t.jsonl", "turns": turns,
                              "tool_results": "strict"}],
                            endpoint=endpoint, extra=quality, name=name)
        cfg, outcome = go(path)
    finally:
        sim.stop()
    return cfg, outcome


def samples(run_dir):
    with Store.open(run_dir) as s:
        return [(r.repairs, r.n_prompt, r.input_ids, r.true_completion_ids, r.count_check)
                for r in s.iter_results()]


def witness_of(repairs: list[str]) -> str:
    return next(r.split(":", 1)[1] for r in repairs if r.startswith("witness:"))


@pytest.mark.parametrize("kind", ["compact", "padded", "clean", "offset"])
def test_the_witness_is_right_against_the_true_ids(tmp_path, kind):
    # true ids on: the sample is the server's ids; the witness's verdict on our rebuilt ids
    # is recorded, so it can be checked against the truth
    # (the offset is learned from plain answers only: those with tool calls, padding or a
    # repeated stream event are not, so the small-delta kinds need more answers)
    n = 60 if kind in ("offset", "padded") else 30
    cfg, outcome = run(tmp_path, kind, n, true_ids=True)
    assert outcome.state == "finished", outcome
    rows = samples(cfg.run_dir)
    assert len(rows) == n
    verdicts = []
    for repairs, n_prompt, ids, true_completion, check in rows:
        assert check == "true_ids"
        verdict = witness_of(repairs)
        verdicts.append(verdict)
        ours_right = ids[n_prompt:] == true_completion
        if verdict in ("exact", "repaired"):
            assert ours_right, (kind, verdict, repairs)  # never kept wrong
        if kind in ("compact", "padded") and verdict == "mismatch":
            assert not ours_right
    if kind == "compact":
        assert "repaired" in verdicts
        assert any(r.startswith("count:arguments_") for rep, *_ in rows for r in rep)
    if kind == "padded":  # repaired, or (when the count cannot tell) caught
        assert "repaired" in verdicts
        assert all("count:content_whitespace" in rep for rep, *_ in rows
                   if witness_of(rep) == "repaired")
    if kind == "clean":
        assert set(verdicts) == {"exact"}
    if kind == "offset":  # the provider does not count the stop token: learned from the
        # plain answers, then every answer is exact (a cost of a few samples at first)
        assert verdicts.count("mismatch") <= 25, verdicts
        assert verdicts[-10:] == ["exact"] * 10, verdicts


def test_unusable_counts_are_detected_and_samples_unverified(tmp_path):
    # the alarm off: the provider's samples are kept, marked unverified
    cfg, outcome = run(tmp_path, "noisy", 4 * UNUSABLE_AFTER + 20, true_ids=False,
                       quality="[quality]\nalarms = { unverifiable = false }")
    assert outcome.state == "finished", outcome
    with Store.open(cfg.run_dir) as s:
        checks = dict(s.conn.execute("SELECT count_check, COUNT(*) FROM results GROUP BY 1"))
        (unusable,) = s.conn.execute("SELECT COUNT(*) FROM events WHERE kind='counts_unusable'"
                                     ).fetchone()
        (quarantined,) = s.conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()
    assert checks.get("unverified", 0) >= 60 and unusable == 1
    assert quarantined <= UNUSABLE_AFTER + 10  # classified within its first ~20 answers
    st = run_status(cfg.run_dir)
    assert st["providers"]["P"]["count_checks"]["unverified"] == checks["unverified"]


def test_a_run_whose_answers_the_counts_cannot_vouch_for_stops_exit_5(tmp_path):
    # defaults: the unverifiable alarm stops the run, naming the counts; never "finished"
    cfg, outcome = run(tmp_path, "noisy", 4 * UNUSABLE_AFTER + 20, true_ids=False)
    assert outcome.state == "stopped" and outcome.exit_code == 5, outcome
    assert "alarm unverifiable" in outcome.stop_reason, outcome.stop_reason
    assert "count_mismatch" in outcome.stop_reason or "counts_unusable" in outcome.stop_reason


def test_a_provider_counting_with_another_tokenizer_is_named_and_excluded(tmp_path):
    # the simulator counts with its demo vocabulary; the run rebuilds ids with the real Kimi
    # tokenizer: the counts are another tokenizer's, classified within its first answers
    from conftest import model_path

    kimi = model_path("kimi-k2.5")
    sim = SimProcess(tmp_path, SIM.format(provider=PROVIDERS["clean"]), name="foreign")
    try:
        write_jsonl(tmp_path / "t.jsonl", prompt_rows(120))
        path = write_config(tmp_path, sim.url,
                            [{"name": "t", "path": "t.jsonl", "turns": "first"}],
                            endpoint="return_token_ids = false", name="foreign",
                            extra="[quality]\nauto_exclude = true")
        path.write_text(path.read_text().replace('tokenizer = "demo"', f'tokenizer = "{kimi}"'))
        cfg, outcome = go(path)
    finally:
        sim.stop()
    assert outcome.exit_code == 5 and outcome.state == "stopped", outcome
    with Store.open(cfg.run_dir) as s:
        kinds = {k for (k,) in s.conn.execute("SELECT kind FROM events")}
        (answered,) = s.conn.execute("SELECT COUNT(*) FROM attempts WHERE outcome NOT LIKE "
                                     "'rejected:%'").fetchone()
    assert "counts_unusable" in kinds or "provider_excluded" in kinds, kinds
    assert answered <= 70, answered  # stopped in its first answers, not after 120


def test_a_hidden_system_prompt_is_the_providers_rendering_recorded_on_each_sample(tmp_path):
    cfg, outcome = run(tmp_path, "hidden", 12, true_ids=False)
    assert outcome.state == "finished", outcome
    st = run_status(cfg.run_dir)["datasets"]["t"]
    assert (st["done"], st["quarantined"]) == (12, 0)
    with Store.open(cfg.run_dir) as s:
        rows = list(s.iter_results())
    # one request shape (the same tools block): its first answer waited for the shape's
    # rendering to be known, then was judged like the rest; none is left pending
    assert {(r.count_check, r.prompt_check, r.prompt_delta, r.completion_check)
            for r in rows} <= {("exact", "rendering", 20, "exact"),
                               ("repaired", "rendering", 20, "repaired")}
    assert len({r.prompt_shape for r in rows}) == 1


def test_a_prompt_that_is_not_the_shapes_rendering_is_a_mismatch(tmp_path):
    n = 24
    # one request at a time: the answers arrive in row order, so which compressed prompts come
    # while the shape's rendering is still unknown is the same every run (the sim's drops are
    # keyed by the request)
    cfg, outcome = run(tmp_path, "hidden_system_prompt_tokens = 20\nprompt_drop_rate = 0.1",
                       n, true_ids=False, endpoint="concurrency = 1\n")
    assert outcome.state in ("finished", "stopped"), outcome
    st = run_status(cfg.run_dir)["datasets"]["t"]
    with Store.open(cfg.run_dir) as s:
        checks = dict(s.conn.execute("SELECT count_check, COUNT(*) FROM results GROUP BY 1"))
        sides = set(s.conn.execute("SELECT prompt_check, prompt_delta FROM results "
                                   "WHERE count_check != 'mismatch'"))
    assert "pending" not in checks  # every sample has its final verdict
    assert sides <= {("rendering", 20)}
    # a compressed prompt judged once the shape was known is quarantined; one that arrived
    # while it was pending is quarantined too when judged again: moved out of the results
    assert "mismatch" not in checks, checks
    assert st["quarantine_reasons"].get("count_mismatch", 0) >= 3, (st, checks)
    with Store.open(cfg.run_dir) as s:
        again = s.conn.execute("SELECT q.task, t.status FROM quarantine q JOIN tasks t ON "
                               "t.id = q.task WHERE q.detail LIKE '%judged again%'").fetchall()
        (quarantined_tasks,) = s.conn.execute(
            "SELECT COUNT(*) FROM tasks WHERE status = 'quarantined'").fetchone()
        (orphans,) = s.conn.execute("SELECT COUNT(*) FROM results r JOIN quarantine q ON "
                                    "q.task = r.task").fetchone()
        stored = dict(s.conn.execute("SELECT provider, COUNT(*) FROM results GROUP BY 1"))
    assert again and {status for _, status in again} == {"quarantined"}, again
    assert orphans == 0  # a moved sample is no longer a result
    # status, the run's judgement and the session's own figures count it the same
    assert st["quarantined"] == quarantined_tasks and st["done"] == sum(checks.values())
    assert judge(Store.open(cfg.run_dir)).quarantined == quarantined_tasks
    # a re-judged sample moved to quarantine no longer counts as kept (issue 33): not in the
    # samples of status --json, not as an `ok` attempt of its provider, not in the report
    full = run_status(cfg.run_dir)
    assert st["samples"] == st["done"] == sum(checks.values())
    assert {p: v["outcomes"].get("ok", 0) for p, v in full["providers"].items()
            if v["outcomes"].get("ok")} == stored
    with read_snapshot(cfg.run_dir) as store:
        stats = collect(store)
    assert {p["provider"]: p["samples"] for p in stats.providers if p["samples"]} == stored
    assert {p["provider"]: p["attempts"] - p["failed_attempts"] for p in stats.providers
            if p["attempts"] - p["failed_attempts"]} == stored
    assert stats.totals["samples"] == st["samples"]
    live = json.loads((cfg.run_dir / "live.json").read_text())
    assert {p: sum(v["count_checks"].values()) for p, v in live["providers"].items()
            if v["count_checks"]} == stored
    assert {p: v["ok"] for p, v in live["providers"].items() if v["ok"]} == stored
    with Store.open(cfg.run_dir) as s:
        (detail,) = s.conn.execute("SELECT error FROM attempts WHERE outcome LIKE "
                                   "'quarantined:count_mismatch%' AND error NOT LIKE "
                                   "'judged again%' LIMIT 1").fetchone()
        moved = [e for (e,) in s.conn.execute(
            "SELECT error FROM attempts WHERE error LIKE 'judged again%'")]
    assert "prompt: ours" in detail and "request shape (+20)" in detail
    assert len(moved) == len(again)  # each moved sample's attempt says why
    # both counts are stored with the quarantine, and status, verify and the report show them
    figures = st["quarantine_details"]["count_mismatch"]
    assert figures["prompt"]["provider"] < figures["prompt"]["ours"] + 20, figures
    assert figures["check"] == "mismatch"
    shown = f"prompt: ours {figures['prompt']['ours']}, provider {figures['prompt']['provider']}"
    assert any(shown in line for line in conversation_lines(st))
    report = verify_run(cfg.run_dir)
    assert report.quarantine_details["t"]["count_mismatch"] == figures
    assert shown in format_report(report)
    with read_snapshot(cfg.run_dir) as store:
        assert collect(store).quarantine_details == {"t": {"count_mismatch": figures}}


def test_hosted_compact_arguments_become_the_models_own_ids(tmp_path):
    cfg, outcome = run(tmp_path, "compact", 40, true_ids=False)
    assert outcome.state == "finished", outcome
    with Store.open(cfg.run_dir) as s:
        checks = dict(s.conn.execute("SELECT count_check, COUNT(*) FROM results GROUP BY 1"))
    assert set(checks) <= {"exact", "repaired"} and checks.get("repaired", 0) > 0
    st = run_status(cfg.run_dir)["datasets"]["t"]
    # what the count cannot vouch for yet (before the offset is known) is quarantined
    assert st["done"] + st["quarantined"] == 40 and st["done"] == sum(checks.values())
    assert set(st["quarantine_reasons"]) <= {"count_mismatch"}


def test_a_resumed_run_keeps_the_learned_offsets(tmp_path):
    cfg, outcome = run(tmp_path, "offset", 40, true_ids=False)
    with Store.open(cfg.run_dir) as s:
        (before,) = s.conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()
    # the first answers wait while the offset is learnt, then are judged at it: none lost
    assert outcome.state == "finished" and before == 0
    write_jsonl(tmp_path / "t.jsonl", tool_rows(80))  # 40 more rows: the run resumes
    sim = SimProcess(tmp_path, SIM.format(provider=PROVIDERS["offset"]), name="offset2")
    try:
        path = write_config(tmp_path, sim.url,
                            [{"name": "t", "path": "t.jsonl", "turns": "first",
                              "tool_results": "strict"}],
                            endpoint="return_token_ids = false")
        cfg, outcome = go(path)
    finally:
        sim.stop()
    with Store.open(cfg.run_dir) as s:
        (after,) = s.conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()
    assert outcome.state == "finished" and after == before  # nothing lost to learning again


def compact_history_rows(n: int) -> list[dict]:
    """Tool loops whose history call was written compactly, mixed with plain prompts."""
    rows = []
    for i, row in enumerate(tool_rows(n)):
        if i % 2:
            rows.append(prompt_rows(1, prefix=f"plain{i}-")[0])
            continue
        call = row["messages"][1]["tool_calls"][0]["function"]
        call["arguments"] = json.dumps({"city": f"c{i}", "unit": "celsius", "days": 3,
                                        "hourly": False}, separators=(",", ":"))
        row["messages"] += [{"role": "user", "content": "And tomorrow?"},
                            {"role": "assistant", "content": "Sunny too."}]
        rows.append(row)  # the last turn's history holds the compact call
    return rows


@pytest.mark.parametrize("true_ids", [False, True])
def test_history_re_rendered_by_the_serving_stack_is_the_prompt_of_the_sample(tmp_path,
                                                                              true_ids):
    cfg, outcome = run(tmp_path, "rerenders_history = true", 30, true_ids=true_ids,
                       rows=compact_history_rows, turns="last")
    assert outcome.state == "finished", outcome
    with Store.open(cfg.run_dir) as s:
        rows = list(s.iter_results())
    assert len(rows) == 30
    fixed = [r for r in rows if "count:history_reserialized" in r.repairs]
    assert len(fixed) == 15  # every compact history; no plain prompt touched
    for r in fixed:
        history = r.request["messages"][1]["tool_calls"][0]["function"]["arguments"]
        assert '": ' in history  # the stored request is the history the model saw
        if true_ids:
            assert r.input_ids[: r.n_prompt] == r.true_prompt_ids  # our repaired prompt
            assert r.count_check == "true_ids"
        else:
            assert r.count_check == "repaired"
    report = verify_run(cfg.run_dir)  # the stored request re-renders to the stored prompt
    assert report.ok and report.exit_code == 0


def test_duplicated_stream_events_are_taken_out_when_the_count_says_so(tmp_path):
    # the same requests, the same sim seed: answers are drawn from the request alone, so a
    # provider without the quirk gives the truth to compare with
    # (half the answers: the plain ones teach the provider's offset first; a one-token
    # duplicate is never explained away before that is known)
    # one request at a time: which answers arrive before the offset is known is then the
    # dataset's order, not the scheduler's (a one-token repeat waits for the offset)
    quirky, _ = run(tmp_path, "duplicated", 40, true_ids=False, name="dup", rows=prompt_rows,
                    endpoint="concurrency = 1\nmin_concurrency = 1")
    clean, _ = run(tmp_path, "clean", 40, true_ids=False, name="clean", rows=prompt_rows,
                   endpoint="concurrency = 1\nmin_concurrency = 1")
    with Store.open(clean.run_dir) as s:
        truth = {r.conv_id: (r.input_ids, r.count_check) for r in s.iter_results()}
    with Store.open(quirky.run_dir) as s:
        got = list(s.iter_results())
        (quarantined,) = s.conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()
    assert len(got) + quarantined == 40 and quarantined <= 12  # while learning the offset
    repaired = [r for r in got if "count:duplicate_events" in r.repairs]
    assert len(repaired) >= 8
    for r in got:  # never vouched for wrong
        if r.count_check != "unverified":  # a repeat the count cannot see is not vouched for
            assert r.input_ids == truth[r.conv_id][0], r.repairs
        assert r.count_check in ("exact", "repaired", "unverified")


def test_local_engines_get_the_vllm_history_by_default(tmp_path):
    # a local server with no endpoint list: serving resolves to vllm, true ids are asked for,
    # and our prompt is the one the re-rendering server fed the model
    cfg, outcome = run(tmp_path, "rerenders_history = true", 10, true_ids=None,
                       rows=compact_history_rows, turns="last", endpoint="fetch_endpoints = false")
    assert outcome.state == "finished", outcome
    assert cfg.target.serving == "vllm" and cfg.endpoint.return_token_ids is True
    with Store.open(cfg.run_dir) as s:
        rows = list(s.iter_results())
    assert len(rows) == 10
    for r in rows:
        assert r.count_check == "true_ids"
        assert not any(x.startswith("count:") for x in r.repairs)  # nothing left to repair
        assert r.input_ids[: r.n_prompt] == r.true_prompt_ids
    assert verify_run(cfg.run_dir).ok


def list_content_rows(n: int) -> list[dict]:
    """Plain prompts, and multi-turn chats whose history holds a message of text parts."""
    rows = []
    for i, row in enumerate(prompt_rows(n, prefix="lc-")):
        if i % 2:
            rows.append(row)
            continue
        rows.append({"messages": [
            {"role": "user", "content": [{"type": "text", "text": f"item {i} {k}"}
                                         for k in range(12)]},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": f"And then {i}?"}]})
    return rows


def test_a_hosted_vllm_stack_is_recognised_per_sample_from_its_counts(tmp_path):
    # the provider runs vLLM: list content in the history is joined with "\n" before the
    # template runs, so its prompt is longer by the joins (11 here: more than a provider's
    # counting offset may be while it is still being learned); the count witness finds the
    # vLLM rendering of the history and makes it the sample's prompt
    cfg, outcome = run(tmp_path, 'serving = "vllm"', 30, true_ids=True,
                       rows=list_content_rows, turns="last")
    assert outcome.state == "finished", outcome
    with Store.open(cfg.run_dir) as s:
        rows = list(s.iter_results())
    assert len(rows) == 30
    fixed = [r for r in rows if "count:history_served_vllm" in r.repairs]
    assert len(fixed) == 15  # every list-content history; no plain prompt touched
    for r in fixed:
        assert r.request["messages"][0]["content"].count("\nitem ") == 11
        assert r.input_ids[: r.n_prompt] == r.true_prompt_ids
    report = verify_run(cfg.run_dir)
    assert report.ok and report.exit_code == 0
