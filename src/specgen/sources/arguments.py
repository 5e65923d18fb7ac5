"""Tool-call arguments as datasets write them: JSON, JSON wrapped in quotes, or Python literals.

Datasets are sloppy here (glaive writes `'{"a": 1}'`, others write `{'a': 1, 'ok': True}`), so
parsing is tolerant; comparison (planner: "does the model's call match the dataset's?") is on
the parsed values. The arguments string a model produced is never re-serialised: only dataset
arguments that are not valid JSON get a canonical JSON form (`canonical_arguments`).
"""

from __future__ import annotations

import json
from typing import Any


class ArgumentsError(ValueError):
    """Arguments text that is neither JSON nor a Python-style literal."""


def parse_arguments(value: Any) -> Any:
    """Parsed value of tool-call arguments given as a string (or already parsed).

    Accepts JSON, a JSON text wrapped in single or double quotes (once or twice), and
    Python-style literals (single quotes, True/False/None, trailing commas).
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text:
        return {}
    for _ in range(3):  # unwrap '"{...}"' / "'{...}'" layers
        try:
            parsed: Any = json.loads(text)
        except ValueError:
            parsed = _Tolerant(text).parse()
        if isinstance(parsed, str) and parsed.strip()[:1] in ("{", "["):
            text = parsed.strip()
            continue
        return parsed
    return parsed


def canonical_arguments(value: Any) -> str:
    """A JSON arguments string: `value` verbatim when it is a JSON text, else `json.dumps`
    of its parsed form (default separators, non-ASCII kept)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = parse_arguments(text)
        else:
            if not isinstance(parsed, str):
                return text
            parsed = parse_arguments(parsed)
        value = parsed
    return json.dumps(value, ensure_ascii=False)


def arguments_equal(a: Any, b: Any) -> bool:
    """Whether two arguments (strings or parsed) mean the same call.

    Parsed values are compared strictly (a bool never equals a number; 1 equals 1.0);
    unparseable text is compared as stripped text.
    """
    try:
        pa, pb = parse_arguments(a), parse_arguments(b)
    except ArgumentsError:
        return isinstance(a, str) and isinstance(b, str) and a.strip() == b.strip()
    return _same(pa, pb)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


_WORDS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "/": "/", "\\": "\\",
            "'": "'", '"': '"', "0": "\0"}


class _Tolerant:
    """Recursive-descent parser for JSON-ish literals (both quote styles, Python words)."""

    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def parse(self) -> Any:
        value = self.value()
        self.ws()
        if self.i != len(self.s):
            self.fail("unexpected text after the value")
        return value

    def fail(self, what: str):
        snippet = self.s[max(0, self.i - 20): self.i + 20]
        raise ArgumentsError(f"{what} at offset {self.i} (near {snippet!r})")

    def ws(self) -> None:
        s, n = self.s, len(self.s)
        while self.i < n and s[self.i] in " \t\r\n":
            self.i += 1

    def value(self) -> Any:
        self.ws()
        if self.i >= len(self.s):
            self.fail("unexpected end")
        ch = self.s[self.i]
        if ch == "{":
            return self.container("}", dict)
        if ch == "[":
            return self.container("]", list)
        if ch in "\"'":
            return self.string()
        return self.scalar()

    def container(self, close: str, kind: type) -> Any:
        self.i += 1
        out: Any = kind()
        while True:
            self.ws()
            if self.i < len(self.s) and self.s[self.i] == close:
                self.i += 1
                return out
            if kind is dict:
                key = self.value()
                if not isinstance(key, str | int | float):
                    self.fail("object key must be a string")
                self.ws()
                if self.i >= len(self.s) or self.s[self.i] != ":":
                    self.fail("expected ':'")
                self.i += 1
                out[str(key)] = self.value()
            else:
                out.append(self.value())
            self.ws()
            if self.i < len(self.s) and self.s[self.i] == ",":
                self.i += 1
            elif self.i >= len(self.s) or self.s[self.i] != close:
                self.fail(f"expected ',' or '{close}'")

    def string(self) -> str:
        quote = self.s[self.i]
        self.i += 1
        out: list[str] = []
        s, n = self.s, len(self.s)
        while self.i < n:
            ch = s[self.i]
            if ch == quote:
                self.i += 1
                return "".join(out)
            if ch == "\\" and self.i + 1 < n:
                nxt = s[self.i + 1]
                if nxt == "u" and self.i + 6 <= n:
                    try:
                        out.append(chr(int(s[self.i + 2: self.i + 6], 16)))
                    except ValueError:
                        self.fail("bad \\u escape")
                    self.i += 6
                    continue
                out.append(_ESCAPES.get(nxt, "\\" + nxt))
                self.i += 2
                continue
            out.append(ch)
            self.i += 1
        self.fail("unterminated string")
        raise AssertionError  # unreachable

    def scalar(self) -> Any:
        start = self.i
        s, n = self.s, len(self.s)
        while self.i < n and s[self.i] not in ",:]} \t\r\n":
            self.i += 1
        word = s[start: self.i]
        if word in _WORDS:
            return _WORDS[word]
        try:
            return int(word)
        except ValueError:
            pass
        try:
            return float(word)
        except ValueError:
            self.i = start
            self.fail(f"unknown literal {word[:20]!r}")
        raise AssertionError  # unreachable
