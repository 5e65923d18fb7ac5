"""Keep-alive HTTP/1.1 connections (`H1Connection`) per origin, for streamed requests.

No cap on connections (the engine's concurrency is the cap), DNS answers cached for 5
minutes (one lookup in flight per host), TLS with the system's default context, and one
connect timeout over the lookup, the TCP connect and the TLS handshake. A connection goes back
to the pool only when its request let go of it and its response ended cleanly with
keep-alive; it is closed after `keepalive_timeout` s unused.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
import weakref
from typing import Any

from specgen.proxy import Proxy

from .h1 import H1Connection
from .ticker import ReadTicker

DNS_TTL = 300.0


class ConnectTimeout(OSError):
    """No connection within the connect timeout (mapped to `unreachable`, phase `connect`)."""


class ProxyTunnelError(OSError):
    """The proxy did not open the tunnel (mapped to `unreachable`; no credentials in it)."""


MAX_PROXY_HEAD = 16 * 1024


class _TunnelReply(asyncio.Protocol):
    """Reads the proxy's answer to CONNECT (its head only); the connection is then handed to
    TLS and the `H1Connection`."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.head: asyncio.Future[bytes] = loop.create_future()
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end >= 0 and not self.head.done():
            if end + 4 != len(self.buf):  # a server speaking before the TLS handshake
                self.head.set_exception(ProxyTunnelError("the proxy sent bytes after its "
                                                         "CONNECT answer"))
                return
            self.head.set_result(self.buf[:end])
        elif len(self.buf) > MAX_PROXY_HEAD and not self.head.done():
            self.head.set_exception(ProxyTunnelError("the proxy's CONNECT answer is too long"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(ProxyTunnelError("the proxy closed the connection during "
                                                     "CONNECT"))


Origin = tuple[str, str, int]  # scheme, host, port


class H1Pool:
    def __init__(self, loop: asyncio.AbstractEventLoop, ticker: ReadTicker | None, *,
                 connect_timeout: float | None, keepalive_timeout: float):
        self._loop = loop
        self._ticker = ticker
        self._connect_timeout = connect_timeout or None
        self._keepalive = keepalive_timeout
        self._idle: dict[Origin, list[H1Connection]] = {}
        self._conns: weakref.WeakSet[H1Connection] = weakref.WeakSet()
        self._dns: dict[tuple[str, int], tuple[float, list[Any]]] = {}
        self._lookups: dict[tuple[str, int], asyncio.Task[list[Any]]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def acquire(self, origin: Origin, proxy: Proxy | None = None) -> H1Connection:
        """An idle connection to `origin`, or a new one (through `proxy` when given: a
        CONNECT tunnel for https, a plain connection to the proxy for http, whose requests
        then name their absolute URL)."""
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.idle_handle is not None:
                conn.idle_handle.cancel()
                conn.idle_handle = None
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        try:
            async with asyncio.timeout(self._connect_timeout):
                if proxy is None:
                    return await self._connect(origin)
                return await self._connect_proxy(origin, proxy)
        except TimeoutError:
            raise ConnectTimeout(f"no connection within {self._connect_timeout:g} s") from None

    def release(self, conn: H1Connection, origin: Origin) -> None:
        """The request is done with `conn`: park it, let it finish its body first, or close."""
        if conn.closed:
            return
        if conn.busy:  # after [DONE], the body's last bytes are still to come
            conn.on_done = lambda c: self._park(c, origin)
            conn.idle_handle = self._loop.call_later(self._keepalive, conn.abort)
            return
        if conn.reusable:
            self._park(conn, origin)
        else:
            conn.abort()

    def _park(self, conn: H1Connection, origin: Origin) -> None:
        conn.on_done = None
        if conn.idle_handle is not None:
            conn.idle_handle.cancel()
        if not conn.reusable or conn.closed:
            conn.idle_handle = None
            conn.abort()
            return
        conn.idle_handle = self._loop.call_later(self._keepalive, self._expire, conn, origin)
        self._idle.setdefault(origin, []).append(conn)

    def _expire(self, conn: H1Connection, origin: Origin) -> None:
        conn.idle_handle = None
        idle = self._idle.get(origin)
        if idle and conn in idle:
            idle.remove(conn)
        conn.abort()

    def close(self) -> None:
        """Close every connection (idle or in use)."""
        self._idle.clear()
        for conn in list(self._conns):
            if conn.idle_handle is not None:
                conn.idle_handle.cancel()
                conn.idle_handle = None
            conn.abort()
        if self._ticker is not None:
            self._ticker.close()

    async def _connect(self, origin: Origin) -> H1Connection:
        scheme, host, port = origin
        ctx = self._ssl_context() if scheme == "https" else None
        last: OSError | None = None
        for family, addr in await self._resolve(host, port):
            try:
                _, conn = await self._loop.create_connection(
                    lambda: H1Connection(self._loop, self._ticker), addr[0], addr[1],
                    family=family, ssl=ctx, server_hostname=host if ctx else None)
            except OSError as exc:
                last = exc
                continue
            self._conns.add(conn)
            return conn
        raise last if last is not None else OSError(f"no address for {host}")

    async def _connect_proxy(self, origin: Origin, proxy: Proxy) -> H1Connection:
        scheme, host, port = origin
        if scheme != "https":  # http through a proxy: absolute-form requests, no tunnel
            conn = await self._connect(("http", proxy.host, proxy.port))
            conn.via_proxy = True
            return conn
        transport: asyncio.Transport | None = None
        last: OSError | None = None
        reply = _TunnelReply(self._loop)
        for family, addr in await self._resolve(proxy.host, proxy.port):
            try:
                transport, _ = await self._loop.create_connection(
                    lambda: reply, addr[0], addr[1], family=family)
                break
            except OSError as exc:
                last = exc
        if transport is None:
            raise last if last is not None else OSError(f"no address for {proxy.host}")
        try:
            target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
            if proxy.authorization:
                head += f"Proxy-Authorization: {proxy.authorization}\r\n"
            transport.write(head.encode("latin-1") + b"\r\n")
            answer = await reply.head
            status_line = answer.split(b"\r\n", 1)[0].decode("latin-1", "replace")
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or parts[1] != "200":
                raise ProxyTunnelError(f"the proxy {proxy.display} refused CONNECT {target}: "
                                       f"{status_line[:120]}")
            conn = H1Connection(self._loop, self._ticker)
            tls = await self._loop.start_tls(transport, conn, self._ssl_context(),
                                             server_hostname=host)
            if tls is None:
                raise ProxyTunnelError("TLS through the proxy tunnel did not start")
        except BaseException:
            transport.abort()
            raise
        conn.connection_made(tls)
        self._conns.add(conn)
        return conn

    async def _resolve(self, host: str, port: int) -> list[Any]:
        key = (host, port)
        hit = self._dns.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        lookup = self._lookups.get(key)
        if lookup is None:  # one lookup per host, not tied to the request that started it
            lookup = self._lookups[key] = self._loop.create_task(self._lookup(key))
        return await asyncio.shield(lookup)

    async def _lookup(self, key: tuple[str, int]) -> list[Any]:
        try:
            infos = await self._loop.getaddrinfo(key[0], key[1], type=socket.SOCK_STREAM)
        finally:
            del self._lookups[key]
        addrs = [(fam, sa) for fam, _, _, _, sa in infos]
        self._dns[key] = (time.monotonic() + DNS_TTL, addrs)
        return addrs

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context()
            ctx.set_alpn_protocols(["http/1.1"])
            self._ssl = ctx
        return self._ssl
