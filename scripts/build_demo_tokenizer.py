"""Build specgen's built-in demo tokenizer (src/specgen/data/demo-tokenizer).

The demo tokenizer is a small byte-level BPE (4,096 base tokens) trained here on a synthetic
corpus generated from specgen's own lexicon, in the Kimi layout (``tiktoken.model`` +
``tokenizer_config.json``) with Kimi's special-token names at Kimi's offsets. It lets the
quickstart and most tests run with no download. It is NOT any real model's vocabulary.

Run:  python scripts/build_demo_tokenizer.py [--out DIR]   (needs the `regex` package;
      deterministic: rebuilding gives byte-identical files)
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import random
import sys
from pathlib import Path

import regex

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specgen.sim.words import EMOJI, HAN, PUNCT, WORDS  # noqa: E402
from specgen.tokenizer import KIMI_PAT_STR  # noqa: E402

OUT = ROOT / "src" / "specgen" / "data" / "demo-tokenizer"
N_BASE = 4096
KIMI_BASE = 163584

# Kimi K2.5 special tokens by offset from the end of the BPE ranks.
KIMI_SPECIALS = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
    6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>", 14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>",
    17: "<|im_middle|>", 18: "<|media_begin|>", 19: "<|media_content|>", 20: "<|media_end|>",
    21: "<|media_pad|>", 22: "<think>", 23: "</think>", 254: "[UNK]", 255: "[PAD]",
}
NOT_SPECIAL = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
               "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>"}


def corpus(rng: random.Random, n_lines: int = 30000) -> list[str]:
    lines = []
    for _ in range(n_lines):
        kind = rng.random()
        if kind < 0.6:
            words = [rng.choice(WORDS) for _ in range(rng.randint(4, 24))]
            words[0] = words[0].capitalize()
            lines.append(" ".join(words) + rng.choice(PUNCT) + rng.choice([" ", "\n", "\n\n"]))
        elif kind < 0.75:
            obj = {rng.choice(WORDS): rng.choice([rng.choice(WORDS), rng.randint(0, 999),
                                                  rng.random() < 0.5])
                   for _ in range(rng.randint(1, 4))}
            lines.append(json.dumps(obj, separators=rng.choice([(",", ":"), (", ", ": ")])))
        elif kind < 0.85:
            name = "_".join(rng.sample(WORDS, 2))
            lines.append(f"def {name}({rng.choice(WORDS)}):\n    return {rng.randint(0, 99)}\n")
        elif kind < 0.93:
            lines.append("".join(rng.choice(HAN) for _ in range(rng.randint(2, 12))) + "\n")
        else:
            lines.append(f"{rng.randint(0, 99999)} {rng.choice(EMOJI)} {rng.choice(WORDS)}\n")
    return lines


def train(lines: list[str]) -> list[bytes]:
    pat = regex.compile("(?V1)" + KIMI_PAT_STR)
    freq: collections.Counter[bytes] = collections.Counter()
    for line in lines:
        for piece in pat.findall(line):
            freq[piece.encode()] += 1
    words = [[bytes([b]) for b in w] for w in freq]
    counts = list(freq.values())
    vocab = [bytes([b]) for b in range(256)]
    pair_counts: collections.Counter[tuple[bytes, bytes]] = collections.Counter()
    where: dict[tuple[bytes, bytes], set[int]] = collections.defaultdict(set)
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:], strict=False):
            pair_counts[(a, b)] += counts[wi]
            where[(a, b)].add(wi)
    while len(vocab) < N_BASE and pair_counts:
        # Deterministic tie-break: highest count, then smallest bytes.
        best = min(pair_counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if pair_counts[best] < 2:
            break
        merged = best[0] + best[1]
        vocab.append(merged)
        for wi in list(where.pop(best, ())):
            w = words[wi]
            c = counts[wi]
            for a, b in zip(w, w[1:], strict=False):
                pair_counts[(a, b)] -= c
                if pair_counts[(a, b)] <= 0:
                    del pair_counts[(a, b)]
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == best[0] and w[i + 1] == best[1]:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for a, b in zip(out, out[1:], strict=False):
                pair_counts[(a, b)] += c
                where[(a, b)].add(wi)
        pair_counts.pop(best, None)
    return vocab


def main() -> None:
    ap = argparse.ArgumentParser(description="Build specgen's demo tokenizer.")
    ap.add_argument("--out", type=Path, default=OUT, help=f"output directory (default {OUT})")
    out = ap.parse_args().out
    vocab = train(corpus(random.Random(20261202)))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tiktoken.model", "w") as f:
        for rank, tok in enumerate(vocab):
            f.write(f"{base64.b64encode(tok).decode()} {rank}\n")
    n = len(vocab)
    decoder = {
        str(n + off): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                       "single_word": False, "special": name not in NOT_SPECIAL}
        for off, name in sorted(KIMI_SPECIALS.items())
    }
    config = {
        "specgen_demo": "Demo tokenizer built by scripts/build_demo_tokenizer.py; not a real model's vocabulary.",
        "added_tokens_decoder": decoder,
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False, "tokenizer_class": "TikTokenTokenizer",
        "model_max_length": 262144,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {out}: {n} BPE tokens + 256 special ids")


if __name__ == "__main__":
    main()
