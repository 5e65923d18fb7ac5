"""`specgen probe` measures each provider's prompt delta per request shape (probe.json) and
`[quality] witness_from = PATH` starts a run with them: its first answers are judged at once,
none waits as pending. Real simulator process, real probe subprocess, real store."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specgen.config import ConfigError, load_config
from specgen.quality.witness import CountWitness
from specgen.quality.witness_from import read_deltas, read_offsets
from specgen.store import Store
from test_engine_sim import go
from test_engine_support import (
    ENV,
    REPO,
    SimProcess,
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
rate = 1.0
[[providers]]
name = "Shaper"
tag = "shaper/int4"
quantization = "int4"
tools_rendering_tokens = 30                # declares tools its own way: a delta per block
"""


@pytest.mark.parametrize("told", [True, False], ids=["witness_from", "run-dir-probe"])
def test_a_probe_measures_the_prompt_deltas_a_run_starts_with(tmp_path, told):
    sim = SimProcess(tmp_path, SIM)
    try:
        write_jsonl(tmp_path / "t.jsonl", tool_rows(6))
        path = write_config(tmp_path, sim.url, [{"name": "t", "path": "t.jsonl",
                                                 "turns": "first", "tool_results": "strict"}],
                            endpoint="return_token_ids = false")
        probe = subprocess.run([sys.executable, "-m", "specgen", "probe", str(path),
                                "--per-provider", "4"], capture_output=True, text=True,
                               timeout=180, env=ENV, cwd=REPO)
        assert probe.returncode == 0, probe.stderr
        cfg = load_config(path)
        probe_json = cfg.run_dir / "probe.json"
        deltas = read_deltas(probe_json)
        assert deltas and {p for p, _, _ in deltas} == {"Shaper"}
        assert all(d != 0 and -30 <= d <= 30 for _, _, d in deltas)
        # the run, told of them (or finding the probe.json in its run dir): every first
        # answer of a known shape judged at once
        if told:
            text = path.read_text().replace("[quality]", "")
            path.write_text(text + f'\n[quality]\nwitness_from = "{probe_json}"\n')
        cfg, outcome = go(path)
    finally:
        sim.stop()
    assert outcome.state == "finished", outcome
    log = (cfg.run_dir / "specgen.log").read_text()
    source = "witness_from" if told else "probe"
    assert f"{source} {probe_json}: {len(deltas)} prompt delta(s)" in log, log[-2000:]
    with Store.open(cfg.run_dir) as s:
        rows = list(s.iter_results())
    assert len(rows) == 6
    assert {r.prompt_check for r in rows} == {"rendering"}
    assert {(r.prompt_shape, r.prompt_delta) for r in rows} <= {(sh, d) for _, sh, d in deltas}
    # what a run does with them: the first answer of a learnt shape, from a provider whose
    # counting offset the probe measured, is not pending
    offsets = read_offsets(probe_json)  # per answer form of the canaries
    assert offsets and {p for p, _ in offsets} == {"Shaper"} and set(offsets.values()) == {0}
    w = CountWitness()
    for provider, shape, delta in deltas:
        w.shapes.learn(provider, shape, delta, tools=True)
    for (provider, form), offset in offsets.items():
        w.learn_offset(provider, offset, form)
    _, shape, delta = deltas[0]
    v = w.judge("Shaper", prompt=100, completion=10, usage={"prompt_tokens": 100 + delta,
                                                          "completion_tokens": 10},
                shape=shape, tools=True, key=1, form=next(iter(offsets))[1])
    assert v.prompt_check == "rendering" and v.check == "exact"


def test_a_file_that_is_not_a_probe_is_a_config_error(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"prompt": "hi"}\n')
    bad = tmp_path / "probe.json"
    bad.write_text(json.dumps({"hello": 1}))
    path = write_config(tmp_path, "sim", [{"name": "t", "path": "t.jsonl"}],
                        extra=f'[quality]\nwitness_from = "{bad}"')
    try:
        load_config(path)
    except ConfigError as exc:
        assert "witness_from" in str(exc) and "not a probe.json" in str(exc)
    else:
        raise AssertionError("a file that is no probe.json was taken")


# the same sim, its provider counting per answer form instead
FORMS_SIM = SIM.split("[[providers]]")[0] + """[[providers]]
name = "Azure"
tag = "azure/int4"
quantization = "int4"
usage_completion_offsets = { tools = -1, reasoning = -1, "reasoning+tools" = -2 }
"""


@pytest.mark.parametrize("reasoning", [True, False])
def test_a_probe_measures_each_answer_forms_offset(tmp_path, reasoning):
    # a provider counting per answer form (as Azure K2.5 and the k2-0905 upstreams do): the
    # probe's canaries cover the forms the run will see (tool calls and plain answers, with
    # reasoning when the run reasons), so a run knows each form's offset at its first answer
    sim = SimProcess(tmp_path, FORMS_SIM)
    try:
        write_jsonl(tmp_path / "t.jsonl", tool_rows(6))
        write_jsonl(tmp_path / "p.jsonl", prompt_rows(4))
        path = write_config(tmp_path, sim.url, [
            {"name": "t", "path": "t.jsonl", "turns": "first", "tool_results": "strict"},
            {"name": "p", "path": "p.jsonl"}], endpoint="return_token_ids = false",
            sampling=f"max_tokens = 4096\nreasoning = {str(reasoning).lower()}")
        probe = subprocess.run([sys.executable, "-m", "specgen", "probe", str(path),
                                "--per-provider", "6"], capture_output=True, text=True,
                               timeout=180, env=ENV, cwd=REPO)
        assert probe.returncode == 0, probe.stderr
    finally:
        sim.stop()
    cfg = load_config(path)
    data = json.loads((cfg.run_dir / "probe.json").read_text())
    (row,) = [r for r in data["providers"] if r.get("completion_offsets_by_form")]
    by_form = row["completion_offsets_by_form"]["Azure"]
    want = {"reasoning": -1, "reasoning+tools": -2} if reasoning else {"plain": 0, "tools": -1}
    assert by_form == want, by_form
    offsets = read_offsets(cfg.run_dir / "probe.json")
    w = CountWitness()
    for (provider, form), offset in offsets.items():
        w.learn_offset(provider, offset, form)
    for form, offset in want.items():  # the first answer of each form: judged on arrival
        v = w.judge("Azure", prompt=50, completion=40, key=form, form=form,
                    usage={"prompt_tokens": 50, "completion_tokens": 40 + offset})
        assert v.check == "exact", (form, v.check, v.detail)
