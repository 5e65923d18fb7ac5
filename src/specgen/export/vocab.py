"""`specgen export --format vocab`: the drafter's reduced vocabulary (EAGLE-3's d2t / t2d).

Token frequencies are counted over the trained tokens (loss mask 1) of exactly the samples a
`tokens` export with the same options would hold (the same exclusions and filters). The draft
vocabulary is the `draft_vocab_size` most frequent of them, topped up with the lowest unused
ids when fewer were seen, in ascending id order. Ties in count: the lower id first
(`--vocab-ties lowest-id`, speculators' rule), or the id seen first in the export's sample order
(`first-seen`, SpecForge's rule over the order it reads samples in). `--max-length N` counts
only the first N ids of each sample, as a trainer that truncates there does. Then

* `d2t[i]` = target id of draft id i, minus i (an offset, int64, `draft_vocab_size` long);
* `t2d[t]` = whether target id t is in the draft vocabulary (bool, `target_vocab_size` long).

Files, in one directory (default RUN_DIR/exports/vocab/):

* `d2t.npy`, `t2d.npy` and the same as `d2t-N.npy`, `t2d-N.npy` (N: the draft size, the names
  speculators' trainer looks for in its data dir): speculators' layout (`np.load`); written
  without numpy;
* `token_freq.json`: {"token id": count}, every trained token seen;
* with torch installed (`TORCH_INSTALL`: a CPU build is enough): `token_freq.pt` (speculators:
  `torch.save` of {id: count}) and `vocab_mapping.pt` (SpecForge's `load_vocab_mapping`:
  `torch.save` of {"d2t": LongTensor, "t2d": BoolTensor}); without torch the manifest says
  they were not written and why.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..store import ResultRow
from .tokens import exported_ids

DEFAULT_DRAFT_VOCAB = 32000
# torch for the .pt files: its CPU build (no CUDA wheels, a few hundred MB) is all they need
TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


class VocabError(ValueError):
    """The vocabulary cannot be built as asked (sizes)."""


TIE_RULES = ("lowest-id", "first-seen")


def count_trained(rows: Iterable[ResultRow], counts: Counter[int], *,
                  max_length: int | None = None,
                  first_seen: dict[int, int] | None = None) -> Iterable[ResultRow]:
    """Pass rows through, counting the ids of their trained part (the completion).

    `max_length`: only the first N ids of each sample count (a trainer that truncates there
    never sees the rest). `first_seen` records each id's first appearance: samples in export
    order, ascending ids within a sample (SpecForge adds each sample's `unique()` ids to its
    Counter in that order)."""
    for r in rows:
        ids, n_prompt = exported_ids(r)
        trained = ids[n_prompt:max_length] if max_length is not None else ids[n_prompt:]
        counts.update(trained)
        if first_seen is not None:
            for t in sorted(set(trained)):
                first_seen.setdefault(t, len(first_seen))
        yield r


def draft_vocab(counts: Counter[int], draft_size: int, target_size: int,
                first_seen: dict[int, int] | None = None) -> list[int]:
    """The draft vocabulary: target ids, ascending (see the module doc). Ties in count go to
    the lower id, or with `first_seen` to the id seen first."""
    if draft_size < 1:
        raise VocabError(f"--draft-vocab-size must be at least 1 (got {draft_size})")
    if draft_size > target_size:
        raise VocabError(f"--draft-vocab-size {draft_size:,} is larger than the target's "
                         f"vocabulary ({target_size:,} ids): give at most {target_size:,}, or "
                         "leave --draft-vocab-size out (default: 32,000, or the whole target "
                         "vocabulary when smaller)")
    seen_max = max(counts, default=-1)
    if seen_max >= target_size:
        raise VocabError(f"the samples hold token id {seen_max:,}, outside the target's "
                         f"vocabulary of {target_size:,} ids: give --target-vocab-size")
    if first_seen is None:
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    else:
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], first_seen[kv[0]]))
    chosen = [t for t, _ in ranked[:draft_size]]
    if len(chosen) < draft_size:
        have = set(chosen)
        for t in range(target_size):
            if len(chosen) >= draft_size:
                break
            if t not in have:
                chosen.append(t)
    return sorted(chosen)


def d2t_t2d(chosen: list[int], target_size: int) -> tuple[list[int], bytearray]:
    d2t = [t - i for i, t in enumerate(chosen)]
    t2d = bytearray(target_size)
    for t in chosen:
        t2d[t] = 1
    return d2t, t2d


def npy_bytes(descr: str, data: bytes, n: int) -> bytes:
    """A 1-D .npy file (format 1.0) of `n` items of `descr` whose raw bytes are `data`."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({n},), }}"
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * (pad % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + data


def int64_le(values: list[int]) -> bytes:
    a = array("q", values)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def write_vocab_files(stage, out: Path, counts: Counter[int], draft_size: int,
                      target_size: int, *, first_seen: dict[int, int] | None = None,
                      max_length: int | None = None) -> dict[str, Any]:
    """Write the files into `stage` (export.core.Staging of the directory `out`); returns the
    manifest's `vocab` entry."""
    import orjson

    chosen = draft_vocab(counts, draft_size, target_size, first_seen)
    d2t, t2d = d2t_t2d(chosen, target_size)
    files: list[str] = []

    def put(name: str, data: bytes) -> None:
        with open(stage.temp_for(out / name), "wb") as f:
            f.write(data)
        files.append(name)

    d2t_npy = npy_bytes("<i8", int64_le(d2t), len(d2t))
    t2d_npy = npy_bytes("|b1", bytes(t2d), len(t2d))
    put("d2t.npy", d2t_npy)
    put("t2d.npy", t2d_npy)
    # the names speculators' trainer (0.9) looks for in its data dir for --draft-vocab-size N
    put(f"d2t-{draft_size}.npy", d2t_npy)
    put(f"t2d-{draft_size}.npy", t2d_npy)
    put("token_freq.json", orjson.dumps({str(k): v for k, v in sorted(counts.items())}))
    torch_note = None
    try:
        import torch
    except ImportError:
        torch_note = ("torch is not installed: token_freq.pt (speculators) and "
                      "vocab_mapping.pt (SpecForge) were not written; install torch (a CPU "
                      f"build is enough: {TORCH_INSTALL}) and export again")
    else:
        tmp = stage.temp_for(out / "token_freq.pt")
        torch.save({int(k): int(v) for k, v in sorted(counts.items())}, tmp)
        files.append("token_freq.pt")
        tmp = stage.temp_for(out / "vocab_mapping.pt")
        torch.save({"d2t": torch.tensor(d2t, dtype=torch.long),
                    "t2d": torch.tensor(list(t2d), dtype=torch.bool)}, tmp)
        files.append("vocab_mapping.pt")
    total = sum(counts.values())
    covered = sum(counts.get(t, 0) for t in chosen)
    return {
        "draft_vocab_size": draft_size,
        "target_vocab_size": target_size,
        "distinct_trained_tokens": len(counts),
        "trained_tokens": total,
        "coverage": round(covered / total, 6) if total else None,
        "files": files,
        "ties": "first-seen" if first_seen is not None else "lowest-id",
        "max_length": max_length,
        "torch": torch_note or "token_freq.pt and vocab_mapping.pt written with torch",
        "layout": {
            "d2t": "int64 offsets: target id = draft id + d2t[draft id]",
            "t2d": "bool per target id: in the draft vocabulary",
            "speculators": "d2t.npy, t2d.npy (also as d2t-N.npy, t2d-N.npy: its trainer's "
                           "data-dir names), token_freq.pt",
            "specforge": "vocab_mapping.pt ({'d2t', 't2d'}; draft model load_vocab_mapping)",
        },
    }
