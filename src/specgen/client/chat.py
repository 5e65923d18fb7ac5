"""`ChatClient`: thousands of concurrent chat requests, non-streamed over one shared aiohttp
session, streamed over keep-alive connections read in batches (`h1.py`, `ticker.py`).

The hot path is kept small: the body is encoded once with orjson, a stream is read in whole
socket buffers (one read per tick when batched) and split into events with bytes methods, only
`data:` lines are parsed, and timeouts cost one lazy timer per request (see `deadline.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp.http import SERVER_SOFTWARE
from yarl import URL

from specgen.proxy import Proxy, ProxyChooser

from .. import jsonexact
from .balancer import Balancer
from .deadline import Deadline
from .errors import Redactor, describe_error, error_from_response, snippet
from .h1 import HttpProtocolError
from .parse import StreamParser, parse_completion
from .pool import H1Pool
from .secrets import mask_metadata
from .ticker import ReadTicker
from .tokens import finish_token_answer, parse_token_completion, token_url
from .transport import TRANSPORT_ERRORS, request_args, transport_error
from .types import ApiError, ChatResponse

if TYPE_CHECKING:
    from specgen.config import EndpointConfig

log = logging.getLogger("specgen.client")

ERROR_BODY_CAP = 64 * 1024  # bytes of an error body kept for classification
MAX_BODY = 64 * 1024 * 1024  # a 200 body larger than this is refused as invalid_response
_FORBIDDEN_HEADERS = ("authorization", "x-openrouter-cache")


def _check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    out = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValueError(f"endpoint.headers: {name!r} must map to a string")
        if any(c in name + value for c in "\r\n\0") or not name.strip() or ":" in name:
            raise ValueError(f"endpoint.headers: {name!r} is not a valid header line")
        low = name.lower()
        if low in ("content-length", "transfer-encoding", "connection"):
            raise ValueError(f"endpoint.headers: {name} is set by the client, not the config")
        if low == "authorization":
            raise ValueError(
                "endpoint.headers must not carry Authorization: put the key in the environment "
                "variable named by endpoint.api_key_env"
            )
        if low.startswith("x-openrouter-cache"):
            raise ValueError(
                f"endpoint.headers: {name} turns on OpenRouter's response cache, which would "
                "replay identical answers into the training data; remove it"
            )
        out[name] = value
    return out


def _encode(body: dict[str, Any]) -> bytes:
    """The request body as sent (orjson, once); a body that is not JSON is `bad_request`."""
    try:
        return jsonexact.dumps(body)  # integers beyond 64 bits too
    except TypeError as exc:
        problem = str(exc)
    # raised outside the except block, so no exception chain holds the body
    raise ApiError("bad_request", f"request body is not JSON-serialisable: {problem}")


def raise_open_file_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards `wanted` (each request in flight is a socket).
    Returns the soft limit now in force; a no-op where the platform has no such limit."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            log.warning("could not raise the open-file limit from %d to %d", soft, target)
    return soft


class _Attempt:
    """What one request has got so far (the error handling reads it)."""

    __slots__ = ("first_byte_at", "healthy", "parser", "result", "status")

    def __init__(self) -> None:
        self.first_byte_at: float | None = None
        self.healthy: bool | None = None
        self.parser: StreamParser | None = None
        self.result: Any = None
        self.status: int | None = None


class ChatClient:
    """Async OpenAI-compatible `/chat/completions` client over several base URLs.

    Use as `async with ChatClient(...) as client: resp = await client.chat(body)`. Every failure
    is an `ApiError` with a `kind` (see `specgen.client.types`); the client never retries.
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        *,
        api_key_env: str | None = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        stream: bool = True,
        connect_timeout: float | None = 10.0,
        first_byte_timeout: float | None = 300.0,
        idle_timeout: float | None = 120.0,
        total_timeout: float | None = 3600.0,
        concurrency: int | None = None,
        limit: int = 0,
        limit_per_host: int = 0,
        keepalive_timeout: float = 30.0,
        failure_threshold: int = 3,
        cooldown: float = 5.0,
        max_cooldown: float = 60.0,
        max_body_bytes: int = MAX_BODY,
        proxy: str | bool | None = None,
        env: Mapping[str, str] | None = None,
        stream_tick: float | None = 0.2,
        max_answer_bytes: int | None = None,
    ):
        self._balancer = Balancer(
            [base_url] if isinstance(base_url, str) else list(base_url),
            failure_threshold=failure_threshold, cooldown=cooldown, max_cooldown=max_cooldown,
        )
        if api_key is None and api_key_env:
            api_key = os.environ.get(api_key_env)
        api_key = (api_key or "").strip() or None
        # None: HTTPS_PROXY / HTTP_PROXY / NO_PROXY (read once, here); a URL; False: direct
        self._proxies = ProxyChooser(proxy, env)
        self._redact = Redactor(api_key, self._proxies.secrets)
        self._headers: dict[str, str] = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **_check_headers(headers or {}),
        }
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.has_key = api_key is not None
        self.secrets = self._redact  # what the answer path's secret stage looks for
        self.stream = bool(stream)
        self.connect_timeout = connect_timeout
        self.first_byte_timeout = first_byte_timeout
        self.idle_timeout = idle_timeout
        self.total_timeout = total_timeout
        self._concurrency = concurrency
        self._limit = limit
        self._limit_per_host = limit_per_host
        self._keepalive = keepalive_timeout
        self._max_body = max_body_bytes
        self._max_answer = max_answer_bytes or None  # a stream's text is cut beyond this
        self._session: aiohttp.ClientSession | None = None
        # Streams are read by the batched reader (h1.py, ticker.py) unless the tick is off or
        # a setting only aiohttp supports is on (a connection cap).
        self.stream_tick = float(stream_tick or 0.0)
        self._batched = self.stream_tick > 0 and not (limit or limit_per_host)
        self._pool: H1Pool | None = None
        fixed = {"user-agent": ("User-Agent", SERVER_SOFTWARE),
                 "accept-encoding": ("Accept-Encoding", "identity")}
        fixed.update({k.lower(): (k, v) for k, v in self._headers.items()})
        self._h1_host = fixed.pop("host", (None, None))[1]  # a configured Host wins
        self._h1_headers = "".join(
            f"{k}: {v}\r\n" for k, v in fixed.values()).encode("latin-1") + b"\r\n"

    @classmethod
    def from_config(
        cls, cfg: EndpointConfig, *, base_urls: Sequence[str] | None = None, **overrides: Any
    ) -> ChatClient:
        """A client for `[endpoint]`. `base_urls` replaces the configured URLs (the engine
        passes the simulator's address when `base_url = "sim"`)."""
        urls = list(base_urls) if base_urls is not None else list(cfg.base_url)
        if urls == ["sim"]:
            raise ValueError(
                "base_url 'sim' names the built-in simulator: start it and pass its URL "
                "as base_urls"
            )
        headers = dict(cfg.headers)
        if cfg.return_token_ids:
            headers.setdefault("X-Specgen-Return-Token-Ids", "1")
        kwargs: dict[str, Any] = dict(
            api_key_env=cfg.api_key_env,
            headers=headers,
            stream=cfg.stream,
            connect_timeout=cfg.connect_timeout,
            first_byte_timeout=cfg.first_byte_timeout,
            idle_timeout=cfg.idle_timeout,
            total_timeout=cfg.total_timeout,
            concurrency=cfg.concurrency,
            stream_tick=cfg.stream_tick_ms / 1000,
            proxy=cfg.proxy,
            max_answer_bytes=cfg.max_answer_bytes,
        )
        kwargs.update(overrides)
        return cls(urls, **kwargs)

    def __repr__(self) -> str:
        urls = [ep.url for ep in self._balancer.endpoints]
        key = "set" if self.has_key else "none"
        return f"ChatClient(base_urls={urls!r}, stream={self.stream}, api_key={key})"

    def proxy_for(self, url: URL) -> Proxy | None:
        """The proxy `url` goes through (None: direct)."""
        return self._proxies.for_url(url.scheme, url.raw_host or "", url.port or 0)

    def describe_proxies(self) -> str:
        """One line for the log: which proxies, from where (credentials shown as ***)."""
        return self._proxies.describe()

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> ChatClient:
        if self._session is None:
            if self._concurrency:
                raise_open_file_limit(self._concurrency * 2 + 256)
            connector = aiohttp.TCPConnector(
                limit=self._limit,
                limit_per_host=self._limit_per_host,
                ttl_dns_cache=300,
                keepalive_timeout=self._keepalive,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,  # no default headers: they would go to proxies too
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=None, sock_read=None,
                    sock_connect=self.connect_timeout or None,
                ),
                trust_env=False,  # proxies are chosen by ProxyChooser, once per URL
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            if self._batched:
                loop = asyncio.get_running_loop()
                self._pool = H1Pool(loop, ReadTicker(loop, self.stream_tick),
                                    connect_timeout=self.connect_timeout,
                                    keepalive_timeout=self._keepalive)
        return self

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> ChatClient:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- introspection -----------------------------------------------------------------------

    @property
    def base_urls(self) -> list[str]:
        return [ep.url for ep in self._balancer.endpoints]

    def in_flight(self) -> dict[str, int]:
        """Requests in flight per base URL."""
        return self._balancer.in_flight()

    def endpoint_stats(self) -> list[dict[str, Any]]:
        """Per base URL: in flight, requests, ok, connection errors, cooldown state."""
        return self._balancer.stats()

    # -- requests ----------------------------------------------------------------------------

    async def chat(self, body: dict[str, Any]) -> ChatResponse:
        """POST `body` to `/chat/completions`; the answer, or an `ApiError` with a class.

        Streams when `body["stream"]` is true; a body without `stream` gets the client's
        default (and `stream_options.include_usage` when streaming)."""
        stream = body.get("stream")
        if stream is None:
            stream = self.stream
            body = {**body, "stream": stream}
            if stream and "stream_options" not in body:
                body["stream_options"] = {"include_usage": True}
        return await self._call("POST", None, _encode(body), bool(stream))

    async def complete_tokens(self, body: dict[str, Any], api: str = "vllm") -> ChatResponse:
        """POST a token-in body (`specgen.request.build_token_request`) to vLLM's
        `/completions` or SGLang's `/generate`; the answer holds the sampled ids (and no
        text fields), or an `ApiError` classified as for chat."""
        return await self._call("POST", None, _encode(body), bool(body.get("stream")),
                                token_api=api)

    async def get_json(self, path: str) -> Any:
        """GET `<base_url>/<path>` and return its JSON, e.g. `models/{author}/{slug}/endpoints`
        or `key` (OpenRouter). Errors are classified like chat errors."""
        return await self._call("GET", path, None, False)

    async def _call(self, method: str, path: str | None, payload: bytes | None,
                    stream: bool, token_api: str | None = None) -> Any:
        session = self._session
        if session is None:
            raise RuntimeError("ChatClient is not open: use 'async with ChatClient(...)'")
        ep = self._balancer.acquire()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        started = time.time()
        deadline = Deadline(loop, task, first_byte=self.first_byte_timeout,
                            idle=self.idle_timeout, total=self.total_timeout)
        att = _Attempt()
        try:
            try:
                if token_api is not None:
                    url = URL(token_url(ep.url, token_api))
                else:
                    url = ep.chat_url if path is None else ep.url_for(path)
                if stream and path is None and self._pool is not None:
                    await self._exchange_h1(att, method, url, payload, token_api, deadline)
                else:
                    await self._exchange(session, att, method, url, payload, path, stream,
                                         token_api, deadline)
            except asyncio.CancelledError:
                if deadline.fired is None or task.uncancel() > 0:
                    raise  # cancelled from outside: not ours to turn into an error
                parser = att.parser
                if att.result is None:
                    if parser is not None and parser.failed:
                        raise parser.failure() from None
                    raise ApiError(
                        "timeout", deadline.describe(), timeout_phase=deadline.fired,
                        usage=parser.usage if parser is not None else None,
                    ) from None
                # else: the answer was complete when the timer fired; keep it
            except TRANSPORT_ERRORS as exc:
                parser = att.parser
                if (parser is not None and parser.failed
                        and not isinstance(exc, aiohttp.ClientResponseError | HttpProtocolError)):
                    raise parser.failure() from None
                err = transport_error(exc, proxy=self.proxy_for(url),
                                      responded=att.first_byte_at is not None,
                                      connect_timeout=self.connect_timeout)
                if err.kind != "invalid_response":
                    att.healthy = False
                    err.usage = (parser.usage if parser is not None else None) or {}
                raise err from None
        except ApiError as err:
            # Drop the aiohttp exception this replaced: its request info holds the headers.
            err.__context__ = None
            err.__cause__ = None
            err.base_url = ep.url
            if err.status is None:
                err.status = att.status
            err.started_at = started
            err.first_byte_at = att.first_byte_at
            err.ended_at = time.time()
            parser = att.parser
            if parser is not None:
                err.provider = err.provider or parser.provider
                err.model = parser.model
                err.generation_id = parser.id
            self._redact.error(err)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s %s failed: %s", method, ep.url, err)
            raise
        finally:
            deadline.cancel()
            self._balancer.release(ep, att.healthy)
        result = att.result
        if path is not None:
            return self._redact.obj(result)
        result.base_url = ep.url
        result.started_at = started
        result.first_byte_at = att.first_byte_at
        result.ended_at = time.time()
        first = att.parser.first_output_at if att.parser is not None else None
        result.first_token_at = first or result.ended_at
        mask_metadata(result, self._redact)  # the text is the secret stage's (never rewritten)
        return result

    async def _exchange(self, session: aiohttp.ClientSession, att: _Attempt, method: str,
                        url: URL, payload: bytes | None, path: str | None, stream: bool,
                        token_api: str | None, deadline: Deadline) -> None:
        """One request through aiohttp (non-stream bodies, GETs, and streams when the batched
        reader is off)."""
        extra = request_args(url, self.proxy_for(url), self._headers)
        async with session.request(method, url, data=payload, allow_redirects=False,
                                   **extra) as resp:
            att.first_byte_at = time.time()
            deadline.got_headers()
            status = att.status = resp.status
            att.healthy = True
            if not 200 <= status < 300:
                body, truncated = await self._read(resp, deadline, ERROR_BODY_CAP, True)
                raise error_from_response(status, resp.headers, body, truncated=truncated,
                                          redact=self._redact)
            if path is not None:
                att.result = self._parse_json((await self._read(resp, deadline))[0])
                return
            ctype = resp.content_type
            if ctype == "text/event-stream" or (stream and ctype != "application/json"):
                parser = att.parser = StreamParser(self._max_answer)
                await self._read_stream(resp, deadline, parser)
                result = parser.finish()
                if token_api is not None:
                    result = finish_token_answer(result)
            elif token_api is not None:
                result = parse_token_completion(
                    (await self._read(resp, deadline))[0], token_api)
            else:
                result = parse_completion((await self._read(resp, deadline))[0])
            result.http_status = status
            result.cache_status = resp.headers.get("X-OpenRouter-Cache-Status")
            if result.id is None:
                result.id = resp.headers.get("X-Generation-Id")
            att.result = result

    async def _exchange_h1(self, att: _Attempt, method: str, url: URL, payload: bytes | None,
                           token_api: str | None, deadline: Deadline) -> None:
        """One streamed request on the batched reader (`h1.py`): SSE events are parsed as
        the ticker reads them; this task wakes for the headers and for the end."""
        pool = self._pool
        assert pool is not None and url.raw_host is not None
        origin = (url.scheme, url.raw_host, url.port or 0)
        proxy = self.proxy_for(url)
        conn = await pool.acquire(origin, proxy)
        clean = False
        try:
            conn.start(self._h1_request(method, url, payload or b"",
                                        proxy if conn.via_proxy else None), deadline)
            resp = await conn.head  # type: ignore[misc]
            att.first_byte_at = time.time()
            deadline.got_headers()
            status = att.status = resp.status
            att.healthy = True
            if not 200 <= status < 300:
                conn.read_all(ERROR_BODY_CAP)
                await conn.end  # type: ignore[misc]
                body = b"".join(conn.body)
                raise error_from_response(status, resp.headers, body[:ERROR_BODY_CAP],
                                          truncated=conn.truncated, redact=self._redact)
            ctype = resp.content_type
            if ctype != "application/json":
                parser = att.parser = StreamParser(self._max_answer)
                conn.read_sse(parser)
                await conn.end  # type: ignore[misc]
                result = parser.finish()
                if token_api is not None:
                    result = finish_token_answer(result)
            else:
                conn.read_all(self._max_body)
                await conn.end  # type: ignore[misc]
                if conn.truncated:
                    raise ApiError("invalid_response", "response body larger than "
                                   f"{self._max_body // (1024 * 1024)} MiB")
                body = b"".join(conn.body)
                result = (parse_token_completion(body, token_api) if token_api is not None
                          else parse_completion(body))
            result.http_status = status
            result.cache_status = resp.headers.get("X-OpenRouter-Cache-Status")
            if result.id is None:
                result.id = resp.headers.get("X-Generation-Id")
            att.result = result
            clean = True
        finally:
            if clean:
                pool.release(conn, origin)
            else:
                conn.abort()

    def _h1_request(self, method: str, url: URL, payload: bytes,
                    proxy: Proxy | None = None) -> bytes:
        """The request's bytes; through an http proxy (no tunnel) the request line names the
        absolute URL and the proxy's credentials go in `Proxy-Authorization`."""
        authority = url.raw_host or ""
        if ":" in authority:
            authority = f"[{authority}]"
        if not url.is_default_port():
            authority = f"{authority}:{url.port}"
        host = self._h1_host if self._h1_host is not None else authority
        target = url.raw_path_qs
        auth = ""
        if proxy is not None:
            target = f"{url.scheme}://{authority}{target}"
            if proxy.authorization:
                auth = f"Proxy-Authorization: {proxy.authorization}\r\n"
        head = (f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{auth}"
                f"Content-Length: {len(payload)}\r\n").encode("latin-1")
        return head + self._h1_headers + payload

    async def _read(self, resp: aiohttp.ClientResponse, deadline: Deadline,
                    cap: int | None = None, truncate: bool = False) -> tuple[bytes, bool]:
        """The whole body (stamping activity for the idle timeout). Over `cap` bytes: cut
        there when `truncate` (error bodies), else `invalid_response`."""
        cap = self._max_body if cap is None else cap
        content = resp.content
        now = deadline._loop.time
        chunks: list[bytes] = []
        size = 0
        while True:
            block = await content.readany()
            if not block:
                break
            deadline.last = now()
            chunks.append(block)
            size += len(block)
            if size > cap:
                if truncate:
                    return b"".join(chunks)[:cap], True
                raise ApiError("invalid_response",
                               f"response body larger than {cap // (1024 * 1024)} MiB")
        if len(chunks) == 1:
            return chunks[0], False
        return b"".join(chunks), False

    async def _read_stream(self, resp: aiohttp.ClientResponse, deadline: Deadline,
                           parser: StreamParser) -> None:
        """Feed the body to `parser` (which notes when the model's output began)."""
        content = resp.content
        now = deadline._loop.time
        feed = parser.feed
        while True:
            block = await content.readany()
            if not block:
                return
            deadline.last = now()
            feed(block)
            if parser.done:
                return

    @staticmethod
    def _parse_json(data: bytes) -> Any:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ApiError("invalid_response",
                           f"response body is not valid JSON: {snippet(data, 120)}") from None
        if isinstance(obj, dict) and obj.get("error") and "data" not in obj:
            message, provider = describe_error(obj["error"])
            raise ApiError("error_in_body", message, provider=provider, body=obj["error"])
        return obj
