"""A provider's `usage` object, checked once where it is read: a count or cost that is not a
non-negative finite number below a sane bound (`"abc"`, `-20000`, `true`, NaN, a list,
10^15 tokens, $1e9) is dropped — treated as
missing, never charged — and named in the warnings the engine counts. A `usage` that is not an
object at all is missing as a whole. Budgets and the dollar cap therefore never see a negative
or non-numeric charge, and a paid answer is never lost to a malformed count."""

from __future__ import annotations

import math
from typing import Any

TOKENS = ("prompt_tokens", "completion_tokens", "total_tokens")
MONEY = ("cost", "upstream_inference_cost")
DETAILS = ("completion_tokens_details", "prompt_tokens_details", "cost_details")
# Beyond these one request's usage is not believed (no model reads or writes 100M tokens in
# one request, none costs $10,000): a figure above is dropped like a negative one, never
# charged, so a provider's 10^15 tokens or $1e9 cannot end a run as "spent".
MAX_TOKENS = 100_000_000
MAX_COST_USD = 10_000.0


def _number(value: Any, integer: bool) -> Any:
    """The value when it is a non-negative finite number (a whole one for token counts;
    12.0 is 12), else None."""
    if value.__class__ is bool or not isinstance(value, int | float):
        return None
    if value > (MAX_TOKENS if integer else MAX_COST_USD):
        return None
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            return None
        if integer:
            return int(value) if value.is_integer() else None
        return value
    return value if value >= 0 else None


def _show(value: Any) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 40 else text[:39] + "…"


def clean_usage(value: Any) -> tuple[dict[str, Any], list[str]]:
    """(the usage with every bad number left out, what was left out and why)."""
    if value is None:
        return {}, []
    if not isinstance(value, dict):
        return {}, [f"usage is {type(value).__name__}, not an object: ignored"]
    out: dict[str, Any] = dict(value)
    bad: list[str] = []
    for keys, integer in ((TOKENS, True), (MONEY, False)):
        for key in keys:
            if key in out and out[key] is not None:
                number = _number(out[key], integer)
                if number is None:
                    bad.append(f"usage.{key} = {_show(out[key])}")
                    del out[key]
                else:
                    out[key] = number
    for key in DETAILS:
        inner = out.get(key)
        if inner is None:
            continue
        if not isinstance(inner, dict):
            bad.append(f"usage.{key} = {_show(inner)}")
            del out[key]
            continue
        kept = {}
        for k, v in inner.items():
            if v is None or isinstance(v, dict):
                kept[k] = v  # not a figure
                continue
            number = _number(v, key != "cost_details")
            if number is None:
                bad.append(f"usage.{key}.{k} = {_show(v)}")
            else:
                kept[k] = number
        out[key] = kept
    return out, bad
