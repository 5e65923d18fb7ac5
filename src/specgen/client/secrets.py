"""The API key and proxy credentials in an answer (`ChatResponse`): found, and masked where
masking is allowed.

An answer's metadata (provider, model, generation id, quantization, usage) is not the sample:
the client masks a secret there at once (`mask_metadata`), before the answer reaches stats,
logs or the attempts table, and says so in `ChatResponse.masked`. The answer's text (content,
reasoning, tool calls) is the sample and is never rewritten to hide a secret: `quoted` finds
it, and the answer path's `secret` stage quarantines the answer (`secret_in_answer`), storing
the copy `mask_answer` masked.
"""

from __future__ import annotations

import orjson

from .errors import Redactor
from .types import ChatResponse

METADATA = ("provider", "model", "id", "quantization")


def mask_metadata(resp: ChatResponse, r: Redactor) -> None:
    """Mask the secrets in `resp`'s metadata, naming each field masked in `resp.masked`."""
    for name in METADATA:
        value = getattr(resp, name)
        if r.quoted_in(value):
            setattr(resp, name, r.text(value))
            resp.masked.append(name)
    if resp.usage and r.quoted_in(_dumped(resp.usage)):
        resp.usage = r.obj(resp.usage)
        resp.masked.append("usage")


def _dumped(value) -> str:
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:
        return repr(value)


def quoted(resp: ChatResponse, r: Redactor) -> list[str]:
    """The fields of `resp` that quote a secret (`Redactor.MIN_FOUND` characters or more),
    the metadata the client masked included."""
    found = list(dict.fromkeys(resp.masked))
    for name in ("content", "reasoning", *METADATA):
        if name not in found and r.quoted_in(getattr(resp, name)):
            found.append(name)
    for call in resp.tool_calls:
        for part in ("name", "arguments", "id"):
            if r.quoted_in(getattr(call, part)):
                found.append(f"tool_calls[{call.index}].{part}")
    if "usage" not in found and resp.usage and r.quoted_in(_dumped(resp.usage)):
        found.append("usage")
    return found


def mask_answer(resp: ChatResponse, r: Redactor) -> None:
    """Mask every secret in `resp`, its text included: only for an answer set aside (the
    stored copy of a quarantined answer), never for a sample."""
    for name in ("content", "reasoning"):
        value = getattr(resp, name)
        if value:
            setattr(resp, name, r.text(value))
    for call in resp.tool_calls:
        call.name = r.text(call.name)
        call.arguments = r.text(call.arguments)
        call.id = r.text(call.id)
    if resp.usage_warnings:
        resp.usage_warnings = [r.text(w) for w in resp.usage_warnings]
    mask_metadata(resp, r)
