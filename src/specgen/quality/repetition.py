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
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import ConfigError

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


ACTIONS = ("flag", "quarantine")


@dataclass(frozen=True, slots=True)
class RepetitionRule:
    """`[quality] repetition`: an answer whose loop repeats `tokens`+ tokens of a block of at
    most `period` is flagged (kept, counted by the `repetition` alarm, an event per dataset and
    provider) or quarantined as `repetition` (and retried like any quarantine)."""

    tokens: int = MIN_TOKENS
    period: int = MAX_PERIOD
    action: str = "flag"


def repetition_rule(spec: Any, where: str = "config") -> RepetitionRule | None:
    """The rule of `[quality] repetition`: false (off), true or {} (defaults), a number of
    tokens, or a table {tokens, period, action}. Raises ConfigError naming the key."""
    key = "quality.repetition"
    if spec is False:
        return None
    if spec is True or spec is None:
        spec = {}
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = {"tokens": spec}
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: {key} must be false, a number of tokens or a table "
                          f"{{tokens, period, action}}, got {spec!r}")
    unknown = sorted(set(spec) - {"tokens", "period", "action"})
    if unknown:
        raise ConfigError(f"{where}: {key} has unknown key(s) {', '.join(unknown)} "
                          "(known: tokens, period, action)")
    rule = RepetitionRule(**spec)
    for name in ("tokens", "period"):
        value = getattr(rule, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: {key}.{name} must be an integer >= 1, got {value!r}")
    if rule.action not in ACTIONS:
        raise ConfigError(f"{where}: {key}.action must be one of {', '.join(ACTIONS)}, got "
                          f"{rule.action!r}")
    return rule
