"""A small HTTP/1.1 server on asyncio: what the simulator speaks, at a fraction of a
framework's cost per request (a request is parsed and answered in a few microseconds of
Python, with no task, no header multidict and no response object).

`serve(handler, host, port)` listens; each connection parses requests (`Content-Length` or
chunked bodies, `Expect: 100-continue`, keep-alive, pipelined requests answered one at a time,
in order) and calls `handler(request)`. The handler answers through the `Request`, at once or
later: `respond()` for a whole response; `start_stream()`, `write()`, `drain()`,
`end_stream()` for a chunked one (SSE); `write_raw()` and `reset()` to break a response off
with a TCP reset. If the client goes away before the answer, `request.on_lost()` is called.
Malformed requests get a 400 and the connection is closed.

Outages (`HttpServer.stop_listening()` / `start_listening()`, `HttpServer.resetting`): the
listening socket can be closed and reopened on the same port, and while `resetting` is set
every new connection, and every new request on an open one, is reset before any byte.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any

log = logging.getLogger("specgen.sim")

MAX_HEAD = 64 * 1024  # request line + headers
MAX_BODY = 256 * 1024 * 1024
_PAUSE_BUFFERED = 4 * 1024 * 1024  # stop reading a pipelining client beyond this much
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


class _Date:
    """The Date header, formatted once a second."""

    second = -1
    value = b""

    @classmethod
    def get(cls) -> bytes:
        now = int(time.time())
        if now != cls.second:
            cls.second = now
            cls.value = formatdate(now, usegmt=True).encode()
        return cls.value


def _head(status: int, headers: dict[str, str] | None, extra: bytes) -> bytes:
    out = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown")), extra,
           b"Date: " + _Date.get() + b"\r\n"]
    if headers:
        for k, v in headers.items():
            out.append(f"{k}: {v}\r\n".encode("latin-1"))
    out.append(b"\r\n")
    return b"".join(out)


class Request:
    """One HTTP request. `headers` has lower-case names; `body` is the whole body."""

    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "on_lost",
                 "_conn", "_state")

    def __init__(self, conn: HttpConnection, method: str, path: str, query: str,
                 headers: dict[str, str], body: bytes, keep_alive: bool):
        self._conn = conn
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.on_lost: Callable[[], None] | None = None
        self._state = 0  # 0 new, 1 streaming, 2 answered

    @property
    def closed(self) -> bool:
        """True once the client's connection is gone."""
        return self._conn.closed

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._conn.transport

    def respond(self, status: int, body: bytes, content_type: str = "application/json",
                headers: dict[str, str] | None = None) -> None:
        """Send a whole response (ignored once the connection is gone)."""
        if self._state:
            raise RuntimeError("response already started")
        self._state = 2
        conn = self._conn
        if not conn.closed:
            close = b"" if self.keep_alive else b"Connection: close\r\n"
            if status == 200 and not headers and content_type == "application/json":
                head = b"".join((b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: ", b"%d" % len(body), b"\r\n", close,
                                 b"Date: ", _Date.get(), b"\r\n\r\n"))
            else:
                head = _head(status, headers, b"Content-Type: %s\r\nContent-Length: %d\r\n%s" % (
                    content_type.encode("latin-1"), len(body), close))
            conn.transport.write(head + body)
        conn.answered(self)

    def start_stream(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        """Send the head of a chunked response; then `write()` chunks and `end_stream()`."""
        if self._state:
            raise RuntimeError("response already started")
        self._state = 1
        close = b"" if self.keep_alive else b"Connection: close\r\n"
        if not self._conn.closed:
            self._conn.transport.write(_head(status, headers,
                                             b"Transfer-Encoding: chunked\r\n" + close))

    def write(self, data: bytes) -> None:
        """One chunk of a stream (nothing for empty data)."""
        if data and not self._conn.closed:
            self._conn.transport.write(b"%x\r\n%s\r\n" % (len(data), data))

    async def drain(self) -> None:
        """Wait while the client reads slower than we write; raises once it is gone."""
        await self._conn.drain()

    def end_stream(self) -> None:
        """The last chunk of a stream."""
        if self._state != 1:
            raise RuntimeError("no stream started")
        self._state = 2
        conn = self._conn
        if not conn.closed:
            conn.transport.write(b"0\r\n\r\n")
        conn.answered(self)

    def write_raw(self, data: bytes) -> None:
        """Bytes straight onto the connection (for a response broken off on purpose)."""
        self._state = max(self._state, 1)
        if not self._conn.closed:
            self._conn.transport.write(data)

    def reset(self) -> None:
        """Reset the TCP connection (RST, not FIN): SO_LINGER 0, then abort."""
        self._state = 2
        self.on_lost = None
        self._conn.reset()


class _Gate:
    """What a connection asks its server: whether to reset new requests (an outage)."""

    resetting = False
    draining = False


_OPEN = _Gate()


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests and hands them to the handler in order."""

    def __init__(self, handler: Callable[[Request], Any], connections: set[HttpConnection],
                 gate: Any = None):
        self.handler = handler
        self.connections = connections
        self._gate = gate if gate is not None else _OPEN
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.current: Request | None = None
        self._parts: list[bytes] = []  # received bytes not parsed yet
        self._size = 0
        self._need = 0  # bytes needed before parsing again is worth it
        self._continued = False  # sent 100 Continue for the request being received
        self._in_loop = False
        self._read_paused = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.connections.add(self)
        if self._gate.resetting:
            self.abort_reset()
        elif self._gate.draining:  # accepted just before a graceful stop: idle, closed
            self.close_when_done()

    def data_received(self, data: bytes) -> None:
        if self._parts or self.current is not None:
            self._parts.append(data)
            self._size += len(data)
            if self.current is not None:
                if self._size > _PAUSE_BUFFERED and not self._read_paused:
                    self._read_paused = True
                    self.transport.pause_reading()
                return
            if self._size < self._need:
                return
            data = b"".join(self._parts)
            self._parts = []
            self._size = 0
        self._process(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.connections.discard(self)
        self._parts = []
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("connection lost"))
        req = self.current
        self.current = None
        if req is not None and req.on_lost is not None:
            on_lost, req.on_lost = req.on_lost, None
            try:
                on_lost()
            except Exception:  # noqa: BLE001 - one request's bug must not kill the server
                log.exception("error while cancelling a request")

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self) -> None:
        if self.closed:
            raise ConnectionResetError("connection lost")
        if self._write_paused:
            self._drain_waiter = asyncio.get_running_loop().create_future()
            try:
                await self._drain_waiter
            finally:
                self._drain_waiter = None

    # -- requests ---------------------------------------------------------------------------
    def _process(self, data: bytes) -> None:
        """Parse and dispatch the requests in `data`; keep what is incomplete."""
        self._in_loop = True
        try:
            while data and self.current is None and not self.closed:
                got = self._parse(data)
                if got is None:
                    return
                req, data = got
                self.current = req
                self._continued = False
                try:
                    self.handler(req)
                except Exception:  # noqa: BLE001 - answered with a 500, logged
                    log.exception("error in %s %s", req.method, req.path)
                    if req._state == 0 and self.current is req:
                        req.on_lost = None
                        req.keep_alive = False
                        req.respond(500, b'{"error":{"code":500,"message":"Internal Server '
                                         b'Error"}}')
            if data and not self.closed:
                self._parts = [data]
                self._size = len(data)
                self._need = 0
        finally:
            self._in_loop = False

    def answered(self, req: Request) -> None:
        """The response to `req` is out: close, or go on with the next request."""
        if self.current is not req:
            return
        self.current = None
        req.on_lost = None
        if self.closed:
            return
        if not req.keep_alive:
            self.transport.close()
            self.closed = True
            return
        if self._read_paused:
            self._read_paused = False
            self.transport.resume_reading()
        if self._parts and not self._in_loop:
            data = b"".join(self._parts)
            self._parts = []
            self._size = 0
            self._process(data)

    def _parse(self, data: bytes) -> tuple[Request, bytes] | None:
        """One request from the start of `data` and what follows it, or None (incomplete
        data is kept; a bad request is answered with 400 and closes the connection)."""
        end = data.find(b"\r\n\r\n")
        if end < 0:
            if len(data) > MAX_HEAD:
                self._bad(431, "request head too large")
                return None
            self._wait(data, len(data) + 1)
            return None
        try:
            head = data[:end].decode("latin-1")
            first, _, fields = head.partition("\r\n")
            request_line = first.split(" ")
            if len(request_line) != 3:
                raise ValueError(f"bad request line {first[:60]!r}")
            method, target, version = request_line
            if not version.startswith("HTTP/1."):
                raise ValueError(f"unsupported version {version[:20]!r}")
            headers: dict[str, str] = {}
            for line in fields.split("\r\n") if fields else ():
                name, sep, value = line.partition(":")
                if not sep or not name or name[-1] in " \t" or " " in name:
                    raise ValueError(f"bad header line {line[:60]!r}")
                name = name.lower()
                value = value.strip(" \t")
                if name in headers:
                    if name == "content-length" and headers[name] != value:
                        raise ValueError("conflicting Content-Length")
                    value = headers[name] + ", " + value
                headers[name] = value
        except ValueError as exc:
            self._bad(400, str(exc) or "bad request line")
            return None
        start = end + 4
        chunked = "transfer-encoding" in headers
        if chunked:
            if headers["transfer-encoding"].lower() != "chunked":
                self._bad(501, "unsupported Transfer-Encoding")
                return None
            try:
                got = _dechunk(data, start)
            except ValueError as exc:
                self._bad(400, str(exc))
                return None
            if got is None:
                self._wait_body(data, headers, len(data) + 1)
                return None
            body, stop = got
        else:
            length = headers.get("content-length")
            if length is None:
                n = 0
            elif length.isdigit():
                n = int(length)
            else:
                self._bad(400, "bad Content-Length")
                return None
            if n > MAX_BODY:
                self._bad(413, "request body too large")
                return None
            stop = start + n
            if len(data) < stop:
                self._wait_body(data, headers, stop)
                return None
            body = data[start:stop]
        if target[:1] != "/":
            scheme, sep, rest = target.partition("://")  # absolute form
            target = "/" + rest.partition("/")[2] if sep else target
        path, _, query = target.partition("?")
        conn = headers.get("connection", "").lower()
        keep = "close" not in conn if version == "HTTP/1.1" else "keep-alive" in conn
        return Request(self, method, path, query, headers, body, keep), data[stop:]

    def _wait(self, data: bytes, need: int) -> None:
        self._parts = [data]
        self._size = len(data)
        self._need = need

    def _wait_body(self, data: bytes, headers: dict[str, str], need: int) -> None:
        if not self._continued and headers.get("expect", "").lower() == "100-continue":
            self._continued = True
            self.transport.write(_CONTINUE)
        self._wait(data, need)

    def _bad(self, status: int, message: str) -> None:
        body = json.dumps({"error": {"code": status, "message": message}}).encode()
        self.transport.write(_head(status, None, b"Content-Type: application/json\r\n"
                                   b"Content-Length: %d\r\nConnection: close\r\n" % len(body))
                             + body)
        self.transport.close()
        self.closed = True

    def reset(self) -> None:
        """Reset the connection on purpose: the current request was already answered for."""
        transport = self.transport
        if transport is None or self.closed:
            return
        _linger0(transport)
        self.current = None
        transport.abort()

    def resetting(self, on: bool) -> None:
        """During a `reset` outage every new request resets the connection instead of being
        answered (an instance attribute shadows `_process`: no check per request)."""
        if on:
            self._process = self._reset_instead  # type: ignore[method-assign]
        else:
            self.__dict__.pop("_process", None)

    def _reset_instead(self, data: bytes) -> None:
        self.abort_reset()

    def close_when_done(self) -> None:
        """Close the connection (FIN) once the answer in progress is out, at once if idle;
        requests pipelined behind it are not read."""
        transport = self.transport
        if transport is None or self.closed:
            return
        self._parts = []
        self._size = 0
        if self.current is None:
            transport.close()
            self.closed = True
        else:
            self.current.keep_alive = False  # `answered` closes it

    def abort_reset(self) -> None:
        """Reset the connection from outside (an outage): the request being answered, if any,
        is lost (`on_lost`), as if the client had gone."""
        transport = self.transport
        if transport is None or self.closed:
            return
        self._parts = []
        self._size = 0
        _linger0(transport)
        transport.abort()


def _linger0(transport: asyncio.BaseTransport) -> None:
    """SO_LINGER 0: closing the socket then sends RST, not FIN."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass


def _dechunk(data: bytes, pos: int) -> tuple[bytes, int] | None:
    """A chunked body starting at data[pos]: (body, end), or None when incomplete."""
    parts = []
    total = 0
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            if len(data) - pos > 1024:
                raise ValueError("bad chunk size line")
            return None
        size_text = data[pos:eol].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ValueError("bad chunk size") from None
        if size < 0:
            raise ValueError("bad chunk size")
        pos = eol + 2
        if size == 0:
            break
        total += size
        if total > MAX_BODY:
            raise ValueError("request body too large")
        if len(data) < pos + size + 2:
            return None
        parts.append(data[pos:pos + size])
        if data[pos + size:pos + size + 2] != b"\r\n":
            raise ValueError("bad chunk end")
        pos += size + 2
    while True:  # trailer lines up to an empty one
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return None
        if eol == pos:
            return b"".join(parts), pos + 2
        pos = eol + 2


class HttpServer:
    """A listening socket and its open connections. The socket can be closed and reopened on
    the same port (`stop_listening` / `start_listening`, for outages); while `resetting` is
    set, new connections and new requests on open ones are reset."""

    def __init__(self, handler: Callable[[Request], Any], host: str):
        self.handler = handler
        self.host = host
        self.connections: set[HttpConnection] = set()
        self.server: asyncio.Server | None = None
        self._resetting = False
        self.draining = False  # stopped gracefully: connections made late close at once
        self._port = 0
        self._closed = False
        self._reopen: asyncio.Future | None = None

    def _protocol(self) -> HttpConnection:
        return HttpConnection(self.handler, self.connections, self)

    @property
    def port(self) -> int:
        """The port (the same across outages, also while not listening)."""
        return self._port

    @property
    def resetting(self) -> bool:
        return self._resetting

    @resetting.setter
    def resetting(self, on: bool) -> None:
        self._resetting = on = bool(on)
        for conn in list(self.connections):
            conn.resetting(on)

    @property
    def listening(self) -> bool:
        return self.server is not None and not self._closed

    async def _listen(self, port: int) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(self._protocol, self.host, port, backlog=4096,
                                               reuse_address=True)
        self._port = int(self.server.sockets[0].getsockname()[1])

    def stop_listening(self, graceful: bool = False) -> None:
        """Close the listening socket (new connections are refused) and reset every open
        connection (their requests are lost) — or, `graceful`, close each once its answer in
        progress is out (idle ones at once)."""
        server, self.server = self.server, None
        if server is not None:
            server.close()
        self.draining = graceful
        for conn in list(self.connections):
            if graceful:
                conn.close_when_done()
            else:
                conn.abort_reset()

    async def start_listening(self, retry_s: float = 0.05) -> None:
        """Listen again on the same host and port (retried while the port is busy)."""
        if self.server is not None or self._closed:
            return
        self.draining = False
        if self._reopen is None or self._reopen.done():
            # Shielded: a cancelled caller must not leave a socket listening that nobody owns.
            self._reopen = asyncio.ensure_future(self._relisten(retry_s))
        await asyncio.shield(self._reopen)

    async def _relisten(self, retry_s: float) -> None:
        warned = False
        while not self._closed and self.server is None:
            try:
                await self._listen(self._port)
            except OSError as exc:
                if not warned:
                    log.warning("cannot listen again on %s:%d (%s); retrying", self.host,
                                self._port, exc.strerror)
                    warned = True
                await asyncio.sleep(retry_s)
        if self._closed and self.server is not None:
            self.server.close()

    async def close(self) -> None:
        """Stop listening and drop every open connection (their requests are cancelled)."""
        self._closed = True
        if self._reopen is not None and not self._reopen.done():
            await asyncio.gather(self._reopen, return_exceptions=True)
        server = self.server
        if server is not None:
            server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        await asyncio.sleep(0)  # let the transports report connection_lost
        if server is not None:
            await server.wait_closed()


async def serve(handler: Callable[[Request], Any], host: str, port: int) -> HttpServer:
    """Listen on host:port (0 = a free port) and serve `handler`."""
    http = HttpServer(handler, host)
    await http._listen(port)
    return http
