"""`[quality] repetition` in a seeded simulator run with planted repetition loops: flagged by
default (kept, an event, the `repetition` alarm counts them), quarantined as `repetition` with
`action = "quarantine"`; a bad value is a message naming the key."""

from __future__ import annotations

import json
import sqlite3

import pytest

from test_engine_support import prompt_rows, run_cli, write_config, write_jsonl
from test_sim_support import SimProcess
from test_stats import stats_json

LOOPS = {"loop1": "Story. [[sim:repeat 160]]", "loop2": "Again. [[sim:repeat 220]]",
         "loop3": "More. [[sim:repeat 180]]"}
NORMAL = 12


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    s = SimProcess(tmp_path_factory.mktemp("sim"), '[length]\ndistribution = "fixed"\n'
                   'tokens = 60\n', seed=11)
    yield s
    s.stop()


def planted_run(tmp, sim, extra: str):
    rows = [{"id": k, "messages": [{"role": "user", "content": v}]} for k, v in LOOPS.items()]
    write_jsonl(tmp / "a.jsonl", rows + prompt_rows(NORMAL, prefix="n"))
    cfg = write_config(tmp, sim.url, [{"name": "a", "path": "a.jsonl"}],
                       sampling="max_tokens = 400\nreasoning = false", extra=extra)
    return cfg, run_cli(cfg), tmp / "run-dir"


def events(run_dir, kind):
    with sqlite3.connect(run_dir / "state.sqlite") as c:
        return [d for (d,) in c.execute("SELECT detail FROM events WHERE kind=?", (kind,))]


def test_flagged_by_default_and_the_alarm_counts_them(tmp_path, sim):
    extra = ('\n[quality]\non_alarm = "warn"\n'
             '[quality.alarms]\nrepetition = { threshold = 0.1, min_samples = 5 }')
    _, proc, run_dir = planted_run(tmp_path, sim, extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    st = stats_json(run_dir)["total"]
    assert st["samples"] == NORMAL + len(LOOPS)  # kept
    assert {lp["sample"] for lp in st["repetition"]["loops"]} == {f"a/{k}/1" for k in LOOPS}
    assert any("repetition" in d for d in events(run_dir, "repetition"))
    alarms = [d for d in events(run_dir, "alarm") if "alarm repetition" in d]
    assert alarms and "dataset 'a'" in alarms[0]


def test_quarantined_with_action_quarantine(tmp_path, sim):
    extra = '\n[quality]\nrepetition = { tokens = 64, action = "quarantine" }\nalarms = false'
    _, proc, run_dir = planted_run(tmp_path, sim, extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    st = stats_json(run_dir)["total"]
    assert st["samples"] == NORMAL and st["repetition"]["count"] == 0
    assert st["quarantined"]["repetition"]["count"] == len(LOOPS)
    with sqlite3.connect(run_dir / "state.sqlite") as c:
        detail = json.loads(c.execute("SELECT detail FROM quarantine WHERE reason='repetition'")
                            .fetchone()[0])
    assert detail["tokens"] >= 64 and 1 <= detail["period"] <= 64


def test_off_keeps_them_silently(tmp_path, sim):
    _, proc, run_dir = planted_run(tmp_path, sim, "\n[quality]\nrepetition = false")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert events(run_dir, "repetition") == []
    assert stats_json(run_dir)["total"]["repetition"]["count"] == len(LOOPS)


@pytest.mark.parametrize(("value", "message"), [
    ('{ action = "drop" }', "quality.repetition.action must be one of flag, quarantine"),
    ('{ tokens = 0 }', "quality.repetition.tokens must be an integer >= 1"),
    ('{ size = 3 }', "quality.repetition has unknown key(s) size"),
    ('"yes"', "'quality.repetition' has the wrong type"),
])
def test_bad_values_name_the_key(tmp_path, sim, value, message):
    cfg, proc, _ = planted_run(tmp_path, sim, f"\n[quality]\nrepetition = {value}")
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
