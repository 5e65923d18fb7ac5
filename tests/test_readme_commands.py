"""Every command the README shows for the quickstart and the batch example runs as written, on a
fresh copy of `examples/`, and exits 0 (issue 35). The commands are read from the README's
fenced bash blocks, so the README and this test cannot drift apart. Then, for the quickstart
(a live run with faults) and the batch example, `status --json`, the run summary and the
report give the same counts.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# runs the README's reader can make on a fresh machine, with no key (the simulator)
RUNNABLE = ("quickstart", "batch-sim")
# what the README must show for them (issue 35, "Done when")
REQUIRED = [("run", "quickstart"), ("status", "quickstart"), ("stats", "quickstart"),
            ("verify", "quickstart"), ("export", "tokens"), ("export", "--jsonl"),
            ("export", "specforge"), ("export", "openai"), ("export", "vocab"),
            ("report", "quickstart"), ("run", "batch-sim"), ("status", "batch-sim")]


def fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def readme_commands() -> list[list[str]]:
    """The `specgen` commands of the README's bash blocks that name a runnable example, in
    order (a line `a && specgen x` gives `specgen x`; comments dropped)."""
    out = []
    for block in fenced(README.read_text(), "bash"):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            segment: list[str] = []
            for w in [*words, "&&"]:
                if w != "&&":
                    segment.append(w)
                    continue
                if segment[:1] == ["specgen"] and any(r in a for a in segment for r in RUNNABLE):
                    out.append(segment)
                segment = []
    return out


def specgen(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specgen", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    """A fresh machine's view: the repo's examples copied, the README's commands run in
    order from the copy's root. The simulator's pace is for people watching: its latencies
    and the least time of a batch are cut (the commands stay as written)."""
    root = tmp_path_factory.mktemp("readme")
    shutil.copytree(REPO / "examples", root / "examples")
    sim = root / "examples" / "quickstart-sim.toml"
    text = re.sub(r"(?m)^latency_s = .*$", "latency_s = 0.0", sim.read_text())
    text = re.sub(r"(?m)^tokens_per_second = .*$", "tokens_per_second = 0", text)
    sim.write_text("batch_processing_s = 0.2\n" + text)
    results = []
    for cmd in readme_commands():
        results.append((cmd, specgen(cmd[1:], root)))
    return root, results


def test_the_readme_shows_every_command_a_newcomer_needs():
    cmds = [" ".join(c) for c in readme_commands()]
    for verb, what in REQUIRED:
        assert any(c.startswith(f"specgen {verb} ") and what in c for c in cmds), (verb, what)


def test_every_readme_command_runs_as_written_and_exits_0(readme_run):
    root, results = readme_run
    assert len(results) >= len(REQUIRED)
    for cmd, proc in results:
        assert proc.returncode == 0, (" ".join(cmd), proc.stdout[-2000:], proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, " ".join(cmd)
    exports = root / "runs" / "quickstart" / "exports"
    for name in ("tokens.parquet", "tokens.manifest.json", "tokens.jsonl",
                 "tokens.jsonl.manifest.json", "specforge.jsonl", "openai.jsonl",
                 "vocab/d2t.npy", "vocab/manifest.json"):
        assert (exports / name).is_file(), name
    assert (root / "runs" / "quickstart" / "report.html").is_file()


def test_the_readme_python_block_loads_the_export(readme_run):
    root, _ = readme_run
    (block,) = [b for b in fenced(README.read_text(), "python") if "load_dataset" in b]
    proc = subprocess.run([sys.executable, "-c", block + "\nprint(len(ds))"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) > 0


def test_the_readme_vocab_size_fits_the_demo_tokenizer_and_a_larger_one_says_what_to_do(
        readme_run):
    root, _ = readme_run
    proc = specgen(["export", "runs/quickstart", "--format", "vocab", "--draft-vocab-size",
                    "32000", "-o", "v32k"], root)
    assert proc.returncode == 2
    assert "larger than the target's vocabulary (4,352 ids)" in proc.stderr
    assert "give at most 4,352" in proc.stderr and "leave --draft-vocab-size out" in proc.stderr


def test_help_lists_every_export_format():
    from specgen.export import FORMATS

    out = subprocess.run([sys.executable, "-m", "specgen", "--help"], capture_output=True,
                         text=True, timeout=60).stdout
    entry = " ".join(out.split("    export ", 1)[1].split("    verify ", 1)[0].split())
    assert all(f in entry for f in FORMATS), entry


def test_the_torch_hint_and_the_readme_agree_on_a_cpu_build():
    from specgen.export.vocab import TORCH_INSTALL

    assert "download.pytorch.org/whl/cpu" in TORCH_INSTALL
    assert TORCH_INSTALL in " ".join(README.read_text().split())


# -- the same counts everywhere ----------------------------------------------------------------

def summary_counts(stdout: str) -> dict[str, tuple[int, ...]]:
    """{dataset: (done, failed, quarantined, pending, attempts)} from the run summary."""
    out = {}
    for m in re.finditer(r"^  (\S+) \[[a-z_]+\]: tasks ([\d,]+) done, ([\d,]+) failed, "
                         r"([\d,]+) quarantined, ([\d,]+) pending \(([\d,]+) attempts\)",
                         stdout, flags=re.M):
        out[m.group(1)] = tuple(int(g.replace(",", "")) for g in m.groups()[1:])
    return out


def report_counts(text: str) -> dict[str, tuple[int, int]]:
    """{dataset: (samples, attempts)} from the text report's "Per dataset" table."""
    lines = text.split("Per dataset:")[1].splitlines()
    head = re.split(r"\s{2,}", lines[1].strip())
    out = {}
    for line in lines[2:]:
        if not line.startswith("  ") or line.endswith(":"):
            break
        cells = re.split(r"\s{2,}", line.strip())
        samples = int(cells[head.index("samples")].replace(",", ""))
        attempts = int(cells[head.index("attempts")].replace(",", ""))
        out[cells[0]] = (samples, attempts)
    return out


@pytest.mark.parametrize("name", ["quickstart", "batch-sim"])
def test_status_summary_and_report_give_the_same_counts(readme_run, name):
    root, results = readme_run
    (run,) = [p for c, p in results if c[1] == "run" and name in c[2]]
    status = json.loads(specgen(["status", f"runs/{name}", "--json"], root).stdout)
    summary = summary_counts(run.stdout)
    report = report_counts(specgen(["report", f"runs/{name}", "--text"], root).stdout)
    assert set(summary) == set(status["datasets"]) == set(report)
    faults = 0
    for ds, d in status["datasets"].items():
        assert summary[ds] == (d["done"], d["failed"], d["quarantined"], d["pending"],
                               d["attempts"]), ds
        assert report[ds] == (d["samples"], d["attempts"]), ds
        assert d["samples"] == d["done"]  # a kept sample is a done task
        faults += d["attempts"] - d["done"] - d["failed"] - d["quarantined"]
    assert faults > 0  # the run met faults (retried attempts): the counts were tested on them
    assert sum(p["requests"] for p in status["providers"].values()) == sum(
        d["attempts"] for d in status["datasets"].values())
    ok = sum(p["outcomes"].get("ok", 0) for p in status["providers"].values())
    assert ok == sum(d["samples"] for d in status["datasets"].values())
    # the live view's last progress line (the run's log) says the same per dataset
    for ds, d in status["datasets"].items():
        shown = re.findall(rf"{re.escape(ds)}: tasks ([\d,]+) done ([\d,]+) failed ([\d,]+) "
                           r"quarantined ([\d,]+) pending", run.stderr)
        assert shown, run.stderr[-2000:]
        assert tuple(int(x.replace(",", "")) for x in shown[-1]) == (
            d["done"], d["failed"], d["quarantined"], d["pending"]), ds
    j = status["judgement"]
    assert j["kept"] == ok and j["quarantined"] == status["quarantined"]
    # the summary says whether its early ends are expected (tool loops left: yes)
    if any(d["end_reasons"] for d in status["datasets"].values()):
        assert "ended early: " in run.stdout and " expected: the model's tool calls" in run.stdout
    if name == "batch-sim":
        b = status["batches"]
        lines = b["lines"]
        errors = sum(n for o, n in lines.items() if o.startswith("error:"))
        completed = sum(v["completed"] for v in b["by_state"].values())
        failed = sum(v["failed"] for v in b["by_state"].values())
        assert (completed, failed) == (lines.get("ok", 0), errors), b
        answered = sum(n for p in status["providers"].values()
                       for o, n in p["outcomes"].items()
                       if o.split(":", 1)[0] in ("ok", "quarantined", "rejected"))
        assert lines.get("ok", 0) == answered  # every answered line is a judged answer
