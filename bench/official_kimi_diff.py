"""The full random differential of the native Kimi renderers against the official templates.

    SPECGEN_MODELS_DIR=../shared/models python bench/official_kimi_diff.py \
        [--k25 2000] [--k2-thinking 500] [--k2-instruct 500] [--seed 0]

Runs the generator and comparison the test suite samples (tests/kimi_random.py,
tests/kimi_differential.py): K2.5 with thinking on and off (--k25 conversations each),
K2-Thinking and K2-Instruct, and prints per variant how many are exact, the misses (seed and
first difference) and the time taken. Exit 1 when any conversation differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = os.path.dirname(os.path.abspath(__file__))  # bench/tokenize.py shadows the stdlib's
sys.path[:] = [str(ROOT / "src"), str(ROOT / "tests")] + [
    p for p in sys.path if os.path.abspath(p or ".") != HERE]

from kimi_differential import difference  # noqa: E402
from kimi_random import Gen  # noqa: E402
from official_kimi import OfficialKimi  # noqa: E402
from specgen.render import get_renderer  # noqa: E402
from specgen.tokenizer import load_tokenizer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k25", type=int, default=2000)
    ap.add_argument("--k2-thinking", type=int, default=500)
    ap.add_argument("--k2-instruct", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0, help="first seed (conversation i: seed + i)")
    args = ap.parse_args()
    models = Path(os.environ.get("SPECGEN_MODELS_DIR", ROOT.parent / "shared" / "models"))
    k25, k2i = models / "kimi-k2.5", models / "kimi-k2-instruct"
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / "specgen-k2-instruct.jinja"
    tmp.write_text(json.loads((k2i / "tokenizer_config.json").read_text())["chat_template"])
    tok, tok_i = load_tokenizer(k25), load_tokenizer(k2i)
    k25_official = OfficialKimi(k25 / "chat_template.jinja", k25 / "tiktoken.model",
                                k25 / "tokenizer_config.json", k25 / "tool_declaration_ts.py")
    runs = [
        ("kimi-k2.5", True, args.k25, tok, k25_official),
        ("kimi-k2.5", False, args.k25, tok, k25_official),
        ("kimi-k2-thinking", True, args.k2_thinking, tok,
         OfficialKimi(models / "templates" / "kimi-k2-thinking.chat_template.jinja",
                      k25 / "tiktoken.model", k25 / "tokenizer_config.json")),
        ("kimi-k2-instruct", True, args.k2_instruct, tok_i,
         OfficialKimi(tmp, k2i / "tiktoken.model", k2i / "tokenizer_config.json")),
    ]
    failed = False
    for variant, thinking, n, t, official in runs:
        native = get_renderer(variant, t, thinking=thinking)
        start, misses = time.perf_counter(), []
        for i in range(n):
            g = Gen(args.seed + i)
            if variant == "kimi-k2-instruct":
                msgs = g.conversation(tool_calls=False, names=False, developer=True,
                                      allow_none=False)
            else:
                msgs = g.conversation()
            tools = g.tools()
            diff = difference(native, official, msgs, tools, variant=variant, thinking=thinking)
            if diff:
                misses.append((args.seed + i, diff))
        took = time.perf_counter() - start
        label = f"{variant} (thinking {'on' if thinking else 'off'})"
        print(f"{label}: {n - len(misses)}/{n} exact, {took:.1f}s")
        for seed, diff in misses[:10]:
            print(f"  seed {seed}: {diff}")
        failed |= bool(misses)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
