"""OpenRouter provider routing over the simulated providers (the request's `provider` object).

`parse_preferences` validates the object (unknown keys and bad values are a 400, like
OpenRouter); `route` applies the filters and returns the providers to try, in order, or raises
`NoEndpoints` (a 404 with `error.availability`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ..config import PROVIDER_KEYS, QUANTIZATIONS
from .config import ProviderConfig

SORTS = ("price", "throughput", "latency")
# Model-name variants that set a sort order (`moonshotai/kimi-k2.5:nitro`).
VARIANT_SORT = {"nitro": "throughput", "floor": "price"}


class BadRequest(ValueError):
    """The request is invalid (HTTP 400); the message says which field."""


class NoEndpoints(Exception):
    """No provider is left (HTTP 404). `code` is `no_endpoints` or `constraint_filtered`."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def parse_preferences(obj: Any) -> dict[str, Any]:
    """Validated copy of the request's `provider` object."""
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise BadRequest("provider: expected an object")
    unknown = sorted(set(obj) - PROVIDER_KEYS)
    if unknown:
        raise BadRequest(
            "provider: Unrecognized key(s) in object: " + ", ".join(repr(k) for k in unknown)
        )
    for key in ("order", "only", "ignore", "quantizations"):
        if key in obj and not (
            isinstance(obj[key], list) and all(isinstance(x, str) for x in obj[key])
        ):
            raise BadRequest(f"provider.{key}: expected an array of strings")
    bad = sorted(set(obj.get("quantizations") or ()) - QUANTIZATIONS)
    if bad:
        raise BadRequest(f"provider.quantizations: invalid value(s) {bad}; expected one of "
                         f"{', '.join(sorted(QUANTIZATIONS))}")
    for key in ("allow_fallbacks", "require_parameters", "zdr", "enforce_distillable_text"):
        if key in obj and obj[key] is not None and not isinstance(obj[key], bool):
            raise BadRequest(f"provider.{key}: expected a boolean")
    if obj.get("data_collection") not in (None, "allow", "deny"):
        raise BadRequest("provider.data_collection: expected 'allow' or 'deny'")
    sort = obj.get("sort")
    if isinstance(sort, dict):
        sort = sort.get("by")
    if sort is not None and sort not in SORTS:
        raise BadRequest(f"provider.sort: expected one of {', '.join(SORTS)}")
    max_price = obj.get("max_price")
    if max_price is not None:
        if not isinstance(max_price, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in max_price.values()
        ):
            raise BadRequest("provider.max_price: expected an object of numbers "
                             "(USD per million tokens)")
    for key in ("preferred_min_throughput", "preferred_max_latency"):
        value = obj.get(key)
        if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
            continue
        if not isinstance(value, dict) or not all(
                k in ("p50", "p75", "p90", "p99") and isinstance(v, int | float)
                and not isinstance(v, bool) for k, v in value.items()):
            raise BadRequest(f"{key}: expected a number or an object of percentiles "
                             "(p50, p75, p90, p99)")
    out = dict(obj)
    out["sort"] = sort
    return out


def _matches(p: ProviderConfig, names: Sequence[str]) -> bool:
    keys = {p.tag.lower(), p.slug.lower(), p.name.lower()}
    return any(n.lower() in keys for n in names)


def route(providers: Sequence[ProviderConfig], model: str, prefs: dict[str, Any], *,
          params: set[str], has_tools: bool, rng: random.Random,
          sort: str | None = None) -> list[ProviderConfig]:
    """Providers to try for this request, best first (fallbacks included when allowed)."""
    serving = [p for p in providers if not p.models or model in p.models]
    if not serving:
        raise NoEndpoints("no_endpoints", f"No endpoints found for {model}.")
    left = serving
    if prefs:
        left = _filter(left, prefs, params)
    if has_tools:
        left = [p for p in left if "tools" in p.supported_parameters]
    if not left:
        raise NoEndpoints(
            "constraint_filtered",
            f"No endpoints found that can handle the requested parameters and provider "
            f"preferences for {model}. {len(serving)} endpoint(s) were filtered out.",
        )
    ordered = _order(left, (prefs.get("sort") if prefs else None) or sort, rng)
    if not prefs:
        return ordered
    ordered = _preferred_first(ordered, prefs)
    allow_fallbacks = prefs.get("allow_fallbacks")
    allow_fallbacks = True if allow_fallbacks is None else allow_fallbacks
    order = prefs.get("order") or []
    if order:
        listed: list[ProviderConfig] = []
        for name in order:
            for p in ordered:
                if p not in listed and _matches(p, [name]):
                    listed.append(p)
        if not allow_fallbacks:
            if not listed:
                raise NoEndpoints(
                    "constraint_filtered",
                    f"None of the providers in provider.order is available for {model} and "
                    "allow_fallbacks is false.",
                )
            return listed
        return listed + [p for p in ordered if p not in listed]
    return ordered if allow_fallbacks else ordered[:1]


def _filter(left: list[ProviderConfig], prefs: dict[str, Any], params: set[str]
            ) -> list[ProviderConfig]:
    """The endpoints the preference filters keep."""
    if prefs.get("only"):
        left = [p for p in left if _matches(p, prefs["only"])]
    if prefs.get("ignore"):
        left = [p for p in left if not _matches(p, prefs["ignore"])]
    if prefs.get("quantizations"):
        allowed = set(prefs["quantizations"])
        left = [p for p in left if p.quantization in allowed]
    if prefs.get("data_collection") == "deny":
        left = [p for p in left if not p.collects_data]
    if prefs.get("zdr"):
        left = [p for p in left if p.zdr]
    if prefs.get("enforce_distillable_text"):
        left = [p for p in left if p.distillable]
    max_price = prefs.get("max_price") or {}
    if "prompt" in max_price:
        left = [p for p in left if p.prompt_price_per_m <= max_price["prompt"]]
    if "completion" in max_price:
        left = [p for p in left if p.completion_price_per_m <= max_price["completion"]]
    if prefs.get("require_parameters"):
        left = [p for p in left if params <= set(p.supported_parameters)]
    return left


def _threshold(value: Any) -> float | None:
    """A preference's figure: the number, or a percentile object's tightest value (the sim
    has one figure per endpoint, not a distribution)."""
    if isinstance(value, dict):
        return min(value.values()) if value else None
    return value


def _preferred_first(ps: list[ProviderConfig], prefs: dict[str, Any]) -> list[ProviderConfig]:
    """`preferred_min_throughput` / `preferred_max_latency` are preferences, not filters:
    endpoints that miss them go after those that meet them (order otherwise kept)."""
    tps = _threshold(prefs.get("preferred_min_throughput"))
    lat = _threshold(prefs.get("preferred_max_latency"))
    if tps is None and lat is None:
        return ps

    def meets(p: ProviderConfig) -> bool:
        speed = p.tokens_per_second or float("inf")
        return (tps is None or speed >= tps) and (lat is None or p.latency_s <= lat)

    return [p for p in ps if meets(p)] + [p for p in ps if not meets(p)]


def _order(ps: list[ProviderConfig], sort: str | None, rng: random.Random) -> list[ProviderConfig]:
    if sort == "price":
        return sorted(ps, key=_price)
    if sort == "throughput":
        return sorted(ps, key=lambda p: -(p.tokens_per_second or float("inf")))
    if sort == "latency":
        return sorted(ps, key=lambda p: p.latency_s)
    # Default: load-balanced, weighted by the inverse square of the price; the rest by price.
    by_price = sorted(ps, key=_price)
    if len(by_price) == 1:
        return by_price
    weights = [1.0 / max(_price(p), 1e-9) ** 2 for p in by_price]
    first = rng.choices(by_price, weights=weights, k=1)[0]
    return [first] + [p for p in by_price if p is not first]


def _price(p: ProviderConfig) -> float:
    return p.prompt_price_per_m + p.completion_price_per_m
