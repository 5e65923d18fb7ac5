"""What a batch line is and what it costs (docs/batch.md), shared by the batch driver and
`specgen preview`: a line carries the live non-stream body of its request, byte for byte.

The two wire shapes (`[endpoint] batch_api`) differ only here and in `client/batch.py`:
"openai" lines are `{custom_id, method, url, body}` lines of an uploaded JSONL file;
"openrouter" lines are `{custom_id, body}` items of the inline `requests` array of one JSON
submission `{endpoint, model, completion_window, metadata, provider?, requests}`."""

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


def record(api: str, custom_id: str, body: bytes) -> bytes:
    """One line as sent, from its body's JSON bytes."""
    if api == "openrouter":
        return b'{"custom_id":%s,"body":%s}' % (orjson.dumps(custom_id), body)
    return b'{"custom_id":%s,"method":"POST","url":"%s","body":%s}' % (
        orjson.dumps(custom_id), CHAT_URL.encode(), body)


def line(custom_id: str, body: dict[str, Any], fixed: tuple[str, ...] = (),
         api: str = "openai") -> dict[str, Any]:
    return orjson.loads(line_bytes(custom_id, body, fixed, api))


def line_bytes(custom_id: str, body: dict[str, Any], fixed: tuple[str, ...] = (),
               api: str = "openai") -> bytes:
    return record(api, custom_id, orjson.dumps(line_body(body, fixed)))


def submission(api: str, records: list[bytes], *, model: str, window: str,
               metadata: dict[str, str], provider: Any = None) -> bytes:
    """What is sent for a batch: the JSONL file ("openai"), or the one JSON body of an
    inline batch ("openrouter": endpoint and model before `requests`, as OpenRouter reads
    the body as a stream; the routing `provider` of the lines, one provider per batch)."""
    if api != "openrouter":
        return b"".join(r + b"\n" for r in records)
    head: dict[str, Any] = {"endpoint": CHAT_URL, "model": model, "completion_window": window,
                            "metadata": metadata}
    if provider is not None:
        head["provider"] = provider
    return orjson.dumps(head)[:-1] + b',"requests":[' + b",".join(records) + b"]}"


def batch_prices(prices: Any, budget: Any) -> Any:
    """The batch prices: the live ones times `[budget] batch_price_factor` (default 0.5), so
    the budgets and the dollar cap reserve a submitted line's worst case at what the batch
    really costs."""
    from .engine.budget import Prices

    if not prices.known:
        return prices
    f = price_factor(budget)
    return Prices(prices.prompt * f, prices.completion * f, f"{prices.source} x{f:g} batch")
