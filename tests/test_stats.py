"""`specgen stats` and the export filters on a seeded simulator run with planted answers:
repetition loops, duplicate answers, empty and whitespace-only answers, answers cut at
max_tokens (the simulator's `[[sim:...]]` directives, docs/sim.md). Stats finds exactly the
planted ones; the filters leave exactly them out and the manifest names them."""

from __future__ import annotations

import json
import subprocess
from array import array

import pyarrow.parquet as pq
import pytest

from specgen.quality.repetition import find_loop, longest_loop, may_loop
from specgen.stats.scripts import script_of
from test_engine_support import ENV, SPECGEN, prompt_rows, run_cli, write_config, write_jsonl
from test_sim_support import SimProcess

LOOPS = {"loop1": "Tell me a story. [[sim:repeat 160]]", "loop2": "Again. [[sim:repeat 220]]"}
DUPES = {f"dup{i}": f"Say it ({i}). [[sim:say The very same answer, every time it is asked.]]"
         for i in range(3)}  # dup1 and dup2 repeat dup0
EMPTY = {"empty1": "Nothing. [[sim:say]]"}
BLANK = {"blank1": "Only spaces. [[sim:say    ]]"}
CUT = {"cut1": "Go long. [[sim:long 900]]", "cut2": "Longer. [[sim:long 1200]]"}
PLANTED = {**LOOPS, **DUPES, **EMPTY, **BLANK, **CUT}
NORMAL = 24


def sid(conv: str) -> str:
    return f"a/{conv}/1"


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stats")
    rows = prompt_rows(NORMAL, prefix="n") + [
        {"id": k, "messages": [{"role": "user", "content": v}]} for k, v in PLANTED.items()]
    write_jsonl(tmp / "a.jsonl", rows)
    sim = SimProcess(tmp, '[length]\ndistribution = "fixed"\ntokens = 60\n', seed=7)
    try:
        cfg = write_config(tmp, sim.url, [{"name": "a", "path": "a.jsonl", "on_length": "keep"}],
                           sampling="max_tokens = 400\nreasoning = false")
        proc = run_cli(cfg)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        sim.stop()
    return tmp / "run-dir"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECGEN, *args], capture_output=True, text=True, timeout=120,
                          env=ENV)


def stats_json(run_dir, *args: str) -> dict:
    proc = cli("stats", str(run_dir), "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_stats_finds_exactly_the_planted_answers(planted_run):
    st = stats_json(planted_run)
    t = st["total"]
    # an empty answer is quarantined by the run's policy (never a sample): stats names it
    assert t["samples"] == NORMAL + len(PLANTED) - len(EMPTY)
    assert t["quarantined"] == {"empty": {"count": 1, "samples": [sid("empty1")]}}
    assert {lp["sample"] for lp in t["repetition"]["loops"]} == {sid(k) for k in LOOPS}
    assert all(lp["tokens"] >= 64 and 1 <= lp["period"] <= 64 for lp in t["repetition"]["loops"])
    assert set(t["duplicates"]["samples"]) == {sid("dup1"), sid("dup2")}
    assert t["empty"]["count"] == 0
    assert set(t["whitespace_only"]["samples"]) == {sid("blank1")}
    assert t["truncated"]["count"] == len(CUT)
    assert t["finish_reasons"] == {"length": len(CUT), "stop": t["samples"] - len(CUT)}
    assert t["truncated"]["above_threshold"]  # 2 of 33 > 5%
    assert t["tokens"]["completion"]["max"] == 400
    assert t["tokens"]["trainable"]["sum"] == t["tokens"]["completion"]["sum"]
    hist = t["tokens"]["completion"]["histogram"]
    assert sum(b["count"] for b in hist) == t["samples"]
    assert t["tool_calls"]["rate"] == 0
    assert t["turns_per_conversation"]["max"] == 1
    assert t["scripts"] == {"latin": t["samples"] - 1, "none": 1}  # blank1
    # per provider: the providers' groups add up to the dataset's
    ds = st["datasets"]["a"]
    assert sum(p["samples"] for p in ds["providers"].values()) == ds["samples"]
    assert sum(p["truncated"]["count"] for p in ds["providers"].values()) == len(CUT)
    commands = " ".join(f["command"] for f in st["ready_to_train"])
    for flag in ("--drop-truncated", "--max-repetition", "--dedup", "--min-trainable-tokens"):
        assert flag in commands


def test_stats_text_is_readable_and_lists_what_to_filter(planted_run):
    proc = cli("stats", str(planted_run))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "dataset a" in out and "ready to train?" in out
    assert "cut at max_tokens: 2" in out and "<-- above threshold" in out
    assert sid("loop1") in out and sid("dup1") in out
    assert "Traceback" not in out + proc.stderr


def test_filters_leave_out_exactly_the_planted_and_say_so(planted_run, tmp_path):
    out = tmp_path / "tokens.parquet"
    proc = cli("export", str(planted_run), "-f", "tokens", "-o", str(out), "--dedup",
               "--max-repetition", "63", "--min-trainable-tokens", "8", "--drop-truncated")
    assert proc.returncode == 0, proc.stderr
    assert "filtered out 7 sample(s)" in proc.stdout
    table = pq.read_table(out).to_pylist()
    kept = {r["conv_id"] for r in table}
    assert kept == {f"n{i}" for i in range(NORMAL)} | {"dup0"}
    m = json.loads((tmp_path / "tokens.manifest.json").read_text())
    f = m["excluded"]["filtered"]
    assert f["by_reason"] == {"truncated": 2, "short": 1, "repetition": 2, "duplicate": 2}
    assert set(f["sample_ids"]["truncated"]) == {sid(k) for k in CUT}
    assert set(f["sample_ids"]["short"]) == {sid("blank1")}
    assert set(f["sample_ids"]["repetition"]) == {sid(k) for k in LOOPS}
    assert set(f["sample_ids"]["duplicate"]) == {sid("dup1"), sid("dup2")}
    assert m["excluded"]["samples"] == 7 and m["totals"]["samples"] == NORMAL + 1
    # no filter given: nothing filtered, no `filtered` entry
    proc = cli("export", str(planted_run), "-f", "tokens", "-o", str(tmp_path / "all.parquet"))
    assert proc.returncode == 0, proc.stderr
    m = json.loads((tmp_path / "all.manifest.json").read_text())
    assert "filtered" not in m["excluded"] and m["totals"]["samples"] == NORMAL + len(PLANTED) - 1


def test_one_filter_at_a_time(planted_run, tmp_path):
    for flag, want in ((["--dedup"], {"dup1", "dup2"}), (["--max-repetition", "63"], set(LOOPS)),
                       (["--drop-truncated"], set(CUT))):
        out = tmp_path / "t.jsonl"
        proc = cli("export", str(planted_run), "-f", "tokens", "--jsonl", "-o", str(out), *flag)
        assert proc.returncode == 0, proc.stderr
        kept = {json.loads(line)["conv_id"] for line in out.read_text().splitlines()}
        assert set(PLANTED) - kept - set(EMPTY) - set(BLANK) == want, flag


@pytest.mark.parametrize(("args", "message"), [
    (["stats", "/nonexistent/run"], "no specgen run here"),
    (["stats", "{run}", "--dataset", "zz"], "no dataset named 'zz'"),
    (["stats", "{run}", "--repetition-tokens", "0"], "--repetition-tokens must be at least 1"),
    (["export", "{run}", "-f", "tokens", "--max-repetition", "-1"], "--max-repetition must be"),
])
def test_bad_input_is_a_message(planted_run, args, message):
    proc = cli(*[a.format(run=planted_run) for a in args])
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_repetition_detector():
    block = [5, 6, 7, 8, 9]
    ids = [1, 2, 3] + block * 20 + [4]
    loop = longest_loop(ids)
    assert (loop.tokens, loop.period, loop.start) == (95, 5, 3)
    assert find_loop(ids, 64) == loop and find_loop(ids, 96) is None
    plain = list(range(1000))
    assert not may_loop(array("I", plain).tobytes()) and find_loop(plain, 64) is None
    assert find_loop([3] * 100, 64).tokens == 99  # one token said 100 times
    assert find_loop(list(range(70)) * 2, 64) is None  # a block longer than max_period
    # the prefilter never hides a loop: any stretch of 63+ repeated tokens, wherever it starts
    for start in range(0, 40, 3):
        for period in (1, 7, 31, 64):
            block = list(range(1000, 1000 + period))
            ids = list(range(start)) + block * (63 // period + 2)
            ids = ids[:start + period + 63] + list(range(2000, 2050))
            assert may_loop(array("I", ids).tobytes()), (start, period)
            assert find_loop(ids, 63).tokens == 63, (start, period)


def test_scripts():
    assert script_of("Hello there") == "latin"
    assert script_of("这是一个测试句子") == "cjk"
    assert script_of("Привет, как дела?") == "cyrillic"
    assert script_of("123 !!") == "none" and script_of("") == "none"
    assert script_of("안녕하세요 반갑습니다") == "hangul"


def test_duplicate_prompts_are_the_n_samples_of_a_prompt(tmp_path):
    """`n = 3` samples per prompt: every prompt's 2nd and 3rd samples repeat its prompt ids
    (duplicate prompts), while the sampled answers differ (no duplicate samples)."""
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(5, prefix="q"))
    sim = SimProcess(tmp_path, '[length]\ndistribution = "fixed"\ntokens = 40\n', seed=5)
    try:
        cfg = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl", "n": 3}],
                           sampling="max_tokens = 200\nreasoning = false")
        proc = run_cli(cfg)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    finally:
        sim.stop()
    t = stats_json(tmp_path / "run-dir")["total"]
    assert t["samples"] == 15 and t["conversations"] == 15
    assert t["duplicate_prompts"]["count"] == 10
    assert t["duplicates"]["count"] == 0
