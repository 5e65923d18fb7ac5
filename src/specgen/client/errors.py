"""HTTP status and error bodies → `ApiError`; and keeping the API key out of everything.

Messages are short on purpose: the error text of a provider is kept (truncated), megabytes of
body never are, and the key is replaced wherever a server might have echoed it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from .retry import retry_after_from_headers
from .types import ApiError, ErrorClass
from .usage import clean_usage as _clean_usage

MAX_TEXT = 300  # characters of any server-provided text kept in a message

_STATUS_KIND: dict[int, ErrorClass] = {
    400: "bad_request",
    401: "auth",
    402: "credits",
    403: "moderation",
    404: "no_endpoints",
    408: "timeout",
    413: "bad_request",
    422: "bad_request",
    429: "rate_limit",
    500: "server",
    502: "server",
    503: "overloaded",
    504: "server",
    524: "server",
    529: "overloaded",
}


def classify_status(status: int) -> ErrorClass:
    """Error class of a non-2xx HTTP status (see docs/client.md for what each means)."""
    kind = _STATUS_KIND.get(status)
    if kind is not None:
        return kind
    if status >= 500:
        return "server"
    return "bad_request"  # other 4xx and unexpected 1xx/3xx: sending it again will not help


# OpenRouter's budget refusals, told apart by the body (never by the status alone).
IN_FLIGHT_REASON = "in_flight_budget_exhausted"
IN_FLIGHT_SOURCE = "openrouter_in_flight_budget"
WEIGHT_REASON = "weight_exceeds_budget"


def classify_error(status: int, err: Any) -> ErrorClass:
    """Error class of a non-2xx response from what its `error` object means: a 402 is the
    in-flight budget (retry), one request too heavy for it (fix the request) or credits (stop);
    a 403 with `metadata.limit_source` is a spent budget (stop), without it moderation."""
    kind = classify_status(status)
    if status not in (402, 403) or not isinstance(err, dict):
        return kind
    meta = err.get("metadata") if isinstance(err.get("metadata"), dict) else {}
    source = meta.get("limit_source")
    words = {str(v) for v in (meta.get("reason"), err.get("reason"), err.get("type"),
                              err.get("code"), source) if v is not None}
    if status == 402:
        message = str(err.get("message") or "")
        if IN_FLIGHT_REASON in words or IN_FLIGHT_SOURCE in words or IN_FLIGHT_REASON in message:
            return "in_flight_budget"
        if WEIGHT_REASON in words or WEIGHT_REASON in message:
            return "weight_exceeds_budget"
        return "credits"
    if isinstance(source, str) and source:
        return "spend_limit"
    return kind


def _metadata_wait(err: Any) -> float | None:
    """`error.metadata.retry_after_seconds` (429 bodies), when it is a sane number."""
    meta = err.get("metadata") if isinstance(err, dict) else None
    value = meta.get("retry_after_seconds") if isinstance(meta, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e9:
        return float(value)
    return None


def snippet(data: bytes | str, limit: int = MAX_TEXT) -> str:
    """A short printable excerpt of server-provided bytes or text."""
    if isinstance(data, bytes):
        text = data[: limit * 4].decode("utf-8", "replace")
    else:
        text = data
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_error(err: Any) -> tuple[str, str | None]:
    """(message, provider) from an OpenRouter/OpenAI `error` object (dict or string)."""
    if isinstance(err, str):
        return snippet(err), None
    if not isinstance(err, dict):
        return snippet(orjson.dumps(err, default=str)), None
    message = err.get("message")
    parts = [snippet(message) if isinstance(message, str) and message else "no message"]
    meta = err.get("metadata")
    provider = None
    if isinstance(meta, dict):
        name = meta.get("provider_name") or meta.get("provider")
        if isinstance(name, str) and name:
            provider = name
            parts.append(f"provider {name}")
        for key in ("error_type", "provider_code"):
            if meta.get(key) not in (None, ""):
                parts.append(f"{key}={snippet(str(meta[key]), 60)}")
        raw = meta.get("raw")
        if raw not in (None, ""):
            raw_text = raw if isinstance(raw, str) else orjson.dumps(raw, default=str)
            parts.append(f"raw: {snippet(raw_text, 200)}")
        reasons = meta.get("reasons")
        if isinstance(reasons, list) and reasons:
            parts.append("reasons: " + snippet(", ".join(map(str, reasons)), 120))
        for key in ("limit_source", "reason", "scope", "limit_usd", "spend_usd", "resets_at"):
            if isinstance(meta.get(key), str | int | float) and meta.get(key) != "":
                parts.append(f"{key}={snippet(str(meta[key]), 60)}")
    avail = err.get("availability")
    if not isinstance(avail, dict) and isinstance(meta, dict):
        avail = meta.get("availability")
    if isinstance(avail, dict) and avail.get("code"):
        parts.append(f"availability {snippet(str(avail['code']), 60)}")
    return "; ".join(parts), provider


def error_from_response(
    status: int, headers: Mapping[str, str], body: bytes, *, truncated: bool = False
) -> ApiError:
    """The ApiError for a non-2xx response with (the first part of) its body."""
    retry_after = retry_after_from_headers(headers)
    parsed: Any = None
    if not truncated:
        try:
            parsed = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            parsed = None
    err_obj: Any = parsed.get("error") if isinstance(parsed, dict) else None
    provider = None
    code = None
    if err_obj is not None:
        message, provider = describe_error(err_obj)
        if isinstance(err_obj, dict):
            code = err_obj.get("code")
    elif isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
        message = snippet(parsed["message"])  # some servers put the message at the top level
        err_obj = parsed
    else:
        message = snippet(body) if body else "empty body"
        err_obj = message
    kind = classify_error(status, err_obj)
    if retry_after is None:
        retry_after = _metadata_wait(err_obj)
    if provider is None and isinstance(parsed, dict) and isinstance(parsed.get("provider"), str):
        provider = parsed["provider"]
    if status in (301, 302, 303, 307, 308):
        message = f"unexpected redirect to {snippet(headers.get('Location', '?'), 120)}"
    usage = parsed.get("usage") if isinstance(parsed, dict) else None
    return ApiError(
        kind,
        message,
        status=status,
        retry_after=retry_after,
        provider=provider,
        body=err_obj,
        usage=_clean_usage(usage)[0] or None,
        code=code,
    )


class Redactor:
    """Replaces the API key wherever it could leak: messages, bodies, response fields."""

    __slots__ = ("_key",)

    MASK = "[REDACTED]"

    def __init__(self, key: str | None):
        self._key = key or None

    def __repr__(self) -> str:
        return "Redactor(<key hidden>)" if self._key else "Redactor(no key)"

    def text(self, value: str) -> str:
        key = self._key
        if key and key in value:
            return value.replace(key, self.MASK)
        return value

    def obj(self, value: Any) -> Any:
        """A JSON-like value with the key masked (round-trips through JSON only when needed)."""
        key = self._key
        if not key or value is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        try:
            dumped = orjson.dumps(value, default=str).decode()
        except TypeError:
            return self.text(repr(value))
        if key not in dumped:
            return value
        return orjson.loads(dumped.replace(key, self.MASK))

    def error(self, err: ApiError) -> ApiError:
        if self._key:
            err.message = self.text(err.message)
            err.args = (err.message,)
            err.body = self.obj(err.body)
            err.usage = self.obj(err.usage) or {}
            for name in ("provider", "model", "generation_id"):
                value = getattr(err, name)
                if isinstance(value, str):
                    setattr(err, name, self.text(value))
        return err
