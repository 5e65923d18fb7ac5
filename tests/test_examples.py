"""The example configs shipped in examples/ are valid, and the README's commands match CI."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specgen.config import load_config

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["quickstart.toml", "openrouter-kimi-k2.5.toml", "local-vllm.toml",
                                  "local-tokens.toml", "probe.toml", "batch-sim.toml"])
def test_example_configs_load(name):
    cfg = load_config(REPO / "examples" / name)
    assert cfg.datasets and all(d.path.exists() for d in cfg.datasets)


def test_ci_runs_exactly_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    test_block = next(b for b in blocks if "run the tests" in b)
    command = [ln for ln in test_block.splitlines() if ln and not ln.startswith("#")]
    assert len(command) == 1
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert command[0] in ci, f"{command[0]!r} is not a line of .ci/run"
