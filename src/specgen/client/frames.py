"""A shortcut for the common stream chunk: same bytes as the previous one but for the token.

Servers send hundreds of chunks per answer that differ from each other only in the text of
one delta field (and, with true ids, in `token_ids`): `{"id":"gen-1",...,"delta":{"content":
"<TEXT>"},"finish_reason":null}]}`. Decoding every chunk into dicts is most of a stream's CPU.
A `Frame` is learnt from a chunk that was fully parsed and found plain (one non-empty text
field, no finish reason, error, usage or tool calls); a later chunk whose bytes are the frame's
bytes with other values in the slots is handled by decoding only the slots.

Why that is exact: the bytes outside the slots are identical to a chunk already parsed, and
each slot is checked to be exactly one JSON string body (`"` + slot + `"` decodes to a str:
an unescaped quote or a dangling backslash inside makes that fail) or one list of integers
(`[` + slot + `]` decodes to a list). So the chunk parses to the frame's chunk with the slot
values replaced, which is what the full parser would have seen. Anything else falls back to
the full parser.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_STRING_BODY = re.compile(rb'(?:[^"\\]|\\.)*', re.S)
TEXT_FIELDS = ("content", "reasoning", "reasoning_content")
_IDS_KEY = b'"token_ids":['


class Frame:
    """The constant bytes around one text slot and, optionally, one token-ids slot."""

    __slots__ = ("prefix", "mid", "suffix", "field", "ids_first", "into", "_lp", "_ls", "_lm")

    def __init__(self, prefix: bytes, mid: bytes | None, suffix: bytes, field: str,
                 ids_first: bool):
        self.prefix = prefix
        self.mid = mid  # bytes between the two slots; None without an ids slot
        self.suffix = suffix
        self.field = field  # which delta field the text slot is
        self.ids_first = ids_first
        self.into: list[str] | None = None  # where the parser collects this field's text
        self._lp = len(prefix)
        self._ls = len(suffix)
        self._lm = len(mid) if mid is not None else 0

    def match(self, event: bytes) -> tuple[str, list[Any] | None] | None:
        """(text, token ids or None) when `event` is this frame with other slot values."""
        if not (event.startswith(self.prefix) and event.endswith(self.suffix)):
            return None
        # Slices keep the slot's own delimiters (the prefix ends with `"` or `[`, what follows
        # starts with `"` or `]`), so each is one JSON value to check and decode.
        start = self._lp - 1
        end = len(event) - self._ls + 1
        if end < start + 2 + self._lm:
            return None
        mid = self.mid
        try:
            if mid is None:
                return _loads(event[start:end]), None
            cut = event.find(mid, start + 1, end - 1)
            if cut < 0:
                return None
            first = _loads(event[start:cut + 1])
            second = _loads(event[cut + self._lm - 1:end])
        except _JSONDecodeError:
            return None
        if self.ids_first:
            return second, first
        return first, second


def learn(payload: bytes, chunk: Any) -> Frame | None:
    """The frame of a fully parsed chunk (`payload`: its whole SSE event, `data: {...}`), or
    None when the chunk is not a plain token chunk."""
    if chunk.__class__ is not dict or chunk.get("error") or chunk.get("usage"):
        return None
    if "prompt_token_ids" in chunk:
        return None
    choices = chunk.get("choices")
    if choices.__class__ is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if choice.__class__ is not dict or choice.get("error") or choice.get("finish_reason"):
        return None
    if "prompt_token_ids" in choice:
        return None
    delta = choice.get("delta")
    if delta.__class__ is not dict or delta.get("tool_calls"):
        return None
    texts = [f for f in TEXT_FIELDS if delta.get(f)]
    if len(texts) != 1 or delta[texts[0]].__class__ is not str:
        return None
    if any(delta.get(f) not in (None, "") for f in TEXT_FIELDS if f != texts[0]):
        return None
    field = texts[0]
    key = b'"' + field.encode() + b'":"'
    if payload.count(key) != 1:
        return None
    t0 = payload.index(key) + len(key)
    t1 = _STRING_BODY.match(payload, t0).end()
    if payload[t1:t1 + 1] != b'"':
        return None
    try:
        if _loads(b'"' + payload[t0:t1] + b'"') != delta[field]:
            return None
    except _JSONDecodeError:
        return None
    ids = choice.get("token_ids")
    if ids is None:
        if _IDS_KEY in payload:
            return None
        return Frame(payload[:t0], None, payload[t1:], field, False)
    if ids.__class__ is not list or payload.count(_IDS_KEY) != 1:
        return None
    i0 = payload.index(_IDS_KEY) + len(_IDS_KEY)
    i1 = payload.find(b"]", i0)
    if i1 < 0 or (i0 < t1 and t0 < i1):
        return None
    try:
        if _loads(b"[" + payload[i0:i1] + b"]") != ids:
            return None
    except _JSONDecodeError:
        return None
    if t0 < i0:
        return Frame(payload[:t0], payload[t1:i0], payload[i1:], field, False)
    return Frame(payload[:i0], payload[i1:t0], payload[t1:], field, True)
