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
    status: int, headers: Mapping[str, str], body: bytes, *, truncated: bool = False,
    redact: Redactor | None = None,
) -> ApiError:
    """The ApiError for a non-2xx response with (the first part of) its body. With `redact`,
    the key is masked in the body, its parsed fields and the headers before anything is cut
    to a snippet (a cut key is no longer the key, and would leak most of it)."""
    retry_after = retry_after_from_headers(headers)
    if redact is not None:
        body = redact.data(body)
    parsed: Any = None
    if not truncated:
        try:
            parsed = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            parsed = None
        if redact is not None:
            parsed = redact.obj(parsed)  # a key written with JSON escapes
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
        location = headers.get("Location", "?")
        if redact is not None:
            location = redact.text(location)
        message = f"unexpected redirect to {snippet(location, 120)}"
    if status == 407:  # a proxy on the way, not the API: the path to it is refused
        kind = "unreachable"
        message = f"the proxy refused the request (407 Proxy Authentication Required): {message}"
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
    """Replaces the API key (and a proxy's credentials) wherever they could leak: messages,
    bodies, response metadata; and finds them in an answer's text, which it never rewrites
    (an answer quoting one is quarantined: `specgen.engine.answer.secret`).

    Text is masked before it is cut (`error_from_response`); for text cut elsewhere (a
    stream's error chunk described by the parser), the start of a secret left just before a
    cut — `…`, or the end of the text — is masked too (`PARTIAL` characters or more).

    Short secrets: one of fewer than `MIN_MASKED` characters is never masked (masking a key
    `x` would rewrite every x of every message), and an answer is searched only for secrets
    of `MIN_FOUND` characters or more: a shorter one (a placeholder such as `EMPTY` for a
    local server; no provider issues keys that short) would quarantine ordinary text."""

    __slots__ = ("_found_keys", "_key", "_keys")

    MASK = "[REDACTED]"
    PARTIAL = 4  # a secret's first characters this long or longer, at a cut, are masked
    MIN_MASKED = 4  # characters: a shorter secret is not masked in messages
    MIN_FOUND = 8  # characters: a shorter secret is not searched for in answers

    def __init__(self, key: str | None, extra: tuple[str, ...] = ()):
        # the longest first, so a secret inside another is masked as part of it
        keys = sorted({k for k in (key, *extra) if k and len(k) >= self.MIN_MASKED},
                      key=len, reverse=True)
        self._keys = tuple(keys)
        self._key = self._keys[0] if self._keys else None
        self._found_keys = tuple(k for k in keys if len(k) >= self.MIN_FOUND)

    def __repr__(self) -> str:
        return "Redactor(<key hidden>)" if self._key else "Redactor(no key)"

    def _cut_prefix(self, key: str, value: str, end: int) -> int:
        """The start of the longest prefix of `key` (>= PARTIAL) that ends at `end`, else -1."""
        for n in range(min(len(key) - 1, end), self.PARTIAL - 1, -1):
            if value.startswith(key[:n], end - n):
                return end - n
        return -1

    def text(self, value: str, cut: bool = False) -> str:
        """`value` with every secret masked; `cut`: text that may have been cut short (error
        messages), where a secret's start before a cut is masked too."""
        for key in self._keys:
            if key in value:
                value = value.replace(key, self.MASK)
        if not cut:
            return value
        for key in self._keys:
            if key[: self.PARTIAL] not in value:
                continue
            # a cut secret: at each "…" and at the end
            ends, at = [], value.find("…")
            while at >= 0:
                ends.append(at)
                at = value.find("…", at + 1)
            ends.append(len(value))
            for end in reversed(ends):
                start = self._cut_prefix(key, value, end)
                if start >= 0:
                    value = value[:start] + self.MASK + value[end:]
        return value

    def data(self, value: bytes) -> bytes:
        """Raw bytes (an error body, maybe cut at a cap) with every secret masked, a cut one
        too."""
        if not self._keys or not value:
            return value
        mask = self.MASK.encode()
        tail = False
        for key in self._keys:
            bkey = key.encode()
            if bkey in value:
                value = value.replace(bkey, mask)
            tail = tail or bkey[: self.PARTIAL] in value[-len(bkey):]
        if tail:
            text = value.decode("utf-8", "surrogateescape")
            value = self.text(text, cut=True).encode("utf-8", "surrogateescape")
        return value

    def _found(self, text: str) -> bool:
        return any(k in text for k in self._keys)

    def quoted_in(self, text: str | None) -> bool:
        """Whether `text` (an answer's) quotes a secret long enough to be searched for."""
        return bool(text) and any(k in text for k in self._found_keys)

    def obj(self, value: Any, cut: bool = False) -> Any:
        """A JSON-like value with the key masked (round-trips through JSON only when needed)."""
        if not self._keys or value is None:
            return value
        if isinstance(value, str):
            return self.text(value, cut)
        try:
            dumped = orjson.dumps(value, default=str).decode()
        except TypeError:
            return self.text(repr(value))
        if not self._found(dumped):
            return value
        return orjson.loads(self.text(dumped))

    def error(self, err: ApiError) -> ApiError:
        if self._key:
            err.message = self.text(err.message, cut=True)
            err.args = (err.message,)
            err.body = self.obj(err.body, cut=True)
            err.usage = self.obj(err.usage) or {}
            for name in ("provider", "model", "generation_id"):
                value = getattr(err, name)
                if isinstance(value, str):
                    setattr(err, name, self.text(value))
        return err
