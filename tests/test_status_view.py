"""`specgen status` output and the live view's rendering, from a real finished run."""

from __future__ import annotations

import io
import json
import subprocess

import pytest
from rich.console import Console

from specgen.config import load_config
from specgen.engine.budget import Budget, Prices
from specgen.engine.live import LiveView, progress_line, rows_text, snapshot
from specgen.engine.policy import ProviderPolicy
from specgen.engine.runner import RunOptions, run
from specgen.engine.scheduler import Engine
from specgen.engine.stages import default_stages
from specgen.engine.status import run_status
from specgen.render import get_renderer
from specgen.store import Store
from specgen.tokenizer import load_tokenizer
from test_engine_support import SPECGEN, prompt_rows, write_config, write_jsonl


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("status")
    write_jsonl(tmp / "a.jsonl", prompt_rows(12))
    path = write_config(tmp, "sim", [{"name": "a", "path": "a.jsonl", "limit": 10}],
                        extra="[budget]\nmax_cost_usd = 2.0")
    cfg = load_config(path)
    run(cfg, RunOptions(live=False))
    return path, cfg


def test_status_json_and_text(finished_run):
    path, cfg = finished_run
    out = subprocess.run([*SPECGEN, "status", str(cfg.run_dir), "--json"],
                         capture_output=True, text=True, timeout=60)
    st = json.loads(out.stdout)
    assert st["state"] == "finished" and st["stop_reason"] == "limit reached: a"
    assert st["pid"] is None and st["session"]["pid"]  # no dead pid shown as current
    a = st["datasets"]["a"]
    assert (a["done"], a["total"], a["failed"], a["pending"]) == (10, 10, 0, 0)
    assert a["cost_usd"] > 0 and a["completion_tokens"] > 0 and a["prompt_tokens"] > 0
    assert st["cost_usd"] == pytest.approx(a["cost_usd"]) and st["max_cost_usd"] == 2.0
    assert "live" not in st  # only while running
    text = subprocess.run([*SPECGEN, "status", str(path)], capture_output=True, text=True,
                          timeout=60)  # a config file names its run dir
    assert text.returncode == 0 and "finished" in text.stdout and " a " in text.stdout
    missing = subprocess.run([*SPECGEN, "status", str(cfg.run_dir / "nope")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no specgen run here" in missing.stderr
    assert run_status(cfg.run_dir)["datasets"] == st["datasets"]


async def _engine(cfg) -> Engine:
    tok = load_tokenizer("demo")
    eng = Engine(cfg, store=Store.open(cfg.run_dir), client=None,
                 renderer=get_renderer("kimi-k2.5", tok), stages=default_stages(),
                 policy=ProviderPolicy({}), budget=Budget(2.0, Prices()), session_id=0)
    eng.load()
    return eng


def test_live_view_and_progress_line_render(finished_run):
    import asyncio

    _, cfg = finished_run
    eng = asyncio.run(_engine(cfg))
    assert eng.row_counters["a"].done.wait(10)  # counted in the background: 12 rows
    snap = snapshot(eng)
    d = snap["datasets"][0]
    assert d["done"] == 10 and d["fraction"] == 1.0 and d["progress"] == "10/10 req"
    assert d["rows_total"] == 12 and rows_text(d) == "10/12"
    assert snap["eta_s"] == 0.0  # nothing left (without that: none until a rate is known)
    line = progress_line(eng)
    assert "a: tasks 10 done 0 failed 0 quarantined 0 pending, 10/10 req [limit_reached]" in line
    assert "(reported; no prices known)" in line
    buf = io.StringIO()
    view = LiveView(eng, console=Console(file=buf, force_terminal=True, width=200))
    with view:
        eng.stats.provider("Moonshot AI").latency.add(1.5)
        view.update(force=True)
    text = buf.getvalue()
    assert "limit_reached" in text and "Moonshot AI" in text and "$" in text


def test_live_view_shows_quality_figures_exclusions_and_alarms(finished_run):
    import asyncio

    from specgen.quality.observe import Observation

    _, cfg = finished_run
    eng = asyncio.run(_engine(cfg))
    for i in range(30):
        eng.quality.observe(Observation("Moonshot AI", "a", i, "ok", tools_offered=True,
                                        calls=True, count_check="exact"))
        eng.stats.provider("Moonshot AI").requests += 1
    eng.policy.exclude("Sloppy", {"by": "auto", "reason": "schema accuracy 40% < 90%"})
    eng.policy.exclude("Deaf", {"by": "auto", "reason": "provider 'Deaf' excluded by alarm "
                                "raw_markers on dataset 'a' (…)",
                                "figures": {"metric": "alarm:raw_markers"}})
    eng.alarms_fired.append({"alarm": "raw_markers", "dataset": "a", "share": 0.7,
                             "samples": 20, "action": "stop"})
    line = progress_line(eng)
    assert "excluded Sloppy,Deaf (alarm raw_markers)" in line and "ALARM raw_markers@a" in line
    buf = io.StringIO()
    view = LiveView(eng, console=Console(file=buf, force_terminal=True, width=220))
    with view:
        view.update(force=True)
    text = buf.getvalue()
    assert "schema 100% counts 100% other quar. 0% mism. 0%" in text
    assert "excluded provider Sloppy (auto): schema accuracy 40% < 90%" in text
    assert "excluded provider Deaf (auto): provider 'Deaf' excluded by alarm raw_markers" in text
    assert "ALARM raw_markers on a: 70% of 20 (stop)" in text
    assert eng.live_figures()["excluded_providers"]["Sloppy"]["by"] == "auto"


def test_conversations_that_ended_early_are_named_with_their_reasons():
    from specgen.engine.status import conversation_lines

    lines = conversation_lines({"conversations": {"done": 20, "ended": 11},
                                "end_reasons": {"tool_count_mismatch": 9,
                                                "quarantined:empty": 2}})
    assert lines[0] == ("conversations: done 20, ended early 11 (tool_count_mismatch 9, "
                        "quarantined:empty 2)")


@pytest.mark.parametrize("width", [80, 100, 160])
def test_live_view_fits_the_terminal_without_cutting_names(tmp_path, width):
    import asyncio

    name = "glaive_function_calling_v2_subset"
    write_jsonl(tmp_path / "g.jsonl", prompt_rows(4))
    cfg = load_config(write_config(tmp_path, "sim", [{"name": name, "path": "g.jsonl"}]))
    run(cfg, RunOptions(live=False))
    eng = asyncio.run(_engine(cfg))
    assert eng.row_counters[name].done.wait(10)
    p = eng.stats.provider("Moonshot AI (a long provider name)")
    p.requests, p.ok = 1234, 1200
    p.errors.update({"rate_limit": 30, "stream_error": 4})
    p.latency.add(1.5)
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=True, color_system=None)
    console.print(LiveView(eng, console=console).render())
    lines = buf.getvalue().splitlines()
    assert max(len(ln) for ln in lines) <= width
    text = buf.getvalue()
    assert name in text and "Moonshot AI (a long provider name)" in text  # never cut
    assert "progress" in text and "4/~4 req" in text and "1,234" in text
    assert ("prompt tok" in text) == (width >= 160)  # the least needed column goes first


def test_in_flight_is_never_shown_above_its_own_limit(finished_run, monkeypatch):
    """Issue 35: the batch run's progress line read `in flight 15/11` once the adaptive limit
    fell under the lines already submitted."""
    import asyncio

    from specgen.display import in_flight_text

    assert in_flight_text(6, 16) == "in flight 6/16"
    over = in_flight_text(15, 11, 40)
    assert "15/11" not in over and "over the limit 11 of 40" in over and "4 finish" in over
    _, cfg = finished_run
    eng = asyncio.run(_engine(cfg))
    for _ in range(15):
        eng.inflight[object()] = None  # what is in flight when the limit falls
    monkeypatch.setattr(eng, "concurrency", lambda: (11, "adaptive: rate_limit answers"))
    line = progress_line(eng)
    assert "15/11" not in line and "in flight 15, over the limit 11" in line
    buf = io.StringIO()
    with LiveView(eng, console=Console(file=buf, force_terminal=True, width=200)):
        pass
    assert "15/11" not in buf.getvalue() and "over the limit 11" in buf.getvalue()
