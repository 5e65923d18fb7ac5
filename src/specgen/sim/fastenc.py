"""A faster stand-in for `Tokenizer.encode` with every special token allowed.

tiktoken's own special-token scan costs ~60 us per call whatever the text length, which is
most of a simulated request's budget. This finds special-token text with a cheap scan and
encodes the plain text between them with `encode_ordinary`, which is what tiktoken does too.
It is checked against the real `encode` when built and disables itself on any mismatch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..tokenizer import Tokenizer

_CHECK_TEXTS = (
    "",
    "plain words, numbers 12345 and   spaces\n\n",
    "<|im_user|>user<|im_middle|>Hello <think>x</think> y<|im_end|>",
    "a<|im_end|>b<|im_end|><|im_end|> [EOS] <| not special |> <thinking>",
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
    '{"a": 1}<|tool_call_end|><|tool_calls_section_end|>',
    "中文 text \U0001F600 and \u2728!",
)


CACHE_PIECE_CHARS = 8192  # plain-text pieces up to this long are remembered ...
CACHE_TOTAL_CHARS = 1 << 18  # ... up to this many characters in all


class FastEncoder:
    """`encode(text)` equal to `tokenizer.encode(text)`, faster on short texts."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._encode_ordinary = tokenizer.encode_ordinary
        # Pieces seen before (role names, system prompts, tool declarations, earlier turns),
        # bounded by their total length.
        self._cache: dict[str, list[int]] = {}
        self._cached_chars = 0
        self._special = dict(tokenizer.special_tokens)
        self._lengths = sorted({len(s) for s in self._special}, reverse=True)
        # When every special token is "<...>" or "[...]" with no other bracket inside (Kimi's
        # are), one C-level split finds every candidate; a dict lookup decides.
        opening = {"<": ">", "[": "]"}
        self._split = None
        if self._special and all(
            len(s) > 1 and s[0] in opening and s[-1] == opening[s[0]]
            and not any(c in "<>[]" for c in s[1:-1]) for s in self._special
        ):
            self._split = re.compile(r"([<\[][^<>\[\]]*[>\]])").split
        starts = sorted({s[0] for s in self._special if s})
        self._starts = re.compile("[" + "".join(re.escape(c) for c in starts) + "]") if starts else None
        # A special that is a prefix of another would make "longest match" ambiguous. In
        # sorted order, a prefix is followed by a name that starts with it.
        names = sorted(self._special)
        prefix_free = not any(b.startswith(a) for a, b in zip(names, names[1:], strict=False))
        self.active = prefix_free and all(
            self._encode(t) == tokenizer.encode(t) for t in _CHECK_TEXTS
        )

    def _ordinary(self, text: str) -> list[int]:
        """Ids of plain text; may be a cached list: callers extend with it, never change it."""
        ids = self._cache.get(text)
        if ids is not None:
            return ids
        ids = self._encode_ordinary(text)
        n = len(text)
        if n <= CACHE_PIECE_CHARS:
            if self._cached_chars + n > CACHE_TOTAL_CHARS:
                self._cache.clear()
                self._cached_chars = 0
            self._cache[text] = ids
            self._cached_chars += n
        return ids

    def _encode_angle(self, text: str) -> list[int]:
        """`_encode_split` for text without "[": candidates run from a "<" to the next ">"."""
        chunks = text.split("<")
        special = self._special
        out: list[int] = []
        plain = chunks[0]
        for chunk in chunks[1:]:
            j = chunk.find(">")
            tid = special.get("<" + chunk[:j + 1]) if j >= 0 else None
            if tid is None:
                plain += "<" + chunk
                continue
            if plain:
                out += self._ordinary(plain)
            out.append(tid)
            plain = chunk[j + 1:]
        if plain:
            out += self._ordinary(plain)
        return out

    def encode(self, text: str) -> list[int]:
        if not self.active:
            return self.tokenizer.encode(text)
        return self._encode(text)

    def _encode(self, text: str) -> list[int]:
        if self._split is not None:
            return self._encode_split(text)
        if self._starts is None:
            return list(self._ordinary(text))
        out: list[int] = []
        pos = 0
        special = self._special
        for m in self._starts.finditer(text):
            p = m.start()
            if p < pos:
                continue
            for n in self._lengths:
                tid = special.get(text[p:p + n])
                if tid is not None:
                    if p > pos:
                        out += self._ordinary(text[pos:p])
                    out.append(tid)
                    pos = p + n
                    break
        if pos < len(text):
            out += self._ordinary(text[pos:] if pos else text)
        return out

    def _encode_split(self, text: str) -> list[int]:
        if "[" not in text:
            return self._encode_angle(text)
        parts = self._split(text)
        if len(parts) == 1:
            return list(self._ordinary(text)) if text else []
        special = self._special
        out: list[int] = []
        plain = parts[0]  # plain text not yet encoded (candidates that are not special join it)
        for k in range(1, len(parts), 2):
            tid = special.get(parts[k])
            if tid is None:
                plain += parts[k] + parts[k + 1]
                continue
            if plain:
                out += self._ordinary(plain)
            out.append(tid)
            plain = parts[k + 1]
        if plain:
            out += self._ordinary(plain)
        return out


class FastTokenizer:
    """A tokenizer proxy whose `encode` is a `FastEncoder`; everything else is delegated.

    Renderers built over it compute exactly the ids they would over the wrapped tokenizer.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._fast = FastEncoder(tokenizer)
        self.encode = self._fast.encode

    @property
    def wrapped(self) -> Tokenizer:
        return self._tok

    def __getattr__(self, name: str):
        return getattr(self._tok, name)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids)
