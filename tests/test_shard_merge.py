"""End to end against the simulator: `specgen run` (whole and `--shard i/2`), `merge`, `export`,
`verify` and `report` as a user runs them, in real processes."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from specgen.export import ExportOptions, export_run
from specgen.report import SECTION_IDS, build_report
from specgen.verify import verify_run

# The simulator (specgen.sim, issue 3) may land after these tests; until then they skip.
pytest.importorskip("specgen.sim.server", reason="the simulator is not in this checkout yet")

CONFIG = """\
run_dir = "{run_dir}"
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
base_url = "sim"
concurrency = 8
return_token_ids = true
[sampling]
max_tokens = 8192
[sim]
config = "sim.toml"
seed = 7
[[dataset]]
name = "chats"
path = "chats.jsonl"
turns = "all"
[[dataset]]
name = "single"
path = "single.jsonl"
"""

SIM = """\
[length]
distribution = "uniform"
min = 8
max = 120
[faults]
rate_limit = 0.1
"""


def specgen(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "specgen", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"specgen {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("e2e")
    with open(d / "chats.jsonl", "w") as f:
        for i in range(16):
            msgs = [{"role": "user", "content": f"Question {i}: tell me about item {i}."}]
            if i % 3 == 0:
                msgs += [{"role": "assistant", "content": "a first answer"},
                         {"role": "user", "content": "and then?"}]
            msgs.append({"role": "assistant", "content": "to be regenerated"})
            f.write(json.dumps({"id": f"q{i}", "messages": msgs}) + "\n")
    with open(d / "single.jsonl", "w") as f:
        for i in range(10):
            f.write(json.dumps({"id": f"s{i}", "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"Say {i}."}]}) + "\n")
    (d / "sim.toml").write_text(SIM)
    out = {}
    for name, shard in (("single", None), ("shard0", "0/2"), ("shard1", "1/2")):
        cfg = d / f"{name}.toml"
        cfg.write_text(CONFIG.format(run_dir=name))
        specgen("run", str(cfg), "--no-live", *(["--shard", shard] if shard else []), cwd=d)
        out[name] = d / name
    specgen("merge", str(out["shard0"]), str(out["shard1"]), "-o", str(d / "merged"), cwd=d)
    out["merged"] = d / "merged"
    out["dir"] = d
    return out


def test_shards_are_disjoint_and_merge_equals_the_single_run(runs, tmp_path):
    single = verify_run(runs["single"])
    assert single.samples > 20 and single.ok
    parts = [verify_run(runs[k]).samples for k in ("shard0", "shard1")]
    assert all(parts) and sum(parts) == single.samples
    for fmt, jsonl_ in (("tokens", False), ("tokens", True), ("specforge", False),
                        ("openai", False)):
        a = tmp_path / f"single.{fmt}{jsonl_}"
        b = tmp_path / f"merged.{fmt}{jsonl_}"
        export_run(runs["single"], ExportOptions(format=fmt, jsonl=jsonl_, out=a))
        export_run(runs["merged"], ExportOptions(format=fmt, jsonl=jsonl_, out=b))
        assert a.read_bytes() == b.read_bytes(), f"{fmt} export differs"
    merged = verify_run(runs["merged"])
    assert merged.ok and merged.samples == single.samples


def test_verify_measures_the_simulators_true_ids(runs):
    r = verify_run(runs["single"])
    assert r.true_prompt.checked == r.true_completion.checked == r.samples
    assert r.true_prompt.mismatched == r.true_completion.mismatched == 0


def test_cli_export_verify_report_on_the_merged_run(runs):
    d, merged = runs["dir"], runs["merged"]
    proc = specgen("export", str(merged), "--format", "tokens", "--merge-prefix", cwd=d)
    assert "manifest" in proc.stdout
    manifest = json.loads((merged / "exports" / "tokens.manifest.json").read_text())
    assert manifest["merged_from"] and manifest["shard"] is None
    assert manifest["per_dataset"]["single"]["samples"] == 10
    proc = specgen("verify", str(merged), cwd=d)
    assert proc.stdout.rstrip().endswith("OK")
    specgen("report", str(merged), "-o", str(d / "report.html"), cwd=d)
    html = (d / "report.html").read_text()
    for sid in SECTION_IDS:
        assert f'<section id="{sid}">' in html
    text = build_report(merged, text=True)
    assert "rate_limit " in text  # the simulator's 429s show up as an error class


def test_raw_mode_true_id_mismatches_are_measured(runs, tmp_path):
    d = runs["dir"]
    (d / "sim-raw.toml").write_text('text_mode = "raw"\nraw_rate = 0.5\n' + SIM)
    cfg = d / "raw.toml"
    # the count witness off: this measures verify against the server's ids, and a witness
    # repair at an offset the session later loses can still change a sample's text (a known
    # defect, docs/quality.md) — not what this test is about
    cfg.write_text(CONFIG.format(run_dir="raw").replace('config = "sim.toml"',
                                                        'config = "sim-raw.toml"')
                   .replace("[sim]\n", "[quality]\ncount_witness = false\n[sim]\n")
                   # answers cut at max_tokens and kept: stored without a stop token
                   + '[[dataset]]\nname = "cut"\npath = "single.jsonl"\nmax_tokens = 12\n'
                     'on_length = "keep"\n')
    specgen("run", str(cfg), "--no-live", cwd=d)
    conn = sqlite3.connect(d / "raw" / "state.sqlite")
    assert conn.execute("SELECT COUNT(*) FROM results WHERE dataset = 'cut' "
                        "AND finish_reason = 'length'").fetchone()[0] > 0
    conn.close()
    r = verify_run(d / "raw")
    s = r.true_completion
    assert not r.failures  # our ids are the canonical render: every check passes
    assert s.checked == r.samples and 0 < s.mismatched < s.checked
    assert s.same_text == s.mismatched  # raw mode re-segments; the text is the same
    assert not r.true_ids_ok and r.exit_code == 1
    assert verify_run(d / "raw", max_true_mismatch=1.0).exit_code == 0
