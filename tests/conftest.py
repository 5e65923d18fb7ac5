"""Shared test helpers: where the real tokenizer files live, and small fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def models_root() -> Path:
    return Path(os.environ.get("SPECGEN_MODELS_DIR") or (REPO.parent / "shared" / "models"))


def model_path(name: str) -> Path:
    """Path of a real tokenizer dir under SPECGEN_MODELS_DIR; skips the test when absent."""
    path = models_root() / name
    if not path.is_dir():
        pytest.skip(f"real tokenizer files {name!r} not found under {models_root()} "
                    "(set SPECGEN_MODELS_DIR)")
    return path


@pytest.fixture
def models_dir() -> Path:
    root = models_root()
    if not root.is_dir():
        pytest.skip(f"real tokenizer files not found at {root} (set SPECGEN_MODELS_DIR)")
    return root


@pytest.fixture(scope="session")
def demo_tokenizer():
    from specgen.tokenizer import load_tokenizer

    return load_tokenizer("demo")


@pytest.fixture(scope="session")
def kimi_tokenizer():
    from specgen.tokenizer import load_tokenizer

    return load_tokenizer(model_path("kimi-k2.5"))


# Modules of end-to-end tests (real `specgen` processes and simulators run for seconds, kills,
# outage windows, the trainers' own loaders, the official templates' property tests): marked
# `slow`, so `python -m pytest -m "not slow"` is the quick loop while developing. CI and the
# README's `python -m pytest` run everything.
SLOW_MODULES = frozenset({
    "test_audit_graceful_outage", "test_audit_startup_signals", "test_batch",
    "test_batch_wire", "test_config_realworld", "test_disk_full_outcomes",
    "test_engine_disk_full", "test_engine_quality", "test_engine_realworld", "test_export_specforge",
    "test_export_speculators", "test_export_vocab", "test_export_witness", "test_hostile_streams",
    "test_loop_stall", "test_official_kimi_diff", "test_outputs_atomic", "test_probe",
    "test_proxy", "test_run_outcomes", "test_run_process", "test_shard_merge",
    "test_tokenizer_long_runs", "test_witness_from", "test_witness_providers",
})


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(slow)
