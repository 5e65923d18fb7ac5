"""The export's sample filters: `--min-trainable-tokens N`, `--max-repetition N`, `--dedup`,
`--drop-truncated`. Each left-out sample is counted per dataset under its reason and named in
the manifest (`excluded.filtered`), first reason first: truncated, short, repetition,
duplicate. They measure what `specgen stats` measures, on the exported ids."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from ..quality.repetition import find_loop
from ..store import ResultRow, pack_ids
from .conversations import sample_id
from .tokens import exported_ids

REASONS = ("truncated", "short", "repetition", "duplicate")
LISTED = 1000  # sample ids named per reason in the manifest (all are counted)


class SampleFilter:
    """Decides, sample by sample, what an export leaves out; keeps the tally."""

    def __init__(self, *, min_trainable_tokens: int | None = None,
                 max_repetition: int | None = None, dedup: bool = False,
                 drop_truncated: bool = False):
        self.min_trainable = min_trainable_tokens
        self.max_repetition = max_repetition
        self.dedup = dedup
        self.drop_truncated = drop_truncated
        self.seen: set[tuple[str, bytes]] = set()
        self.left_out: dict[str, list[str]] = {r: [] for r in REASONS}
        self.counts: dict[str, dict[str, int]] = {}  # dataset -> reason -> samples

    @property
    def active(self) -> bool:
        return (self.min_trainable is not None or self.max_repetition is not None
                or self.dedup or self.drop_truncated)

    def reason(self, r: ResultRow) -> str | None:
        """Why `r` is left out (one of REASONS), or None to keep it."""
        if self.drop_truncated and r.finish_reason == "length":
            return "truncated"
        ids, n_prompt = exported_ids(r)
        span = ids[n_prompt:]
        if self.min_trainable is not None and len(span) < self.min_trainable:
            return "short"
        if self.max_repetition is not None and find_loop(span, self.max_repetition + 1):
            return "repetition"
        if self.dedup:
            key = (r.dataset, hashlib.blake2b(pack_ids(span), digest_size=16).digest())
            if key in self.seen:
                return "duplicate"
            self.seen.add(key)
        return None

    def apply(self, rows: Iterable[ResultRow]) -> Iterator[ResultRow]:
        for r in rows:
            why = self.reason(r)
            if why is None:
                yield r
                continue
            per = self.counts.setdefault(r.dataset, dict.fromkeys(REASONS, 0))
            per[why] += 1
            if len(self.left_out[why]) < LISTED:
                self.left_out[why].append(sample_id(r.dataset, r.conv_id, r.turn))

    def manifest(self) -> dict[str, Any]:
        total = {why: sum(c[why] for c in self.counts.values()) for why in REASONS}
        return {
            "options": {"min_trainable_tokens": self.min_trainable,
                        "max_repetition": self.max_repetition, "dedup": self.dedup,
                        "drop_truncated": self.drop_truncated},
            "samples": sum(total.values()),
            "by_reason": total,
            "per_dataset": self.counts,
            "sample_ids": {why: ids for why, ids in self.left_out.items() if ids},
            "why": {
                "truncated": "cut at max_tokens (finish_reason = length): --drop-truncated",
                "short": "fewer trainable tokens than --min-trainable-tokens",
                "repetition": "a repetition loop repeating more tokens than --max-repetition",
                "duplicate": "the same trainable span as an earlier sample of its dataset: "
                             "--dedup",
            },
        }
