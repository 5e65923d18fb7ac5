"""A seeded slice of the random differential against the official Kimi templates.

The full run (≥ 2,000 K2.5 conversations per thinking mode, 500 K2-Thinking, 500 K2-Instruct)
is `bench/official_kimi_diff.py`; this runs the same generator and comparison on a few seeds so
the suite stays fast — without the 25,000-character runs, which the bench keeps
(tests/kimi_differential.py says what is compared and the documented
choices).
"""

from __future__ import annotations

import json

import pytest

from conftest import model_path, models_root
from kimi_differential import difference
from kimi_random import Gen
from official_kimi import OfficialKimi
from specgen.render import get_renderer
from specgen.tokenizer import load_tokenizer

N = 20  # without the 25,000-character runs (their own tests: test_exactness.py,
# test_tokenizer_long_runs.py; the bench runs them too): the official side walks them slowly


@pytest.fixture(scope="module")
def setups(tmp_path_factory):
    k25, k2i = model_path("kimi-k2.5"), model_path("kimi-k2-instruct")
    thinking = models_root() / "templates" / "kimi-k2-thinking.chat_template.jinja"
    if not (k25 / "chat_template.jinja").exists() or not thinking.exists():
        pytest.skip("official templates not found")
    template = tmp_path_factory.mktemp("k2i") / "k2-instruct.jinja"
    template.write_text(json.loads((k2i / "tokenizer_config.json").read_text())["chat_template"])
    tok, tok_i = load_tokenizer(k25), load_tokenizer(k2i)
    return {
        "kimi-k2.5": (tok, OfficialKimi(k25 / "chat_template.jinja", k25 / "tiktoken.model",
                                        k25 / "tokenizer_config.json",
                                        k25 / "tool_declaration_ts.py")),
        "kimi-k2-thinking": (tok, OfficialKimi(thinking, k25 / "tiktoken.model",
                                               k25 / "tokenizer_config.json")),
        "kimi-k2-instruct": (tok_i, OfficialKimi(template, k2i / "tiktoken.model",
                                                 k2i / "tokenizer_config.json")),
    }


def conversation(variant: str, seed: int):
    g = Gen(seed, long_runs=False)
    if variant == "kimi-k2-instruct":
        return g.conversation(tool_calls=False, names=False, developer=True,
                              allow_none=False), g.tools()
    return g.conversation(), g.tools()


@pytest.mark.parametrize(("variant", "thinking"), [
    ("kimi-k2.5", True), ("kimi-k2.5", False), ("kimi-k2-thinking", True),
    ("kimi-k2-instruct", True)])
def test_random_conversations_equal_the_official_template(setups, variant, thinking):
    tok, official = setups[variant]
    native = get_renderer(variant, tok, thinking=thinking)
    misses = []
    for seed in range(N):
        msgs, tools = conversation(variant, seed)
        diff = difference(native, official, msgs, tools, variant=variant, thinking=thinking)
        if diff:
            misses.append((seed, diff))
    assert not misses, misses[:5]
