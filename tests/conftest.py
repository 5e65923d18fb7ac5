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
