"""The Batch APIs over HTTP (docs/batch.md): submit a batch (OpenAI-style: upload a JSONL
file, then create the batch; OpenRouter: one POST with the lines inline), read it, list
batches, cancel, and stream its results line by line (OpenAI-style: the output and error
files, read in chunks; OpenRouter: the cursor-paginated results pages).

Every failure is an `ApiError` classified as for chat (`errors.error_from_response`, and
`transport.transport_error` for a proxy refusing the tunnel, a reset, a timeout: the code
live mode uses); a connection that cannot be made is `unreachable`. The API key travels only
in the Authorization header of each request (never a session default, which aiohttp would
copy to a proxy's CONNECT), a proxy gets its own credentials only (`transport.request_args`),
and the key is masked in every message. Batch and file ids from the provider are quoted in
URLs (an id with "/" names one object, not a path).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from yarl import URL

from ..proxy import ProxyChooser
from .errors import Redactor, error_from_response, snippet
from .secrets import mask_metadata
from .transport import TRANSPORT_ERRORS, never_sent, request_args, transport_error
from .types import ApiError, ChatResponse

READ_CHUNK = 1 << 20
MAX_RESULT_PAGES = 100_000  # an OpenRouter results listing longer than this is not believed


def _id(value: str) -> str:
    """A provider's id as one URL path segment."""
    return quote(value, safe="")


class BatchHttp:
    """`async with BatchHttp(base_url, ...) as api:` — one aiohttp session for the batch calls."""

    def __init__(self, base_url: str, *, api_key_env: str | None = None,
                 api_key: str | None = None, headers: Mapping[str, str] | None = None,
                 connect_timeout: float = 10.0, timeout: float = 600.0,
                 files_path: str = "files", batches_path: str = "batches",
                 purpose: str = "batch", proxy: str | bool | None = None,
                 api: str = "openai", completion_window: str = "24h"):
        self.base_url = base_url.rstrip("/")
        self.api, self.window = api, completion_window
        self.files, self.batches, self.purpose = files_path, batches_path, purpose
        if api_key is None and api_key_env:
            api_key = os.environ.get(api_key_env)
        api_key = (api_key or "").strip() or None
        # endpoint.proxy as for chat: None = the environment's, a URL, False = direct
        self._proxies = ProxyChooser(proxy)
        self._redact = Redactor(api_key, self._proxies.secrets)
        self._headers = dict(headers or {})
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"BatchHttp({self.base_url!r})"

    def mask_metadata(self, resp: ChatResponse) -> None:
        """Mask the key and proxy credentials in a result line's metadata, as the live client
        masks every answer's before it is handed over (`secrets.mask_metadata`)."""
        mask_metadata(resp, self._redact)

    async def __aenter__(self) -> BatchHttp:
        # no default headers (see transport.py); a new connection per call: batch calls are
        # seconds apart, and a kept-alive one closed meanwhile by the server or a proxy
        # would fail a create call in a way that cannot tell whether the batch was made
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True),
            cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout,
                                          sock_read=self._timeout))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    # -- the calls ------------------------------------------------------------------------
    async def submit(self, payload: bytes, *, name: str, metadata: dict[str, str],
                     on_file: Any = None) -> dict[str, Any]:
        """Submit a batch (`batch_shape.submission`'s bytes): the provider's batch object.
        OpenAI-style, the file is uploaded first (`on_file(file_id)` is told its id)."""
        if self.api == "openrouter":
            return _batch(await self._json("POST", self.batches, payload=payload))
        fid = await self.upload(payload, filename=f"{name}.jsonl")
        if on_file is not None:
            on_file(fid)
        return await self.create(fid, self.window, metadata)

    async def results(self, batch: dict[str, Any]) -> AsyncIterator[bytes | dict[str, Any]]:
        """A finished batch's result lines (`{custom_id, response, error}`), as bytes or as
        parsed items, never all held at once."""
        if self.api == "openrouter":
            cursor, seen = None, set()
            for _ in range(MAX_RESULT_PAGES):
                path = f"{self.batches}/{_id(batch['id'])}/results?limit=100" + (
                    f"&cursor={quote(cursor, safe='')}" if cursor else "")
                page = await self._json("GET", path)
                data = page.get("data") if isinstance(page, dict) else None
                if not isinstance(data, list):
                    raise ApiError("invalid_response",
                                   f"batch results page has no data: {snippet(str(page))}")
                for item in data:
                    if isinstance(item, dict):
                        yield item
                cursor = page.get("next_cursor")
                if not page.get("has_more") or not isinstance(cursor, str) or not data:
                    return
                if cursor in seen:  # the same page again and again: never an end
                    raise ApiError("invalid_response", "the batch's results cursor does not "
                                   f"advance (cursor {snippet(cursor, 60)!r} came back)")
                seen.add(cursor)
            raise ApiError("invalid_response", f"the batch's results run past "
                           f"{MAX_RESULT_PAGES:,} pages")
        for fid in (batch.get("output_file_id"), batch.get("error_file_id")):
            if fid:
                async for line in self.lines(fid):
                    yield line

    async def upload(self, data: bytes, filename: str = "batch.jsonl") -> str:
        """POST /files (purpose=batch by default): the file's id."""
        form = aiohttp.FormData()
        form.add_field("purpose", self.purpose)
        form.add_field("file", data, filename=filename, content_type="application/jsonl")
        obj = await self._json("POST", self.files, data=form)
        fid = obj.get("id") if isinstance(obj, dict) else None
        if not isinstance(fid, str):
            raise ApiError("invalid_response", f"file upload answered no id: {snippet(str(obj))}")
        return fid

    async def create(self, input_file_id: str, completion_window: str,
                     metadata: dict[str, str]) -> dict[str, Any]:
        obj = await self._json("POST", self.batches, body={
            "input_file_id": input_file_id, "endpoint": "/v1/chat/completions",
            "completion_window": completion_window, "metadata": metadata})
        return _batch(obj)

    async def get(self, batch_id: str) -> dict[str, Any]:
        return _batch(await self._json("GET", f"{self.batches}/{_id(batch_id)}"))

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return _batch(await self._json("POST", f"{self.batches}/{_id(batch_id)}/cancel", body={}))

    async def list(self, *, pages: int = 50) -> AsyncIterator[dict[str, Any]]:
        """The account's batches, newest first (at most `pages` pages of 100)."""
        after = None
        for _ in range(pages):
            path = f"{self.batches}?limit=100" + (f"&after={quote(str(after), safe='')}" if after else "")
            obj = await self._json("GET", path)
            data = obj.get("data") if isinstance(obj, dict) else None
            if not isinstance(data, list):
                raise ApiError("invalid_response", "the batch list has no data")
            for b in data:
                if isinstance(b, dict):
                    yield b
            if not obj.get("has_more") or not data:
                return
            after = obj.get("last_id") or data[-1].get("id")

    async def lines(self, file_id: str) -> AsyncIterator[bytes]:
        """The lines of a file's content, read in chunks (a result file can be hundreds of
        MB: never held whole)."""
        session = self._require()
        url = f"{self.base_url}/{self.files}/{_id(file_id)}/content"
        what = f"reading batch file {snippet(file_id, 80)}"
        responded = False
        try:
            async with session.get(url, **self._args(url)) as resp:
                responded = True
                if resp.status != 200:
                    raise self._redact.error(error_from_response(
                        resp.status, resp.headers, await resp.content.read(65536),
                        redact=self._redact))
                # one buffer, appended to and cut from the front: a line of hundreds of MB
                # is never copied once per chunk
                buf = bytearray()
                async for chunk in resp.content.iter_chunked(READ_CHUNK):
                    scan = len(buf)
                    buf += chunk
                    start = 0
                    end = buf.find(b"\n", scan)
                    while end >= 0:
                        line = bytes(buf[start:end])
                        if line.strip():
                            yield line
                        start = end + 1
                        end = buf.find(b"\n", start)
                    if start:
                        del buf[:start]
                if bytes(buf).strip():
                    yield bytes(buf)
        except TRANSPORT_ERRORS as exc:
            raise self._error(exc, responded, what) from None
    # -- plumbing -------------------------------------------------------------------------
    def _args(self, url: str) -> dict[str, Any]:
        """aiohttp's arguments for `url`: the API's headers, and the proxy it goes through
        with the proxy's own credentials (`transport.request_args`, as live mode)."""
        u = URL(url)
        return request_args(u, self._proxies.for_url(u.scheme, u.raw_host or "", u.port or 0),
                            self._headers)

    def _error(self, exc: BaseException, responded: bool, what: str) -> ApiError:
        u = URL(self.base_url)
        proxy = self._proxies.for_url(u.scheme, u.raw_host or "", u.port or 0)
        err = transport_error(exc, proxy=proxy, responded=responded,
                              connect_timeout=self._connect_timeout, what=what)
        if err.kind == "unreachable" and not never_sent(exc):
            # a batch call that may have reached the API: the driver looks before resending
            err.kind = "timeout" if isinstance(exc, TimeoutError) else "connection"
        return self._redact.error(err)

    def _require(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("BatchHttp is not open: use 'async with BatchHttp(...)'")
        return self._session

    async def _json(self, method: str, path: str, *, body: Any = None, data: Any = None,
                    payload: bytes | None = None) -> Any:
        session = self._require()
        url = f"{self.base_url}/{path}"
        kwargs: dict[str, Any] = self._args(url)
        if body is not None or payload is not None:
            kwargs["data"] = orjson.dumps(body) if payload is None else payload
            kwargs["headers"]["Content-Type"] = "application/json"
        elif data is not None:
            kwargs["data"] = data
        responded = False
        try:
            async with session.request(method, url, **kwargs) as resp:
                responded = True
                raw = await resp.read()
                if resp.status >= 300:
                    raise self._redact.error(error_from_response(
                        resp.status, resp.headers, raw, redact=self._redact))
        except TRANSPORT_ERRORS as exc:
            raise self._error(exc, responded, f"{method} {snippet(path, 120)}") from None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ApiError("invalid_response",
                           f"{method} {path}: not JSON: {snippet(raw, 120)}") from None


def _batch(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        raise ApiError("invalid_response", f"not a batch object: {snippet(str(obj), 200)}")
    return obj
