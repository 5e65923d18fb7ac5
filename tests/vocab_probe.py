"""Run in the trainers' side venv by tests/test_export_vocab.py: speculators' and SpecForge's own
loaders on a `specgen export --format vocab` directory; writes what they found as JSON.

    python tests/vocab_probe.py VOCAB_DIR RESULT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def probe(vocab_dir: str, out_path: str) -> None:
    """In the trainers' venv: their loaders on our files."""
    import argparse

    import numpy as np
    import torch
    from speculators.train.cli import parse_vocab_mappings
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    d = Path(vocab_dir)
    manifest = json.loads((d / "manifest.json").read_text())
    size = manifest["vocab"]["draft_vocab_size"]
    freq = {int(k): v for k, v in json.loads((d / "token_freq.json").read_text()).items()}
    d2t, t2d = build_vocab_mappings_from_distribution(
        freq, size, manifest["vocab"]["target_vocab_size"])
    result = {"d2t_equal": np.load(d / "d2t.npy").tolist() == d2t.tolist(),
              "t2d_equal": np.load(d / "t2d.npy").tolist() == t2d.tolist(),
              "d2t_dtype": str(np.load(d / "d2t.npy").dtype),
              "t2d_dtype": str(np.load(d / "t2d.npy").dtype)}
    # the trainer's own loading: our directory as its --data-path, --draft-vocab-size N
    args = argparse.Namespace(d2t_path=None, t2d_path=None, data_path=str(d),
                              draft_vocab_size=size, token_freq_path=None)
    got_d2t, got_t2d, got_size = parse_vocab_mappings(args)[:3]
    result["trainer_equal"] = (got_size == size and got_d2t.tolist() == d2t.tolist()
                               and got_t2d.tolist() == t2d.tolist())
    if (d / "token_freq.pt").exists():
        result["token_freq_pt_equal"] = torch.load(d / "token_freq.pt", weights_only=True) == freq
    if (d / "vocab_mapping.pt").exists():
        from specforge.modeling.draft.base import Eagle3DraftModel

        holder = torch.nn.Module()
        holder.register_buffer("d2t", torch.zeros(len(d2t), dtype=torch.long))
        holder.register_buffer("t2d", torch.zeros(len(t2d), dtype=torch.bool))
        Eagle3DraftModel.load_vocab_mapping(holder, str(d / "vocab_mapping.pt"))
        result["specforge_equal"] = (holder.d2t.tolist() == d2t.tolist()
                                     and holder.t2d.tolist() == t2d.tolist())
    Path(out_path).write_text(json.dumps(result))


def specforge_ties(tokens_jsonl: str, size: int, target: int, max_length: int,
                   out_path: str) -> None:
    """In the trainers' venv: SpecForge's own mapping code on our tokens export, counted the
    way its `generate_vocab_mapping_file` counts (each sample cut to max_length, its
    loss-masked ids `unique()`d into a Counter, samples in file order)."""
    from collections import Counter

    import torch
    from specforge.data.preprocessing import process_token_dict_to_mappings

    counter: Counter = Counter()
    for line in Path(tokens_jsonl).read_text().splitlines():
        row = json.loads(line)
        ids = torch.tensor(row["input_ids"][:max_length])
        mask = torch.tensor(row["loss_mask"][:max_length])
        unique, counts = ids[mask == 1].unique(return_counts=True)
        counter.update(dict(zip(unique.tolist(), counts.tolist(), strict=True)))
    d2t, t2d = process_token_dict_to_mappings(counter, size, target)
    Path(out_path).write_text(json.dumps({"d2t": d2t.tolist(), "t2d": t2d.tolist()}))


if __name__ == "__main__":
    if sys.argv[1] == "specforge-ties":
        specforge_ties(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
                       sys.argv[6])
    else:
        probe(sys.argv[1], sys.argv[2])
