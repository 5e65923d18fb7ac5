"""What a batch line is and what it costs (docs/batch.md), shared by the batch driver and
`specgen preview`: a line carries the live non-stream body of its request, byte for byte."""

from __future__ import annotations

from typing import Any

import orjson

from .batch_config import price_factor

CHAT_URL = "/v1/chat/completions"


def line_body(body: dict[str, Any], fixed: tuple[str, ...] = ()) -> dict[str, Any]:
    """A request's body as a batch line carries it: exactly the live non-stream body
    (`ChatClient.chat` adds `stream: false` to a body without `stream`), without the keys
    the batch API fixes (`batch_config.fixed_sampling`)."""
    out = body if "stream" in body else {**body, "stream": False}
    if fixed:
        out = {k: v for k, v in out.items() if k not in fixed}
    return out


def line(custom_id: str, body: dict[str, Any], fixed: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT_URL,
            "body": line_body(body, fixed)}


def line_bytes(custom_id: str, body: dict[str, Any], fixed: tuple[str, ...] = ()) -> bytes:
    return orjson.dumps(line(custom_id, body, fixed))


def batch_prices(prices: Any, budget: Any) -> Any:
    """The batch prices: the live ones times `[budget] batch_price_factor` (default 0.5), so
    the budgets and the dollar cap reserve a submitted line's worst case at what the batch
    really costs."""
    from .engine.budget import Prices

    if not prices.known:
        return prices
    f = price_factor(budget)
    return Prices(prices.prompt * f, prices.completion * f, f"{prices.source} x{f:g} batch")
