"""`specgen status` output and the live view's rendering, from a real finished run."""

from __future__ import annotations

import io
import json
import subprocess

import pytest
from rich.console import Console

from specgen.config import load_config
from specgen.engine.budget import Budget, Prices
from specgen.engine.live import LiveView, progress_line, snapshot
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
    assert st["state"] == "finished" and st["pid"] and st["stop_reason"] == "limit reached: a"
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
    snap = snapshot(eng)
    assert snap["datasets"][0]["done"] == 10 and snap["datasets"][0]["fraction"] == 1.0
    line = progress_line(eng)
    assert "a: 10 done 0 failed 0 pending [limit_reached]" in line
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
    eng.alarms_fired.append({"alarm": "raw_markers", "dataset": "a", "share": 0.7,
                             "samples": 20, "action": "stop"})
    line = progress_line(eng)
    assert "excluded Sloppy" in line and "ALARM raw_markers@a" in line
    buf = io.StringIO()
    view = LiveView(eng, console=Console(file=buf, force_terminal=True, width=220))
    with view:
        view.update(force=True)
    text = buf.getvalue()
    assert "schema 100% counts 100% quar. 0% mism. 0%" in text
    assert "excluded provider Sloppy (auto): schema accuracy 40% < 90%" in text
    assert "ALARM raw_markers on a: 70% of 20 (stop)" in text
    assert eng.live_figures()["excluded_providers"]["Sloppy"]["by"] == "auto"
