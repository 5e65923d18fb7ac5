"""Repetition loops in a sampled answer: a block of tokens said again and again.

A loop is measured on token ids: the longest stretch of the answer in which every token equals
the token `period` places before it, for some period of at most `max_period` tokens. Its size
is the number of tokens in that stretch (what merely repeats the first occurrence of the
block), so "the cat sat. the cat sat. the cat sat." (block of 4 tokens said 3 times) repeats
8 tokens. Ordinary text has stretches of a few tokens at most; a degenerate answer that loops
repeats hundreds.

Fast on the common case, and exact: a stretch of R >= 2C - 1 repeated tokens (C = min_tokens
// 2) holds a whole C-token chunk aligned on a multiple of C, and that chunk also occurs at most
`max_period` tokens before itself. `may_loop` looks for each aligned chunk in the bytes just
before it (one C-level `bytes.find` per chunk); only an answer where one is found is measured
token by token.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import NamedTuple

MAX_PERIOD = 64  # the longest repeated block looked for, in tokens
MIN_TOKENS = 64  # a loop worth flagging repeats at least this many tokens (default threshold)


class Loop(NamedTuple):
    tokens: int  # tokens in the repeating stretch beyond the block's first occurrence
    period: int  # the block's length in tokens
    start: int  # where the stretch starts (index into the ids given; first occurrence)


NO_LOOP = Loop(0, 0, 0)


def may_loop(blob: bytes, min_tokens: int = MIN_TOKENS, max_period: int = MAX_PERIOD) -> bool:
    """False when the ids packed in `blob` (4 bytes each) cannot hold a loop of `min_tokens`
    repeated tokens of a block of at most `max_period` (see the module doc)."""
    c = min_tokens // 2
    if c < 2:
        return True
    cb, back = 4 * c, 4 * max_period
    for off in range(cb, len(blob) - cb + 1, cb):
        if blob.find(blob[off:off + cb], max(0, off - back), off + cb - 1) != -1:
            return True
    return False


def longest_loop(ids: Sequence[int], max_period: int = MAX_PERIOD) -> Loop:
    """The longest repeating stretch of `ids` (exact; see the module doc)."""
    n = len(ids)
    best = NO_LOOP
    for p in range(1, min(max_period, n - 1) + 1):
        run = 0
        for i in range(p, n):
            if ids[i] == ids[i - p]:
                run += 1
                if run > best.tokens:
                    best = Loop(run, p, i - run + 1 - p)
            else:
                run = 0
    return best


def find_loop(ids: Sequence[int], min_tokens: int = MIN_TOKENS,
              max_period: int = MAX_PERIOD, blob: bytes | None = None) -> Loop | None:
    """The longest loop of `ids` when it repeats at least `min_tokens` tokens, else None.
    `blob`: the same ids packed 4 bytes each, when the caller has them."""
    if len(ids) <= min_tokens:
        return None
    if not may_loop(array("I", ids).tobytes() if blob is None else blob, min_tokens, max_period):
        return None
    loop = longest_loop(ids, max_period)
    return loop if loop.tokens >= min_tokens else None
