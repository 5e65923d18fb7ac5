"""How names and numbers are shown in every output: the same label for an unknown provider,
thousands separators on counts, dollars to a fixed precision, and JSON floats without
binary noise (`0.023308099999999998` -> `0.0233081`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

UNKNOWN_PROVIDER = "(unknown)"  # an answer that named no provider
# attempts that ended before any provider answered (the router's own 429, a timeout, a
# connection error): no provider to blame, so not a provider row like the others
NO_PROVIDER = "no provider (never answered)"
ANSWERED_OUTCOMES = ("ok", "quarantined", "rejected", "superseded")  # outcome before ":"
FLOAT_DIGITS = 12  # significant digits JSON floats keep: Unix times keep their milliseconds


def printable(text: str, keep: str = "") -> str:
    """`text` safe to print on a terminal: every character that is not printable (an escape
    sequence's ESC, C1 controls, carriage returns, bidi overrides, ...) shown as its Python
    escape (`\\x1b`), except those in `keep` ("\\n" for a block of lines). Provider names,
    batch ids and model names come from the API: a hostile one must not move the cursor,
    retitle the terminal or forge a line of output."""
    if text.isprintable() or all(c.isprintable() or c in keep for c in text):
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def printable_data(obj: Any) -> Any:
    """A JSON-like value with every string in it (keys too) made `printable`: what a text
    view renders from API-supplied data."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, dict):
        return {printable_data(k): printable_data(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [printable_data(v) for v in obj]
    return obj


def provider_label(name: str | None, outcome: str | None = None) -> str:
    """A provider's name; for an attempt that named none, `UNKNOWN_PROVIDER` when it was
    answered (its `outcome` ok, quarantined or rejected, or not given) and `NO_PROVIDER` when
    it ended in an error before any provider answered."""
    if name:
        return name
    if outcome is None or outcome.split(":", 1)[0] in ANSWERED_OUTCOMES:
        return UNKNOWN_PROVIDER
    return NO_PROVIDER


def in_flight_text(in_flight: int, limit: int, maximum: int | None = None) -> str:
    """`in flight 12/16`; never a count above its own limit (`in flight 15/11`): when the
    limit was lowered under what is already in flight (an adaptive back-off, lines already in
    submitted batches), it says so and what happens next. `maximum`: the configured
    concurrency, shown when the limit is below it."""
    of = f" of {maximum:,}" if maximum is not None and maximum != limit else ""
    if in_flight <= limit:
        return f"in flight {in_flight:,}/{limit:,}" + (f" (max {maximum:,})" if of else "")
    return (f"in flight {in_flight:,}, over the limit {limit:,}{of} it was lowered to: no new "
            f"request until {in_flight - limit:,} finish")


def count(n: int | float | None) -> str:
    """A count with thousands separators (`12,678`); `—` when unknown."""
    return "—" if n is None else f"{round(n):,}"


def usd(v: float | None, digits: int = 4) -> str:
    """Dollars, `$1,234.5678`; `—` when unknown."""
    return "—" if v is None else f"${v:,.{digits}f}"


def round_sig(x: float, digits: int = FLOAT_DIGITS) -> float:
    """`x` to `digits` significant digits (what a float means, without its binary noise)."""
    if x == 0 or x != x or x in (float("inf"), float("-inf")):
        return x
    return float(f"{x:.{digits}g}")


def clean_floats(obj: Any, digits: int = FLOAT_DIGITS) -> Any:
    """A JSON-able value with every float rounded to `digits` significant digits."""
    if isinstance(obj, float):
        return round_sig(obj, digits)
    if isinstance(obj, dict):
        return {k: clean_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean_floats(v, digits) for v in obj]
    return obj


def path(p: str | Path) -> str:
    """A path as a person would write it: `examples/../runs/q` -> `runs/q` (unless a symlink
    makes the two different places)."""
    raw = str(p)
    tidy = os.path.normpath(raw)
    if tidy != raw and os.path.realpath(tidy) != os.path.realpath(raw):
        return raw
    return tidy
