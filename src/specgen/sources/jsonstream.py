"""Stream the rows of one big JSON document without loading it whole.

Understood layouts:
* `[row, row, ...]`                          -- an array of rows;
* `{"key": {row}, "key2": {row}, ...}`       -- an object of rows (the key is a fallback id);
* `{"train": [rows], "test": [rows]}`        -- an object of arrays (splits): the array named
  by `split`, else the first array.

Elements are decoded one at a time with `json.JSONDecoder.raw_decode` over a sliding buffer, so
memory is bounded by the largest single row. A syntax error cannot be resynchronised inside
one JSON document: the bad element is reported and reading that file stops.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

CHUNK = 1 << 20
_WS = " \t\r\n"


@dataclass(slots=True)
class JsonItem:
    """One element: its value (or an error text), its 1-based start line and its key."""

    value: Any
    line: int
    key: str | None = None
    error: str | None = None


class _Buffer:
    def __init__(self, f: IO[str]):
        self.f = f
        self.buf = ""
        self.pos = 0
        self.line_base = 1  # line number of buf[0]
        self.eof = False

    def more(self, want: int = 0) -> bool:
        if self.eof:
            return False
        data = self.f.read(max(want, CHUNK))
        if not data:
            self.eof = True
            return False
        if self.pos > CHUNK:  # drop consumed text, keep line numbers right
            self.line_base += self.buf.count("\n", 0, self.pos)
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += data
        return True

    def line(self, pos: int | None = None) -> int:
        return self.line_base + self.buf.count("\n", 0, self.pos if pos is None else pos)

    def skip_ws(self) -> str:
        """Advance over whitespace; the next character ('' at the end of input)."""
        while True:
            buf, n = self.buf, len(self.buf)
            while self.pos < n and buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < n:
                return buf[self.pos]
            if not self.more():
                return ""

    def decode(self, decoder: json.JSONDecoder) -> Any:
        """Decode one JSON value at pos, reading more input as needed."""
        want = CHUNK
        while True:
            try:
                value, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                incomplete = exc.pos >= len(self.buf) - 1 or "Unterminated" in exc.msg
                if incomplete and self.more(want):
                    want *= 2
                    continue
                raise
            # A number (or word) that touches the end of the buffer may continue.
            if end >= len(self.buf) and not self.eof and self.more(want):
                continue
            self.pos = end
            return value


def iter_json(f: IO[str], split: str | None = None) -> Iterator[JsonItem]:
    """Rows of a JSON document read from text stream `f` (see the module docstring)."""
    b = _Buffer(f)
    decoder = json.JSONDecoder()
    first = b.skip_ws()
    if first == "\ufeff":
        b.pos += 1
        first = b.skip_ws()
    if first == "[":
        b.pos += 1
        yield from _array(b, decoder, None)
        return
    if first != "{":
        line = b.line()
        what = "empty file" if first == "" else f"unexpected {first!r}"
        yield JsonItem(None, line, error=f"not a JSON array or object of rows ({what})")
        return
    b.pos += 1
    mode: str | None = None  # "rows" (object of rows) or "splits" (object of arrays)
    seen_splits: list[str] = []
    index_line = b.line()
    while True:
        ch = b.skip_ws()
        if ch == "}":
            break
        try:
            if ch != '"':
                raise json.JSONDecodeError("expected a string key", b.buf, b.pos)
            index_line = b.line()
            key = b.decode(decoder)
            if b.skip_ws() != ":":
                raise json.JSONDecodeError("expected ':'", b.buf, b.pos)
            b.pos += 1
            ch = b.skip_ws()
        except json.JSONDecodeError as exc:
            yield JsonItem(None, b.line(exc.pos), error=f"invalid JSON: {exc.msg}")
            return
        if mode is None:
            mode = "splits" if ch == "[" else "rows"
        if mode == "splits":
            if ch != "[":
                yield JsonItem(None, b.line(), error=f"value of {key!r} is not an array of rows")
                return
            b.pos += 1
            seen_splits.append(key)
            wanted = split is None and len(seen_splits) == 1 or key == split
            for item in _array(b, decoder, None):
                if wanted or item.error:
                    yield item
                if item.error:
                    return
            if split is None:
                return  # the first array only
        else:
            line = b.line()
            try:
                value = b.decode(decoder)
            except json.JSONDecodeError as exc:
                yield JsonItem(None, line, key=key, error=f"invalid JSON: {exc.msg}")
                return
            yield JsonItem(value, line, key=key)
        ch = b.skip_ws()
        if ch == ",":
            b.pos += 1
        elif ch != "}":
            yield JsonItem(None, b.line(), error=f"invalid JSON: expected ',' or '}}' after {key!r}")
            return
    if mode == "splits" and split is not None and split not in seen_splits:
        yield JsonItem(None, index_line,
                       error=f"split {split!r} not found; the file has: {', '.join(seen_splits)}")


def _array(b: _Buffer, decoder: json.JSONDecoder, key: str | None) -> Iterator[JsonItem]:
    while True:
        ch = b.skip_ws()
        if ch == "]":
            b.pos += 1
            return
        line = b.line()
        if ch == "":
            yield JsonItem(None, line, error="invalid JSON: the array is not closed")
            return
        try:
            value = b.decode(decoder)
        except json.JSONDecodeError as exc:
            yield JsonItem(None, b.line(exc.pos),
                           error=f"invalid JSON: {exc.msg} (the rest of this file cannot be read)")
            return
        yield JsonItem(value, line, key=key)
        ch = b.skip_ws()
        if ch == ",":
            b.pos += 1
        elif ch == "":
            yield JsonItem(None, b.line(), error="invalid JSON: the array is not closed")
            return
        elif ch != "]":
            yield JsonItem(None, b.line(),
                           error="invalid JSON: expected ',' or ']' (the rest of this file cannot be read)")
            return
