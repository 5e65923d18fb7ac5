"""Repetition loops in a sampled answer: a block of tokens said again and again.

A loop is measured on token ids: the longest stretch of the answer in which every token equals
the token `period` places before it, for some period of at most `max_period` tokens. Its size
is the number of tokens in that stretch (what merely repeats the first occurrence of the
block), so "the cat sat. the cat sat. the cat sat." (block of 4 tokens said 3 times) repeats
8 tokens. Ordinary text has stretches of a few tokens at most; a degenerate answer that loops
repeats hundreds.

Fast on the common case: a stretch of R repeated tokens makes at least R - 3 positions whose
4-gram already occurred, so an answer with fewer repeated 4-grams than that cannot hold a loop
of R tokens and is passed after one set build (no false negatives).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

MAX_PERIOD = 64  # the longest repeated block looked for, in tokens
MIN_TOKENS = 64  # a loop worth flagging repeats at least this many tokens (default threshold)


class Loop(NamedTuple):
    tokens: int  # tokens in the repeating stretch beyond the block's first occurrence
    period: int  # the block's length in tokens
    start: int  # where the stretch starts (index into the ids given; first occurrence)


NO_LOOP = Loop(0, 0, 0)


def repeated_4grams(ids: Sequence[int]) -> int:
    """Positions whose 4-gram occurred earlier in `ids`."""
    n = len(ids) - 3
    if n <= 1:
        return 0
    return n - len(set(zip(ids, ids[1:], ids[2:], ids[3:], strict=False)))


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
              max_period: int = MAX_PERIOD) -> Loop | None:
    """The longest loop of `ids` when it repeats at least `min_tokens` tokens, else None."""
    if len(ids) <= min_tokens or repeated_4grams(ids) < min_tokens - 3:
        return None
    loop = longest_loop(ids, max_period)
    return loop if loop.tokens >= min_tokens else None
