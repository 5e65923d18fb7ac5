"""A random generator that is cheap to create: its first draws come from one hash.

Seeding Python's Mersenne Twister costs ~9 us (and a `random.Random` carries 2.5 KB of
state), more than most simulated requests spend on drawing. `HashRandom(key)` serves its first
8 draws from a 64-byte BLAKE2b digest of the key and only seeds a Twister (from the same key)
when a request draws more. It has the methods of `random.Random` the simulator uses (they are
`random.Random`'s own, built on `random()` and `getrandbits()`); the sequence is a pure
function of the key.
"""

from __future__ import annotations

import hashlib
import random
import struct

_POOL = 8
_TO_FLOAT = 1.0 / (1 << 53)
_R = random.Random


class HashRandom:
    """Deterministic draws from `key` (bytes): hash first, Mersenne Twister after."""

    __slots__ = ("_key", "_pool", "_next", "_twister", "gauss_next")

    def __init__(self, key: bytes):
        self._key = key
        self._pool = struct.unpack("<8Q", hashlib.blake2b(key, digest_size=64).digest())
        self._next = 0
        self._twister: random.Random | None = None
        self.gauss_next = None

    def _draw64(self) -> int:
        i = self._next
        if i < _POOL:
            self._next = i + 1
            return self._pool[i]
        if self._twister is None:
            self._twister = random.Random(
                int.from_bytes(self._key, "little") ^ (1 << (8 * len(self._key))))
            self.gauss_next = None  # as seeding a random.Random does (same draws as before)
        return self._twister.getrandbits(64)

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

    # random.Random's own pure-Python methods, on top of random() and getrandbits().
    _randbelow = _R._randbelow_with_getrandbits
    randrange = _R.randrange
    randint = _R.randint
    choice = _R.choice
    choices = _R.choices
    shuffle = _R.shuffle
    sample = _R.sample
    uniform = _R.uniform
    gauss = _R.gauss
