"""The model check and the quantization policy hold against odd answers (third reliability
audit), in real `specgen run` processes: an answer from `attacker/kimi-k2.5` or with `model:
123` is rejected, never a sample; with an endpoint list and `quantizations = ["fp8"]`, an
answer whose provider is "", null or a list, or whose revealed quantization is 123, is not
kept unchecked."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from specgen.engine.model_check import ModelCheck
from test_engine_support import (
    hostile_bench,
    prompt_rows,
    run_cli,
    write_config,
    write_jsonl,
    wrong_model_sim,
)


@pytest.mark.parametrize("model,ok", [
    ("attacker/kimi-k2.5", False), ("attacker/kimi-k2.5-20260127", False),
    ("moonshotai/kimi-k2.5", True), ("kimi-k2.5", True), ("123", False), ("", True),
])
def test_the_author_is_part_of_the_model(model, ok):
    assert (ModelCheck("moonshotai/kimi-k2.5").rejection(model) is None) is ok


def test_answers_from_another_author_are_rejected_in_a_real_run(tmp_path):
    sim = wrong_model_sim(tmp_path, "attacker/kimi-k2.5")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(30))
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}])
        res = run_cli(path)
    finally:
        sim.stop()
    assert res.returncode == 0, res.stderr[-3000:]
    db = sqlite3.connect(tmp_path / "run-dir" / "state.sqlite")
    assert db.execute("SELECT COUNT(*) FROM attempts WHERE outcome='rejected:wrong_model'"
                      ).fetchone()[0] > 0
    models = {m for (m,) in db.execute("SELECT model FROM results")}
    assert "attacker/kimi-k2.5" not in models and len(models) == 1


def hostile_run(tmp: Path, rows: int = 6, endpoint: str = "", **head):
    bench = hostile_bench()
    server, url = bench.serve(lambda body: 5, per_write=8, **head)
    try:
        cfg = bench.write_run(tmp, url, "h", max_tokens=100,
                              endpoint="max_attempts = 2\n" + endpoint)
        cfg.write_text(cfg.read_text().replace("max_attempts = 1\n", ""))
        (tmp / "h.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "messages": [
            {"role": "user", "content": f"q {i}"}]}) + "\n" for i in range(rows)))
        _, res = bench.run_cpu(cfg)
    finally:
        server.shutdown()
    return res, sqlite3.connect(tmp / "h-dir" / "state.sqlite")


def test_a_model_that_is_not_a_string_is_rejected_in_a_real_run(tmp_path):
    res, db = hostile_run(tmp_path, model=123)
    assert "Traceback" not in res.stderr
    assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 0
    assert db.execute("SELECT COUNT(*) FROM attempts WHERE outcome='rejected:wrong_model'"
                      ).fetchone()[0] > 0


LISTED = [{"provider_name": "Loop", "tag": "loop/fp8", "quantization": "fp8",
           "pricing": {"prompt": "0.0000005", "completion": "0.000002"}},
          {"provider_name": "Other", "tag": "other/fp4", "quantization": "fp4",
           "pricing": {"prompt": "0.0000005", "completion": "0.000002"}}]
POLICY = 'fetch_endpoints = true\n[endpoint.provider]\nquantizations = ["fp8"]'


@pytest.mark.parametrize("head", [{"provider": ""}, {"provider": None}, {"provider": ["Loop"]},
                                  {"provider": "Loop", "extra": {"quantization": 123}}])
def test_an_unnamed_provider_or_odd_quantization_fails_the_quantization_policy(tmp_path, head):
    res, db = hostile_run(tmp_path, endpoint=POLICY, endpoints=LISTED, **head)
    assert "Traceback" not in res.stderr
    assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 0, res.stderr[-2000:]
    outcomes = {o for (o,) in db.execute("SELECT outcome FROM attempts")}
    assert outcomes and all(o.startswith("rejected:quantization:") for o in outcomes), outcomes


def test_a_named_listed_provider_at_an_allowed_quantization_is_kept(tmp_path):
    res, db = hostile_run(tmp_path, endpoint=POLICY, endpoints=LISTED, provider="Loop",
                          extra={"quantization": "fp8"})
    assert db.execute("SELECT COUNT(*) FROM attempts WHERE outcome LIKE 'rejected:%'"
                      ).fetchone()[0] == 0, res.stderr[-2000:]
