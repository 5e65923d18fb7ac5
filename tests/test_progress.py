"""Progress and ETA (specgen.engine.progress) on synthetic timelines: plans per dataset from
the figures a run has at each moment, the rolling-rate ETA, and the background row counts."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specgen.engine.progress import (
    DatasetFigures,
    EtaEstimator,
    RowCounter,
    fmt_duration,
    plan,
    run_eta,
    tasks_of_closed,
)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def figs(**kw) -> DatasetFigures:
    base = dict(rows_read=0, rows_total=None, exhausted=False, state="active", conversations=0,
                open=0, rows_other_shard=0, limit=None, tasks_known=0, tasks_ended=0)
    return DatasetFigures(**{**base, **kw})


def test_eta_is_blank_until_enough_completions_over_enough_time():
    clock = Clock()
    est = EtaEstimator(clock=clock)
    for t in range(0, 9):  # 9 s at 5 completions/s: many completions, too short
        clock.t = float(t)
        est.sample(5 * t)
    assert est.eta(100) is None
    est2 = EtaEstimator(clock=clock)
    for t in range(0, 30):  # 30 s, but only 6 completions
        clock.t = float(t)
        est2.sample(t // 5)
    assert est2.eta(100) is None
    clock.t = 10.0
    est.sample(50)
    assert est.eta(100) == pytest.approx(20.0)  # 100 left at 5/s
    assert est.eta(0) == 0.0


def test_eta_follows_the_recent_rate_not_the_average():
    clock = Clock()
    est = EtaEstimator(window=60.0, clock=clock)
    done = 0
    for t in range(0, 121):  # 10/s for two minutes
        clock.t = float(t)
        done = 10 * t
        est.sample(done)
    assert est.eta(600) == pytest.approx(60.0)
    for t in range(121, 241):  # then 2/s: after a window the ETA reflects 2/s only
        clock.t = float(t)
        done += 2
        est.sample(done)
    assert est.eta(600) == pytest.approx(300.0, rel=0.02)


def test_an_early_run_with_a_counted_source_has_a_real_percentage():
    # 31 rows counted; 10 read, 4 tasks ended: the old view showed '-' until the file was read
    p = plan(figs(rows_read=10, rows_total=31, conversations=10, open=6, tasks_known=10,
                  tasks_ended=4))
    assert p.kind == "estimate" and p.basis == "requests"
    assert p.requests == pytest.approx(31.0)
    assert p.fraction == pytest.approx(4 / 31)
    assert p.label() == "4/~31 req 13%"


def test_tasks_per_conversation_come_from_finished_conversations():
    # turns = "all": 10 finished conversations made 16 tasks, 20 rows still to read
    p = plan(figs(rows_read=12, rows_total=32, conversations=12, open=2, tasks_known=18,
                  tasks_ended=16, closed_convs=10, closed_tasks=16))
    assert p.requests == pytest.approx(18 + 2 * 0.6 + 20 * 1.6)
    assert p.remaining == pytest.approx(p.requests - 16)


def test_the_plan_is_exact_once_read_and_nothing_is_open():
    p = plan(figs(rows_read=31, rows_total=31, exhausted=True, state="done", conversations=31,
                  tasks_known=49, tasks_ended=49, closed_convs=31, closed_tasks=49))
    assert (p.kind, p.requests, p.fraction, p.remaining) == ("exact", 49, 1.0, 0.0)
    assert p.label() == "49/49 req"


def test_unknown_size_is_a_lower_bound_and_so_is_the_eta():
    p = plan(figs(rows_read=40, conversations=40, open=10, tasks_known=40, tasks_ended=30))
    assert p.kind == "lower_bound" and p.fraction is None
    assert p.label() == "30/≥40 req"
    assert plan(figs()).label() == "-"
    clock = Clock()
    est = EtaEstimator(clock=clock)
    for t in range(0, 11):
        clock.t = float(t)
        est.sample(3 * t)
    eta, lower = run_eta([p], est)
    assert lower and eta == pytest.approx(10 / 3)


def test_a_limit_caps_the_plan_even_without_a_known_size():
    p = plan(figs(rows_read=20, conversations=20, limit=50, tasks_known=20, tasks_ended=20,
                  closed_convs=20, closed_tasks=20))
    assert p.kind == "estimate" and p.requests == pytest.approx(50)
    sharded = plan(figs(rows_read=20, rows_total=1000, conversations=10, rows_other_shard=10,
                        limit=50, tasks_known=10, tasks_ended=10, closed_convs=10,
                        closed_tasks=10))
    assert sharded.requests == pytest.approx(10 + 30 * 0.5)  # half the rows are ours


def test_the_budget_shows_when_it_ends_the_dataset_first():
    p = plan(figs(rows_read=100, rows_total=1000, conversations=100, tasks_known=100,
                  tasks_ended=100, closed_convs=100, closed_tasks=100, token_budget=50_000,
                  completion_tokens=25_000))
    assert p.basis == "budget" and p.fraction == pytest.approx(0.5)
    assert p.remaining == pytest.approx(100)  # 250 tokens a request: 100 more fit
    assert p.label() == "50% of budget"
    spent = plan(figs(rows_read=100, rows_total=1000, state="budget_reached", conversations=100,
                      tasks_known=120, tasks_ended=100, token_budget=50_000,
                      completion_tokens=49_000))
    assert (spent.fraction, spent.remaining) == (1.0, 0.0)


def test_the_eta_covers_every_dataset_left():
    first = plan(figs(rows_read=50, rows_total=100, conversations=50, tasks_known=50,
                      tasks_ended=50, closed_convs=50, closed_tasks=50))
    second = plan(figs(rows_total=200))  # not started yet
    clock = Clock()
    est = EtaEstimator(clock=clock)
    for t in range(0, 11):
        clock.t = float(t)
        est.sample(5 * t)
    eta, lower = run_eta([first, second], est)
    assert not lower and eta == pytest.approx((50 + 200) / 5)


def test_tasks_of_a_finished_conversation():
    assert tasks_of_closed(3, "done", None) == 3
    assert tasks_of_closed(1, "ended", "tool_count_mismatch") == 1
    assert tasks_of_closed(1, "ended", "quarantined:empty") == 2
    assert tasks_of_closed(0, "failed", "failed:timeout") == 1
    assert tasks_of_closed(2, "failed", "planner_error: boom") == 2


def test_row_counts_in_the_background(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(1234)))
    c = RowCounter(jsonl)
    assert c.done.wait(10) and c.rows == 1234
    pq.write_table(pa.table({"prompt": [f"p{i}" for i in range(77)]}), tmp_path / "b.parquet")
    c = RowCounter(tmp_path / "b.parquet")
    assert c.done.wait(10) and c.rows == 77
    (tmp_path / "c.json").write_text(json.dumps([{"prompt": "x"}] * 5))
    c = RowCounter(tmp_path / "c.json")  # JSON would have to be parsed: left unknown
    assert c.done.wait(10) and c.rows is None
    c = RowCounter(tmp_path / "missing.jsonl")
    assert c.done.wait(10) and c.rows is None


def test_durations():
    assert [fmt_duration(x) for x in (None, 0, 0.2, 45.4, 185, 7620)] == [
        "-", "0s", "<1s", "45s", "3m05s", "2h07m"]
