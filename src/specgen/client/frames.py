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
the full parser. A slot of a field the parser never reads (OpenRouter's copy of each reasoning
piece in `reasoning_details[0].text`) is only checked to be one JSON string.
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
_DETAILS_TEXT_KEY = b'"text":"'


class Frame:
    """The constant bytes around one text slot and, optionally, a token-ids slot and slots the
    parser ignores (OpenRouter's `reasoning_details[0].text`, a copy of `reasoning`).

    `parts[i]` ends with slot i's opening delimiter (`"` or `[`) and `parts[i + 1]` starts with
    its closing one; `kinds[i]` is "text", "ids" or "skip".
    """

    __slots__ = ("prefix", "suffix", "field", "into", "_lp", "_ls", "_mids", "_text_at",
                 "_ids_at", "_skip_at", "simple", "sep", "_end", "event_size", "at",
                 "tail")

    def __init__(self, parts: list[bytes], kinds: list[str], field: str):
        self.prefix = parts[0]
        self.suffix = parts[-1]
        self.field = field  # which delta field the text slot is
        self.into: list[str] | None = None  # where the parser collects this field's text
        self._lp = len(self.prefix)
        self._ls = len(self.suffix)
        self._mids = tuple((m, len(m)) for m in parts[1:-1])  # bytes between two slots
        self._text_at = kinds.index("text")
        self._ids_at = kinds.index("ids") if "ids" in kinds else -1
        self._skip_at = tuple(i for i, k in enumerate(kinds) if k == "skip")
        self.simple = not self._mids  # one text slot: `StreamParser.feed` matches it inline
        # where the first slot's delimiter opens and, from the end, the last one's closes: a
        # one-slot event's text with its quotes is event[at:len(event) - tail]
        self.at = self._lp - 1
        self.tail = self._ls - 1
        # between two events of a one-slot frame: its suffix, the blank line, its prefix
        self.sep = self.suffix + b"\n\n" + self.prefix
        self._end = self.suffix + b"\n\n"
        self.event_size = len(self.sep) - 2  # an event of this frame with an empty slot

    def match(self, event: bytes) -> tuple[str, list[Any] | None] | None:
        """(text, token ids or None) when `event` is this frame with other slot values."""
        if not (event.startswith(self.prefix) and event.endswith(self.suffix)):
            return None
        # Slices keep the slot's own delimiters (a part before a slot ends with `"` or `[`, the
        # part after it starts with `"` or `]`), so each is one JSON value to check and decode.
        pos = self.at
        end = len(event) - self.tail
        try:
            if not self._mids:  # the common frame: one text slot
                if end < pos + 2:
                    return None
                return _loads(event[pos:end]), None
            pieces = []
            for mid, lm in self._mids:
                cut = event.find(mid, pos + 1, end - 1)
                if cut < 0:
                    return None
                pieces.append(event[pos:cut + 1])
                pos = cut + lm - 1
            if end < pos + 2:
                return None
            pieces.append(event[pos:end])
            raw = pieces[self._text_at]
            text = _loads(raw)
            ids = _loads(pieces[self._ids_at]) if self._ids_at >= 0 else None
            for i in self._skip_at:
                if pieces[i] != raw:  # a copy of the text is valid as the text is
                    _loads(pieces[i])
        except _JSONDecodeError:
            return None
        return text, ids


    def take_run(self, block: bytes) -> tuple[list[str], list[bytes], int] | None:
        """The leading events of `block` that are all this one-slot frame, read in one pass:
        (their texts, their raw slots, where the first other event starts); None when the
        first event is not this frame.

        From each slot's start the slot ends at the first quote no backslash escapes; the
        event is this frame exactly when the frame's suffix follows there (then the blank
        line and, when the next event is this frame too, its prefix). That is `match`'s check
        (the prefix, one JSON string body, the suffix) with one short `find` and one compare
        per event. The slots are decoded together as one JSON array of strings. A quote
        followed by the next event's bytes is taken without counting the backslashes before
        it; when it is escaped the array cannot decode: every later slot then sits outside a
        string, and the array's last quote opens one that never closes.
        """
        lp = self._lp
        if not block.startswith(self.prefix):
            return None
        find, startswith = block.find, block.startswith
        sep = self.sep
        lsep = len(sep)
        slots: list[bytes] = []
        append = slots.append
        s = lp  # the slot of the first event not yet taken
        end = 0  # where the first event not taken begins
        q = find(b'"', s)
        while q >= 0:
            if startswith(sep, q):  # this event ends here and the next is this frame too
                append(block[s:q])
                s = q + lsep
                q = find(b'"', s)
                continue
            if block[q - 1] == 92 and _escaped(block, q):
                q = find(b'"', q + 1)  # the slot goes on past an escaped quote
                continue
            if startswith(self._end, q):  # the last event of the run
                append(block[s:q])
                end = q + len(self._end)
            break
        if not slots:
            return None
        if not end:
            end = s - lp
        try:
            texts = _loads(b'["' + b'","'.join(slots) + b'"]')
        except _JSONDecodeError:
            return None  # an invalid escape or a raw control character: the full parser's
        if len(texts) != len(slots):
            return None
        return texts, slots, end


def _escaped(data: bytes, q: int) -> bool:
    """Whether the quote at `q` is escaped: an odd run of backslashes before it."""
    b = q
    while b and data[b - 1] == 92:
        b -= 1
    return (q - b) % 2 == 1


def _string_slot(payload: bytes, key: bytes, want: str) -> tuple[int, int] | None:
    """(start, end) of the string body after `key` (which ends with the opening quote), when
    `key` occurs once and the body decodes to `want`."""
    if payload.count(key) != 1:
        return None
    t0 = payload.index(key) + len(key)
    t1 = _STRING_BODY.match(payload, t0).end()
    if payload[t1:t1 + 1] != b'"':
        return None
    return (t0, t1) if _decodes_to(b'"' + payload[t0:t1] + b'"', want) else None


def _decodes_to(raw: bytes, want: Any) -> bool:
    try:
        return _loads(raw) == want
    except _JSONDecodeError:
        return False


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
    text = _string_slot(payload, b'"' + field.encode() + b'":"', delta[field])
    if text is None:
        return None
    slots = [(text[0], text[1], "text")]
    ids = choice.get("token_ids")
    if ids is None:
        if _IDS_KEY in payload:
            return None
    else:
        if ids.__class__ is not list or payload.count(_IDS_KEY) != 1:
            return None
        i0 = payload.index(_IDS_KEY) + len(_IDS_KEY)
        i1 = payload.find(b"]", i0)
        if i1 < 0 or not _decodes_to(b"[" + payload[i0:i1] + b"]", ids):
            return None
        slots.append((i0, i1, "ids"))
    details = delta.get("reasoning_details")
    if details is not None:
        # The parser reads `reasoning`, never its copy in `reasoning_details`: that text may
        # take any value, as long as it is one JSON string.
        if (details.__class__ is not list or len(details) != 1
                or details[0].__class__ is not dict or details[0].get("text").__class__ is not str):
            return None
        skip = _string_slot(payload, _DETAILS_TEXT_KEY, details[0]["text"])
        if skip is None:
            return None
        slots.append((skip[0], skip[1], "skip"))
    slots.sort()
    if any(a[1] >= b[0] for a, b in zip(slots, slots[1:], strict=False)):
        return None  # overlapping slots: not a layout this shortcut knows
    parts, kinds, pos = [], [], 0
    for start, end, kind in slots:
        parts.append(payload[pos:start])
        kinds.append(kind)
        pos = end
    parts.append(payload[pos:])
    return Frame(parts, kinds, field)
