"""Our `tokens` export read by speculators' (vLLM) own training-data builder.

speculators (PyPI `speculators`) pins transformers and pulls in vLLM-side clients, so it is not
a dependency of specgen. This test runs it in the interpreter named by
SPECGEN_SPECULATORS_PYTHON (a venv with `speculators` installed with --no-deps plus torch,
transformers, datasets, openai, httpx, hs_connectors: see docs/outputs.md), or in this
interpreter when it can import speculators; otherwise it skips. This file is also the probe run
there (`python tests/test_export_speculators.py TOKENS.parquet RESULT.json`).

speculators accepts "speculator-format" rows that already carry `input_ids` + `loss_mask` and
passes them through without re-rendering: the ids and masks it trains on must be ours, exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

try:
    import pytest
except ImportError:  # the probe runs in the speculators interpreter, which needs no pytest
    pytest = None


def probe(tokens_path: str, out_path: str) -> None:
    from datasets import load_dataset
    from speculators.data_generation.preprocessing import build_speculator_training_dataset

    raw = load_dataset("parquet", data_files=tokens_path, split="train")
    built = build_speculator_training_dataset(raw, processor=None, max_length=1 << 20, num_proc=1)
    rows = [{"input_ids": built[i]["input_ids"].tolist(), "loss_mask": built[i]["loss_mask"].tolist()}
            for i in range(len(built))]
    Path(out_path).write_text(json.dumps({"rows": rows, "columns": built.column_names}))


def speculators_python() -> str:
    env = os.environ.get("SPECGEN_SPECULATORS_PYTHON")
    if env:
        if not Path(env).exists():
            pytest.skip(f"SPECGEN_SPECULATORS_PYTHON={env} does not exist")
        return env
    try:
        import speculators.data_generation.preprocessing  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: not available here
        pytest.skip("speculators is not installed here; set SPECGEN_SPECULATORS_PYTHON to an "
                    f"interpreter that has it, see docs/outputs.md ({type(exc).__name__}: {exc})")
    return sys.executable


def test_speculators_reads_our_tokens_export_unchanged(tmp_path):
    from specgen.export import ExportOptions, export_run
    from specgen.store import Store
    from test_export_support import build_store, chat

    python = speculators_python()
    run = build_store(tmp_path / "run", {"chat": [chat(i, 2) for i in range(4)],
                                         "tools": [chat(i, 1, tools=True) for i in range(2)]},
                      turns="all")
    export_run(run, ExportOptions(format="tokens", out=tmp_path / "tokens.parquet"))
    proc = subprocess.run([python, __file__, str(tmp_path / "tokens.parquet"),
                           str(tmp_path / "out.json")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"speculators probe failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    got = json.loads((tmp_path / "out.json").read_text())
    with Store.open(run) as s:
        want = list(s.iter_results())
    assert {"input_ids", "loss_mask"} <= set(got["columns"])
    assert [r["input_ids"] for r in got["rows"]] == [w.input_ids for w in want]
    assert [r["loss_mask"] for r in got["rows"]] == [w.loss_mask for w in want]


if __name__ == "__main__":
    probe(sys.argv[1], sys.argv[2])
