"""A malformed `usage` (third reliability audit): a count or cost that is not a non-negative
number is treated as missing with a counted warning — the paid answer kept, nothing negative
charged, budgets holding — in a real `specgen run` against a small HTTP server."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from specgen.client.parse import StreamParser, parse_completion
from specgen.client.usage import clean_usage
from test_engine_support import hostile_bench


def run_with_usage(tmp: Path, usage, rows: int, endpoint: str = "", dataset: str = "",
                   max_tokens: int = 100):
    bench = hostile_bench()
    server, url = bench.serve(lambda body: 20, per_write=8, distinct=True,
                              usage_for=lambda body, n: usage)
    try:
        cfg = bench.write_run(tmp, url, "u", max_tokens=max_tokens, endpoint=endpoint)
        data = tmp / "u.jsonl"
        data.write_text("".join(json.dumps({"id": f"r{i}", "messages": [
            {"role": "user", "content": f"question {i}"}]}) + "\n" for i in range(rows)))
        if dataset:
            cfg.write_text(cfg.read_text() + dataset + "\n")
        _, res = bench.run_cpu(cfg)
    finally:
        server.shutdown()
    return res, sqlite3.connect(tmp / "u-dir" / "state.sqlite")


@pytest.mark.parametrize("bad", ["abc", None, [], True, -5.5, {"n": 1}])
def test_a_usage_that_is_not_a_number_keeps_the_answer_with_a_counted_warning(tmp_path, bad):
    usage = {"prompt_tokens": 16, "completion_tokens": bad, "cost": "x"} if bad is not None \
        else "not an object"
    res, db = run_with_usage(tmp_path, usage, 12)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 12
    assert db.execute("SELECT COUNT(*) FROM attempts WHERE outcome='ok'").fetchone()[0] == 12
    assert db.execute("SELECT COUNT(*) FROM events WHERE kind='usage_invalid'"
                      ).fetchone()[0] == 12
    assert "malformed usage" in res.stderr
    (neg,) = db.execute("SELECT COUNT(*) FROM attempts WHERE completion_tokens < 0 "
                        "OR cost_usd < 0").fetchone()
    assert neg == 0


def test_negative_counts_and_cost_cannot_defeat_the_budgets(tmp_path):
    usage = {"prompt_tokens": -100, "completion_tokens": -20000, "cost": -1.0}
    res, db = run_with_usage(tmp_path, usage, 200, max_tokens=100,
                             dataset="token_budget = 1000")
    assert res.returncode == 0, res.stderr[-3000:]
    sent = db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
    # each answer is charged its worst case (100 tokens): about 10 fit, never 200
    assert sent <= 16, sent
    (low,) = db.execute("SELECT MIN(completion_tokens) FROM attempts").fetchone()
    assert low is None or low >= 0
    (cost,) = db.execute("SELECT MIN(cost_usd) FROM attempts").fetchone()
    assert cost is None or cost >= 0


def test_clean_usage_keeps_good_numbers_and_names_the_bad():
    usage, bad = clean_usage({"prompt_tokens": 12.0, "completion_tokens": -3, "cost": 0.5,
                              "total_tokens": "9", "completion_tokens_details":
                              {"reasoning_tokens": "x", "audio": 1}})
    assert usage == {"prompt_tokens": 12, "cost": 0.5,
                     "completion_tokens_details": {"audio": 1}}
    assert bad == ["usage.completion_tokens = -3", "usage.total_tokens = '9'",
                   "usage.completion_tokens_details.reasoning_tokens = 'x'"]
    body = json.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                       "usage": [1, 2]}).encode()
    resp = parse_completion(body)
    assert resp.usage == {} and resp.usage_warnings
    p = StreamParser()
    rep, end, first = hostile_bench().answer_events(2, usage={"completion_tokens": "abc"})
    p.feed(first + rep + rep + end)
    resp = p.finish()
    assert resp.usage == {} and resp.usage_warnings == ["usage.completion_tokens = 'abc'"]
