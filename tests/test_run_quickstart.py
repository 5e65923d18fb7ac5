"""The quickstart config runs end to end (against its simulator, latencies zeroed) and every
sample's ids equal the true ids the simulator reports."""

from __future__ import annotations

from pathlib import Path

from specgen.config import load_config
from specgen.engine.runner import RunOptions, run
from specgen.engine.status import run_status
from specgen.sim import load_sim_config
from specgen.store import Store
from test_engine_support import check_store

REPO = Path(__file__).resolve().parents[1]


def test_quickstart_runs_and_samples_are_exact(tmp_path):
    cfg = load_config(REPO / "examples" / "quickstart.toml")
    assert cfg.endpoint.is_sim and cfg.target.tokenizer == "demo"
    assert [d.name for d in cfg.datasets] == ["glaive_tools", "reasoning"]
    sim = load_sim_config(cfg.sim.config)
    for p in sim.providers:  # the quickstart's pace is for humans; tests need not wait
        p.latency_s, p.tokens_per_second = 0.0, 0.0
    cfg.sim.config = sim
    cfg.run_dir = tmp_path / "qs"
    outcome = run(cfg, RunOptions(live=False))
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
