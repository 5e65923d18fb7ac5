"""Deterministic, disjoint shards of every dataset, by conversation id (`--shard i/N`).

N machines running one config with `--shard 0/N` … `--shard N-1/N` each take a disjoint share;
together they take every conversation exactly once. The hash depends only on the stable id, so
it is the same on every machine, Python version and run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


class ShardError(ValueError):
    """A --shard value that is not `i/N` with 0 <= i < N."""


@dataclass(frozen=True, slots=True)
class Shard:
    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, conv_id: str) -> bool:
        """Whether the conversation with this stable id belongs to this shard."""
        return self.count == 1 or shard_of(conv_id, self.count) == self.index


def shard_of(conv_id: str, count: int) -> int:
    """The shard (0..count-1) of a stable conversation id: sha256(id) mod count."""
    digest = hashlib.sha256(conv_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count


def parse_shard(spec: str | None) -> Shard | None:
    """`"i/N"` -> Shard; None or "" -> None (no sharding)."""
    if not spec:
        return None
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ShardError(f"--shard {spec!r}: expected i/N, e.g. 0/4") from None
    if n < 1 or not 0 <= i < n:
        raise ShardError(f"--shard {spec!r}: need N >= 1 and 0 <= i < N")
    return Shard(i, n)
