"""OpenRouter's `provider` routing object (2026): its keys and what each one may hold.

`provider_problem(obj)` is the one check: None when the object is valid, else a sentence naming
the key (`endpoint.provider.sort must be ...`). The config refuses a bad object before anything
is sent (OpenRouter answers an unknown key or a bad value with a 400 on every request);
`specgen probe` builds its pinned objects from the same vocabulary.
"""

from __future__ import annotations

from typing import Any

PROVIDER_KEYS = frozenset({
    "order", "only", "ignore", "quantizations", "allow_fallbacks", "require_parameters",
    "data_collection", "sort", "max_price", "zdr", "enforce_distillable_text",
    "preferred_min_throughput", "preferred_max_latency",
})
QUANTIZATIONS = frozenset({
    "int4", "int8", "fp4", "mxfp4", "nvfp4", "fp6", "fp8", "mxfp8", "fp16", "bf16", "fp32",
    "unknown",
})
LIST_KEYS = ("order", "only", "ignore", "quantizations")
BOOL_KEYS = ("allow_fallbacks", "require_parameters", "zdr", "enforce_distillable_text")
SORTS = ("price", "throughput", "latency")
SORT_PARTITIONS = ("model", "none")
# max_price: USD per million tokens (prompt, completion, ...) or per request / image / audio
MAX_PRICE_KEYS = ("prompt", "completion", "request", "image", "audio")
PERCENTILES = ("p50", "p75", "p90", "p99")
# Keys that only steer the order among allowed endpoints (no endpoint is filtered out).
ROUTING_ONLY = frozenset({"order", "sort", "allow_fallbacks", "preferred_min_throughput",
                          "preferred_max_latency"})


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0


def provider_problem(obj: Any, key: str = "endpoint.provider") -> str | None:
    """Why `obj` is not a valid provider object (naming `key.<field>`), or None."""
    if not isinstance(obj, dict):
        return f"[{key}] must be a table"
    unknown = sorted(set(obj) - PROVIDER_KEYS)
    if unknown:
        import difflib

        guesses = [f"`{m[0]}`" for k in unknown
                   if (m := difflib.get_close_matches(k, sorted(PROVIDER_KEYS), n=1, cutoff=0.7))]
        hint = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
        return (f"unknown key(s) in [{key}]: {', '.join(unknown)}{hint} "
                f"(OpenRouter accepts: {', '.join(sorted(PROVIDER_KEYS))})")
    for name in LIST_KEYS:
        if name in obj and not (isinstance(obj[name], list)
                                and all(isinstance(x, str) and x.strip() for x in obj[name])):
            return f"{key}.{name} must be a list of strings"
    bad = sorted(set(obj.get("quantizations", [])) - QUANTIZATIONS)
    if bad:
        return (f"{key}.quantizations has unknown value(s) {bad}; "
                f"known: {', '.join(sorted(QUANTIZATIONS))}")
    for name in BOOL_KEYS:
        if name in obj and not isinstance(obj[name], bool):
            return f"{key}.{name} must be true or false, not {obj[name]!r}"
    if "data_collection" in obj and obj["data_collection"] not in ("allow", "deny"):
        return f"{key}.data_collection must be \"allow\" or \"deny\", not {obj['data_collection']!r}"
    if "sort" in obj:
        problem = _sort_problem(obj["sort"], f"{key}.sort")
        if problem:
            return problem
    if "max_price" in obj:
        mp = obj["max_price"]
        if not isinstance(mp, dict) or not mp:
            return (f"{key}.max_price must be a table of prices in USD, e.g. "
                    "{ prompt = 1, completion = 3 } (per million tokens)")
        for k, v in mp.items():
            if k not in MAX_PRICE_KEYS:
                return (f"{key}.max_price.{k} is unknown (known: {', '.join(MAX_PRICE_KEYS)})")
            if not _number(v):
                return f"{key}.max_price.{k} must be a number >= 0 (USD), not {v!r}"
    for name, unit in (("preferred_min_throughput", "tokens per second"),
                       ("preferred_max_latency", "seconds")):
        if name in obj:
            problem = _preference_problem(obj[name], f"{key}.{name}", unit)
            if problem:
                return problem
    return None


def _sort_problem(value: Any, key: str) -> str | None:
    if isinstance(value, str):
        return None if value in SORTS else (
            f"{key} must be one of {', '.join(map(repr, SORTS))} (or a table "
            f"{{ by = \"price\", partition = \"model\" }}), not {value!r}")
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"by", "partition"})
        if unknown:
            return f"{key} has unknown key(s) {', '.join(unknown)} (known: by, partition)"
        if value.get("by") not in SORTS:
            return f"{key}.by must be one of {', '.join(map(repr, SORTS))}, not {value.get('by')!r}"
        if "partition" in value and value["partition"] not in SORT_PARTITIONS:
            return (f"{key}.partition must be one of {', '.join(map(repr, SORT_PARTITIONS))}, "
                    f"not {value['partition']!r}")
        return None
    return f"{key} must be a string or a table {{ by, partition }}, not {type(value).__name__}"


def _preference_problem(value: Any, key: str, unit: str) -> str | None:
    if _number(value):
        return None
    if isinstance(value, dict) and value:
        for k, v in value.items():
            if k not in PERCENTILES:
                return f"{key}.{k} is unknown (known percentiles: {', '.join(PERCENTILES)})"
            if not _number(v):
                return f"{key}.{k} must be a number >= 0 ({unit}), not {v!r}"
        return None
    return (f"{key} must be a number >= 0 ({unit}) or a table of percentiles, e.g. "
            f"{{ p90 = 2.0 }} ({', '.join(PERCENTILES)}); got {value!r}")


def sort_by(provider: dict[str, Any]) -> str | None:
    """The sort order a provider object asks for (`sort` as a string or `{by}`)."""
    sort = provider.get("sort")
    return sort.get("by") if isinstance(sort, dict) else sort
