"""Benchmark `specgen tokenize` end to end against the raw tokenizer (the ceiling).

    .venv/bin/python bench/tokenize.py [--tokenizer DIR|demo] [--renderer kimi-k2.5]
                                       [--conversations 400] [--runs 5]

A generated corpus of realistic conversations (lengths log-uniform up to ~32k tokens; tools,
tool loops, reasoning, prose, code, JSON, CJK, emoji) is written as JSONL. Each run is a real
`specgen tokenize IN -o OUT` process (file in, file out; `specgen.cli.main`, the console
script's entry point); its wall time and its own peak RSS (VmHWM) are measured. The ceiling is the same tokenizer encoding each sample's full
rendered text in one `encode` call, with nothing else (texts rendered beforehand). Prints
medians of --runs runs for two corpus sizes (N and 3N conversations) to show memory is flat.

`--rule-cost` instead measures what the Kimi long-run rule costs (docs/tokenizers.md): the
in-process tokenize loop over the corpus with the rule on, and with it switched off (every
encode one piece, completions encoded alone), interleaved, CPU seconds, medians of --runs.
"""

from __future__ import annotations

import os
import sys

# This file is named like the stdlib `tokenize` module: keep its folder off the import path.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specgen.render import get_renderer  # noqa: E402
from specgen.sim.words import EMOJI, HAN, PUNCT, WORDS  # noqa: E402
from specgen.tokenizer import load_tokenizer  # noqa: E402

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.\n\nUse metric units.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name", "maxLength": 80},
            "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
            "days": {"type": "integer", "minimum": 1, "maximum": 16, "default": 1}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "array", "items": {"type": "object", "properties": {
                "field": {"type": "string"}, "value": {"anyOf": [{"type": "string"}, {"type": "number"}]}},
                "required": ["field", "value"]}}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "run_code", "description": "Run Python code in a sandbox.",
        "parameters": {"type": "object", "properties": {
            "code": {"type": "string"}, "timeout": {"type": "number", "default": 10.0}},
            "required": ["code"]}}},
]


def prose(rng: random.Random, n_chars: int) -> str:
    out, size = [], 0
    while size < n_chars:
        kind = rng.random()
        if kind < 0.75:
            words = [rng.choice(WORDS) for _ in range(rng.randint(6, 30))]
            s = " ".join(words).capitalize() + rng.choice(PUNCT) + rng.choice([" ", " ", "\n", "\n\n"])
        elif kind < 0.85:
            name = "_".join(rng.sample(WORDS, 2)).replace("'", "")
            s = (f"```python\ndef {name}(x, y={rng.randint(0, 9)}):\n    return x * {rng.randint(2, 99)} + y\n"
                 "```\n")
        elif kind < 0.93:
            s = json.dumps({rng.choice(WORDS): rng.randint(0, 10**6) for _ in range(rng.randint(2, 6))}) + "\n"
        else:
            s = "".join(rng.choice(HAN) for _ in range(rng.randint(5, 40))) + rng.choice(EMOJI) + "\n"
        out.append(s)
        size += len(s)
    return "".join(out)


def conversation(rng: random.Random, k: int) -> dict:
    target = int(math.exp(rng.uniform(math.log(64), math.log(32768))))  # tokens, roughly
    chars = target * 4
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": prose(rng, 200)})
    msgs.append({"role": "user", "content": prose(rng, max(40, chars // 4))})
    tools = TOOLS if rng.random() < 0.5 else None
    n = 0
    if tools:
        for _ in range(rng.randint(1, 3)):
            calls = []
            for _ in range(rng.randint(1, 2)):
                name = rng.choice(["get_weather", "search", "run_code"])
                calls.append({"id": f"functions.{name}:{n}", "type": "function", "function": {
                    "name": name, "arguments": json.dumps({"city": rng.choice(WORDS), "days": rng.randint(1, 9)})}})
                n += 1
            msgs.append({"role": "assistant", "content": "", "reasoning_content": prose(rng, chars // 16),
                         "tool_calls": calls})
            for c in calls:
                msgs.append({"role": "tool", "tool_call_id": c["id"], "content": prose(rng, chars // 12)})
    final = {"role": "assistant", "content": prose(rng, chars // 3)}
    if rng.random() < 0.7:
        final["reasoning_content"] = prose(rng, chars // 4)
    msgs.append(final)
    row = {"id": f"conv-{k}", "messages": msgs}
    if tools:
        row["tools"] = tools
    return row


def write_corpus(path: Path, n: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for k in range(n):
            f.write(json.dumps(conversation(rng, k), ensure_ascii=False) + "\n")


# Runs the real entry point (`specgen.cli.main`, what the console script calls), then reports
# the process's own peak RSS. VmHWM belongs to the memory map made at exec; ru_maxrss from wait4
# would also count the parent's pages the child shared before exec.
CHILD = """
import sys
from specgen.cli import main
code = main(sys.argv[1:])
hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]
print(f'VmHWM_KB={hwm}', file=sys.stderr)
sys.exit(code)
"""


def run_cli(args: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one `specgen tokenize` process."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, "tokenize", *args],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    wall = time.perf_counter() - start
    err = proc.stderr.decode()
    if proc.returncode != 0:
        raise SystemExit(f"specgen tokenize failed: {err}")
    hwm_kb = int(err.rsplit("VmHWM_KB=", 1)[1].split()[0])
    return wall, hwm_kb * 1024


def raw_seconds(tok, texts: list[str]) -> float:
    start = time.perf_counter()
    for t in texts:
        tok.encode(t)
    return time.perf_counter() - start


def rule_cost(args, tok, corpus: Path) -> None:
    """CPU seconds of the in-process tokenize loop with the long-run rule on and off."""
    from specgen.commands.tokenize import tokenize_lines
    from specgen.tokenizer import TiktokenTokenizer

    lines = corpus.read_bytes().splitlines()
    renderer = get_renderer(args.renderer, tok)

    def loop() -> float:
        start = time.process_time()
        tokenize_lines(renderer, lines, lambda b: None)
        return time.process_time() - start

    def rule_off():
        saved = (TiktokenTokenizer.encode, TiktokenTokenizer.prefix_sensitive)
        TiktokenTokenizer.encode = TiktokenTokenizer._encode_piece
        TiktokenTokenizer.prefix_sensitive = False
        return saved

    on, off = [], []
    loop()  # warm the caches of both variants alike
    for _ in range(args.runs):
        on.append(loop())
        saved = rule_off()
        try:
            off.append(loop())
        finally:
            TiktokenTokenizer.encode, TiktokenTokenizer.prefix_sensitive = saved
    a, b = statistics.median(on), statistics.median(off)
    print(f"long-run rule on:  median {a:.3f} s CPU, min {min(on):.3f} "
          f"(runs: {', '.join(f'{x:.3f}' for x in on)})")
    print(f"long-run rule off: median {b:.3f} s CPU, min {min(off):.3f} "
          f"(runs: {', '.join(f'{x:.3f}' for x in off)})")
    print(f"cost of the rule:  {100 * (a - b) / b:+.1f}% (medians), "
          f"{100 * (min(on) - min(off)) / min(off):+.1f}% (minima: on a busy machine)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", default=str(ROOT.parent / "shared" / "models" / "kimi-k2.5"))
    ap.add_argument("--renderer", default="kimi-k2.5")
    ap.add_argument("--conversations", type=int, default=400)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rule-cost", action="store_true",
                    help="measure the long-run rule's cost in process (on vs off)")
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer)
    renderer = get_renderer(args.renderer, tok)
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
          f"{platform.python_implementation()} {platform.python_version()}, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"tokenizer {tok.name} ({tok.vocab_size} ids), renderer {args.renderer}, runs {args.runs}")
    with tempfile.TemporaryDirectory() as tmp:
        tmpd = Path(tmp)
        if args.rule_cost:
            corpus = tmpd / "corpus.jsonl"
            write_corpus(corpus, args.conversations)
            print(f"corpus: {args.conversations} conversations, {corpus.stat().st_size / 1e6:.1f} MB")
            rule_cost(args, tok, corpus)
            return
        empty = tmpd / "empty.jsonl"
        empty.write_text("")
        startup = statistics.median(
            run_cli(["--tokenizer", args.tokenizer, "--renderer", args.renderer, str(empty),
                     "-o", str(tmpd / "o.jsonl")])[0] for _ in range(args.runs))
        print(f"startup (python + imports + tokenizer load, empty input): {startup:.2f}s")
        for n in (args.conversations, 3 * args.conversations):
            corpus = tmpd / f"corpus{n}.jsonl"
            write_corpus(corpus, n)
            rows = [json.loads(line) for line in corpus.read_text().splitlines()]
            texts = []
            for r in rows:
                m = r["messages"]
                texts.append(renderer.render_text(m[:-1], r.get("tools"), add_generation_prompt=True)
                             + renderer.completion_text(m[-1]))
            n_tokens = sum(len(tok.encode(t)) for t in texts)
            lengths = sorted(len(tok.encode(t)) for t in texts[:200])
            del rows
            raws, walls, rss = [], [], []
            for _ in range(args.runs):
                raws.append(raw_seconds(tok, texts))
                wall, peak = run_cli(["--tokenizer", args.tokenizer, "--renderer", args.renderer,
                                      str(corpus), "-o", str(tmpd / "out.jsonl")])
                walls.append(wall)
                rss.append(peak)
            raw, wall = statistics.median(raws), statistics.median(walls)
            raw_tps = n_tokens / raw
            e2e_tps = n_tokens / wall
            steady_tps = n_tokens / max(wall - startup, 1e-9)
            print(f"\ncorpus: {n} conversations, {n_tokens} tokens, {corpus.stat().st_size / 1e6:.1f} MB "
                  f"(sample lengths: median {lengths[len(lengths) // 2]}, max {lengths[-1]})")
            print(f"  raw encode (ceiling):   {raw:7.2f}s  {raw_tps:10.0f} tok/s  {n / raw:8.1f} samples/s")
            print(f"  specgen tokenize e2e:   {wall:7.2f}s  {e2e_tps:10.0f} tok/s  {n / wall:8.1f} samples/s"
                  f"  = {100 * e2e_tps / raw_tps:.0f}% of raw")
            print(f"  e2e minus startup:      {wall - startup:7.2f}s  {steady_tps:10.0f} tok/s"
                  f"  = {100 * steady_tps / raw_tps:.0f}% of raw")
            print(f"  peak RSS of the process: {statistics.median(rss) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
