"""Prose-like text with its token ids, produced fast enough for thousands of requests a second.

A bank of sentences is encoded once when the simulator starts. A text is a run of sentences
drawn from it; its ids are the concatenation of the precomputed pieces. Pieces are cut where the
tokenizer's pre-tokenizer always splits (a sentence's first word, a core that starts with a
space and ends with a lower-case word, an end mark), so the concatenation is the text's
canonical encoding. `TextBank.check` verifies that on random texts; when it fails (an unusual
tokenizer), `exact` is False and callers encode the text themselves.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Callable

from .words import EMOJI, HAN, WORDS

END_MARKS = (".", ".", ".", ".", "?", "!")
PARAGRAPH_MARKS = (".\n\n", ".\n\n", "?\n\n", ":\n\n")
PASSAGES = 32  # pre-made passages ...
PASSAGE_TOKENS = 4096  # ... of about this many tokens
FAST_MAX = 1536  # texts up to this long are sliced from a passage
NUMBERS = ("2", "3", "7", "12", "42", "64", "100", "256", "1024", "2025", "3.5", "0.75")


class TextBank:
    """Sentences with precomputed ids. `text(rng, n)` -> (text, ids) of about n tokens."""

    def __init__(self, encode: Callable[[str], list[int]], *, seed: int = 0, size: int = 1024):
        self._encode = encode
        rng = random.Random(f"specgen-sim-text-{seed}")
        weights = [1.0 / (rank + 8) for rank in range(len(WORDS))]  # Zipf-like: common first
        words = rng.choices(WORDS, weights=weights, k=size * 14)
        # Four ready forms of every sentence, indexed by (opens a paragraph, ends one):
        # "Word core." / " Word core." / "Word core.\n\n" / " Word core.\n\n".
        self.forms: list[list[tuple[str, list[int]]]] = [[] for _ in range(4)]
        pos = 0
        for _ in range(size):
            n = rng.randint(4, 13)
            ws = words[pos:pos + n]
            pos += n
            head = ws[0][:1].upper() + ws[0][1:]
            heads = ((head, encode(head)), (" " + head, encode(" " + head)))
            core, core_ids = self._core(rng, ws[1:])
            end = rng.choice(END_MARKS)
            pend = rng.choice(PARAGRAPH_MARKS)
            ends = ((end, encode(end)), (pend, encode(pend)))
            for form in range(4):
                h, h_ids = heads[0 if form & 1 == 0 else 1]
                e, e_ids = ends[form >> 1]
                self.forms[form].append((h + core + e, h_ids + core_ids + e_ids))
        self.size = size
        # Long pre-made texts: a request's text is a slice from a paragraph start to the first
        # sentence end past the wanted length (two C-speed slices instead of a loop).
        # Ids are kept as lists of shared int objects: slicing a list is a pointer copy,
        # while turning an array slice into a list would allocate every int again.
        self.passages: list[tuple[str, list[int], list[int], list[int], list[int], list[int]]] = []
        interned: dict[int, int] = {}
        for _ in range(PASSAGES):
            text, ids, *marks = self._passage(rng)
            self.passages.append((text, [interned.setdefault(i, i) for i in ids], *marks))
        self.exact = self.check(random.Random(seed ^ 0x5EED), 64)

    def _passage(self, rng: random.Random):
        text, ids = self._sentences(rng, PASSAGE_TOKENS, marks := [])
        starts_tok = [t for t, _, opens in marks if opens and t < PASSAGE_TOKENS - FAST_MAX]
        starts_chr = [c for t, c, opens in marks if opens and t < PASSAGE_TOKENS - FAST_MAX]
        ends_tok = [t for t, _, _ in marks[1:]] + [len(ids)]
        ends_chr = [c for _, c, _ in marks[1:]] + [len(text)]
        return text, ids, starts_tok, starts_chr, ends_tok, ends_chr

    def _core(self, rng: random.Random, ws: list[str]) -> tuple[str, list[int]]:
        parts = []
        for i, w in enumerate(ws):
            parts.append(" " + w)
            last = i == len(ws) - 1
            r = rng.random()
            if last:
                continue  # a core always ends with a plain lower-case word
            if r < 0.08:
                parts.append(",")
            elif r < 0.12:
                parts.append(" " + rng.choice(NUMBERS))
            elif r < 0.14:
                parts.append(" " + "".join(rng.choices(HAN, k=rng.randint(1, 4))))
            elif r < 0.15:
                parts.append(" " + rng.choice(EMOJI))
        text = "".join(parts)
        return text, self._encode(text)

    def text(self, rng: random.Random, n_tokens: int) -> tuple[str, list[int]]:
        """Whole sentences, about `n_tokens` long (at least one sentence when n_tokens > 0)."""
        if n_tokens <= 0:
            return "", []
        if n_tokens > FAST_MAX:
            return self._sentences(rng, n_tokens, None)
        text, ids, starts_tok, starts_chr, ends_tok, ends_chr = self.passages[
            int(rng.random() * len(self.passages))]
        k = int(rng.random() * len(starts_tok))
        t0, c0 = starts_tok[k], starts_chr[k]
        j = bisect_left(ends_tok, t0 + n_tokens)
        return text[c0:ends_chr[j]], ids[t0:ends_tok[j]]

    def _sentences(self, rng: random.Random, n_tokens: int,
                   marks: list[tuple[int, int, bool]] | None) -> tuple[str, list[int]]:
        """Sentences drawn one by one; `marks` collects (token offset, char offset, opens a
        paragraph) of every sentence start."""
        texts: list[str] = []
        ids: list[int] = []
        size = self.size
        inner, opening = self.forms[1], self.forms[0]  # continue / open a paragraph
        closing_inner, closing_opening = self.forms[3], self.forms[2]
        rand = rng.random
        new_paragraph = True
        left = 2 + int(rand() * 5)
        chars = 0
        while len(ids) < n_tokens:
            k = int(rand() * size)
            if marks is not None:
                marks.append((len(ids), chars, new_paragraph))
            left -= 1
            if left <= 0 and len(ids) + 24 < n_tokens:
                t, t_ids = (closing_opening if new_paragraph else closing_inner)[k]
                new_paragraph = True
                left = 2 + int(rand() * 5)
            else:
                t, t_ids = (opening if new_paragraph else inner)[k]
                new_paragraph = False
            texts.append(t)
            chars += len(t)
            ids += t_ids
        return "".join(texts), ids

    def words(self, rng: random.Random, n: int) -> str:
        """A few plain words (for tool-argument strings)."""
        text = self.forms[0][int(rng.random() * self.size)][0]
        return " ".join(text.rstrip(".?!:\n").split()[:n]).lower() or "value"

    def check(self, rng: random.Random, n: int) -> bool:
        """True when the precomputed ids equal a fresh encode on `n` random texts."""
        for _ in range(n):
            text, ids = self.text(rng, rng.randint(1, 400))
            if self._encode(text) != ids:
                return False
        return True
