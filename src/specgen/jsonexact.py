"""JSON without losing integers: orjson where it is exact, the stdlib where it is not.

orjson reads an integer beyond 64 bits (below -2**63 or above 2**64-1) as a float
(`100000000000000000000` → `1e+20`) and refuses to write one ("Integer exceeds 64-bit range").
Dataset rows carry such integers (tool-call arguments given as objects, tool-schema
defaults), and a float in their place changes the request sent and the ids rendered. So:

* `loads`: orjson, unless the text holds a run of 19 or more digits (the shortest integer
  orjson can lose is 19 digits long, `-9223372036854775809`): then the stdlib reader, which
  keeps every integer exact. A run inside a string costs only the slower reader.
* `dumps`: orjson, and the stdlib writer (compact, non-ASCII kept) for a value orjson refuses
  for its integers.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_LONG_DIGITS = re.compile(rb"\d{19}")
_LONG_DIGITS_STR = re.compile(r"\d{19}")

JSONDecodeError = orjson.JSONDecodeError  # what `loads` raises (a json.JSONDecodeError)


def may_lose_integers(data: bytes | bytearray | memoryview | str) -> bool:
    """Whether orjson could read an integer of `data` as a float."""
    if isinstance(data, str):
        return _LONG_DIGITS_STR.search(data) is not None
    return _LONG_DIGITS.search(data) is not None


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON with every integer exact (see the module doc)."""
    if not may_lose_integers(data):
        return orjson.loads(data)
    value = orjson.loads(data)  # validates, and raises orjson's error for bad JSON
    text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    try:
        return json.loads(text)
    except ValueError:  # stricter or looser than orjson on an edge: keep orjson's reading
        return value


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Serialise to JSON bytes; integers beyond 64 bits written exactly."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                      sort_keys=sort_keys, allow_nan=False).encode("utf-8")
