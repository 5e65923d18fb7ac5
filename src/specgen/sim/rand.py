"""A `random.Random` that is cheap to create: its first draws come from one hash.

Seeding Python's Mersenne Twister costs ~9 us, more than most simulated requests spend on
drawing. `HashRandom(key)` serves its first 8 draws from a 64-byte BLAKE2b digest of the key
and only seeds the Twister (from the same key) when a request draws more. Every method of
`random.Random` works (they are built on `random()` and `getrandbits()`); the sequence is a
pure function of the key.
"""

from __future__ import annotations

import hashlib
import random
import struct

_POOL = 8
_TO_FLOAT = 1.0 / (1 << 53)


class HashRandom(random.Random):
    """Deterministic draws from `key` (bytes): hash first, Mersenne Twister after."""

    def __init__(self, key: bytes):  # noqa: D107 - random.Random.__init__ is not called
        self._key = key
        self._pool = struct.unpack("<8Q", hashlib.blake2b(key, digest_size=64).digest())
        self._next = 0
        self._twister = False
        self.gauss_next = None

    def seed(self, a=None, version=2) -> None:  # type: ignore[override]
        raise TypeError("HashRandom is seeded by its key")

    def _draw64(self) -> int:
        i = self._next
        if i < _POOL:
            self._next = i + 1
            return self._pool[i]
        if not self._twister:
            super().seed(int.from_bytes(self._key, "little") ^ (1 << (8 * len(self._key))))
            self._twister = True
        return super().getrandbits(64)

    def random(self) -> float:
        i = self._next
        if i < _POOL:  # inline of _draw64's first branch: most requests draw only from the pool
            self._next = i + 1
            return (self._pool[i] >> 11) * _TO_FLOAT
        return (self._draw64() >> 11) * _TO_FLOAT

    def getrandbits(self, k: int) -> int:
        if k <= 64:
            return self._draw64() >> (64 - k) if k else 0
        out, n = 0, 0
        while n < k:
            out = (out << 64) | self._draw64()
            n += 64
        return out >> (n - k)
