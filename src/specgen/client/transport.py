"""What live and batch mode share on the way to the API (one code path for both):

* `request_args`: aiohttp's arguments for one request — the API's headers (the key among
  them) on the request only, and, through a proxy, the proxy's own credentials only. The
  API key is never a session default header: aiohttp copies a session's default headers
  into the head of every CONNECT it sends to an https proxy.
* `transport_error`: an exception met on the way (a proxy refusing the tunnel, a connect
  timeout, a reset, broken HTTP) as an `ApiError`, classified and worded the same in both
  modes, without the aiohttp exception whose request info holds the request's headers.
  The caller masks the key in it (`Redactor.error`) as for any other error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
from yarl import URL

from ..proxy import Proxy
from .errors import snippet
from .h1 import HttpProtocolError
from .pool import ConnectTimeout
from .types import ApiError

TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, HttpProtocolError)


def request_args(url: URL, proxy: Proxy | None, headers: Mapping[str, str]) -> dict[str, Any]:
    """`session.request(method, url, **request_args(...))`: `headers` to the API; through
    `proxy`, its URL and its credentials (in CONNECT's head for https, in the forwarded
    request the proxy consumes for http)."""
    out: dict[str, Any] = {"headers": dict(headers)}
    if proxy is None:
        return out
    out["proxy"] = proxy.url
    if proxy.authorization:
        auth = {"Proxy-Authorization": proxy.authorization}
        if url.scheme == "https":
            out["proxy_headers"] = auth
        else:
            out["headers"].update(auth)
    return out


def never_sent(exc: BaseException) -> bool:
    """Whether the request certainly never reached the API (no connection, or the proxy
    refused the tunnel); else it may have been received even with no response."""
    return isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError
                      | aiohttp.ClientHttpProxyError | ConnectTimeout)


def transport_error(exc: BaseException, *, proxy: Proxy | None, responded: bool,
                    connect_timeout: float | None, what: str = "") -> ApiError:
    """The `ApiError` of an exception met before or while reading a response (one of
    `TRANSPORT_ERRORS`): `unreachable` when no response came (refused tunnel, connect
    timeout, DNS, reset before the status line), `invalid_response` for broken HTTP,
    `connection` when the body was cut. `what` names the call (batch mode's "GET batches/x")."""
    pre = f"{what}: " if what else ""
    if isinstance(exc, aiohttp.ConnectionTimeoutError | ConnectTimeout):
        limit = f"{connect_timeout:g} s" if connect_timeout else "the connect timeout"
        return ApiError("unreachable", f"{pre}connect timeout: no connection within {limit}",
                        timeout_phase="connect")
    if isinstance(exc, aiohttp.ClientHttpProxyError):  # the proxy refused CONNECT
        where = proxy.display if proxy is not None else "the proxy"
        return ApiError("unreachable", f"{pre}{where} refused CONNECT: HTTP {exc.status} "
                        f"{snippet(exc.message or '', 120)}")
    if isinstance(exc, aiohttp.ClientResponseError | HttpProtocolError):
        text = exc.message if isinstance(exc, aiohttp.ClientResponseError) else str(exc)
        return ApiError("invalid_response",
                        f"{pre}malformed HTTP response: {snippet(text or type(exc).__name__)}")
    # No response at all says nothing about the request: the path to the API is down (DNS,
    # refused, TLS, a reset before the status line).
    where = "while reading the response body" if responded else "before a response"
    return ApiError("connection" if responded else "unreachable",
                    f"{pre}{type(exc).__name__} {where}: {snippet(str(exc), 200)}")
