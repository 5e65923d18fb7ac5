"""Fault draws and OpenRouter-shaped error bodies.

One uniform draw per fault table picks at most one fault (the rates are disjoint slices of
[0, 1)). Error bodies are `{"error": {"code", "message", "metadata"}}`; provider errors carry
`metadata` in one of the two shapes seen from OpenRouter: `{provider_name, raw}` or
`{error_type, provider_code}`.
"""

from __future__ import annotations

import random
from typing import Any

from .config import FaultRates

# Faults answered with an HTTP error status before any token.
HTTP_FAULTS: dict[str, int] = {
    "rate_limit": 429, "timeout": 408, "server_error": 500, "bad_gateway": 502,
    "unavailable": 503, "moderation": 403,
}
# Provider failures before the first token, which OpenRouter hides by falling back.
FALLBACK_FAULTS = frozenset({"rate_limit", "timeout", "server_error", "bad_gateway",
                             "unavailable"})

_MESSAGES = {
    429: ("Rate limit exceeded: too many requests to the provider", "rate_limit_exceeded",
          '{"error":{"message":"Too many requests, please retry later","code":429}}'),
    408: ("Request timed out upstream", "timeout",
          '{"error":{"message":"upstream request timeout"}}'),
    500: ("Internal Server Error", "server_error",
          '{"object":"error","message":"Internal server error","code":500}'),
    502: ("Provider returned error", "bad_gateway",
          "<html><body><h1>502 Bad Gateway</h1></body></html>"),
    503: ("Provider is overloaded, please try again later", "provider_overloaded",
          '{"error":{"message":"The engine is currently overloaded","type":"overloaded_error"}}'),
}


FaultTable = tuple[tuple[str, float], ...]


def fault_table(rates: FaultRates) -> FaultTable:
    """The non-zero rates, in declaration order (what `draw` needs, computed once)."""
    return tuple((name, rate) for name, rate in rates.items() if rate > 0)


def draw(table: FaultTable, rng: random.Random) -> str | None:
    """The fault for this request, or None (one uniform draw; none at all when every rate
    is zero)."""
    if not table:
        return None
    u = rng.random()
    acc = 0.0
    for name, rate in table:
        acc += rate
        if u < acc:
            return name
    return None


def error_body(code: int, message: str, metadata: dict[str, Any] | None = None,
               **extra: Any) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if metadata is not None:
        err["metadata"] = metadata
    err.update(extra)
    return {"error": err}


def provider_error(status: int, provider_name: str, shape: str, rng: random.Random
                   ) -> dict[str, Any]:
    """Body of a provider failure with HTTP `status` (429/408/5xx)."""
    message, error_type, raw = _MESSAGES[status]
    if shape == "both":
        shape = "provider_raw" if rng.random() < 0.5 else "error_type"
    if shape == "provider_raw":
        meta: dict[str, Any] = {"provider_name": provider_name, "raw": raw}
    else:
        meta = {"error_type": error_type, "provider_code": status}
    extra: dict[str, Any] = {}
    if status in (429, 503):
        extra["availability"] = {"code": error_type, "retryable": True}
    return error_body(status, message, meta, **extra)


def moderation_error(provider_name: str, model: str, flagged: str) -> dict[str, Any]:
    return error_body(403, f"{model} requires moderation on {provider_name}. Your input was "
                      "flagged for \"harassment\".",
                      {"reasons": ["harassment"], "flagged_input": flagged[:100],
                       "provider_name": provider_name, "model_slug": model})
