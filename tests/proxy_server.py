"""A small real HTTP proxy for the tests, on 127.0.0.1 in a thread: CONNECT tunnels (what an
https API goes through) and absolute-form forwarding (plain http), with optional Basic
credentials; it counts what it carried and records the request heads it saw."""

from __future__ import annotations

import base64
import socket
import threading
from urllib.parse import urlsplit


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed before a request head")
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (dst, src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class ProxyServer:
    """`with ProxyServer(user=..., password=...) as proxy:` → `proxy.url`, `proxy.tunnels`
    (CONNECTs opened), `proxy.forwarded` (absolute-form requests carried), `proxy.heads`
    (every request head received, as text), `proxy.refused` (407s, and CONNECTs answered
    with `refuse`, e.g. 502: a proxy that will not open the tunnel)."""

    def __init__(self, user: str | None = None, password: str | None = None,
                 refuse: int | None = None):
        self.refuse = refuse
        self.expected = None
        if user is not None:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.expected = f"Basic {token}"
        self.tunnels = 0
        self.forwarded = 0
        self.refused = 0
        self.heads: list[str] = []
        self.targets: list[str] = []
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(256)
        self.port = self._sock.getsockname()[1]
        self._stop = False

    def url(self, user: str | None = None, password: str | None = None) -> str:
        auth = f"{user}:{password}@" if user is not None else ""
        return f"http://{auth}127.0.0.1:{self.port}"

    def __enter__(self) -> ProxyServer:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _authorised(self, client: socket.socket, headers: dict[str, str]) -> bool:
        if self.expected is None or headers.get("proxy-authorization") == self.expected:
            return True
        with self._lock:
            self.refused += 1
        client.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                       b"Proxy-Authenticate: Basic realm=\"test\"\r\nContent-Length: 0\r\n"
                       b"Connection: close\r\n\r\n")
        client.close()
        return False

    def _handle(self, client: socket.socket) -> None:
        try:
            head, rest = _read_head(client)
        except (ConnectionError, OSError):
            client.close()
            return
        text = head.decode("latin-1")
        lines = text.split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        with self._lock:
            self.heads.append(text)
            self.targets.append(target)
        if not self._authorised(client, headers):
            return
        if method == "CONNECT" and self.refuse is not None:
            with self._lock:
                self.refused += 1
            client.sendall(f"HTTP/1.1 {self.refuse} Refused\r\nContent-Length: 0\r\n"
                           "Connection: close\r\n\r\n".encode())
            client.close()
            return
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            upstream = socket.create_connection((host.strip("[]"), int(port)))
            with self._lock:
                self.tunnels += 1
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if rest:
                upstream.sendall(rest)
        else:  # absolute-form: one request per connection (Connection: close upstream)
            url = urlsplit(target)
            upstream = socket.create_connection((url.hostname, url.port or 80))
            with self._lock:
                self.forwarded += 1
            path = url.path + (f"?{url.query}" if url.query else "")
            kept = [f"{method} {path} HTTP/1.1"] + [
                line for line in lines[1:]
                if line.split(":", 1)[0].strip().lower()
                not in ("proxy-authorization", "connection", "proxy-connection")]
            kept.append("Connection: close")
            upstream.sendall("\r\n".join(kept).encode("latin-1") + b"\r\n\r\n" + rest)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)
