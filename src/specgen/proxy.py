"""Proxies: which one a URL goes through, read once from `[endpoint] proxy` or the environment.

`proxy = None` (the default) follows the standard variables as curl, requests, httpx and the
OpenAI SDK do: `https_proxy` / `HTTPS_PROXY` for https URLs, `http_proxy` / `HTTP_PROXY` for
http URLs, `all_proxy` / `ALL_PROXY` for either (the lower-case form wins when both are set),
and `no_proxy` / `NO_PROXY` for the hosts that go direct. `proxy = "http://host:port"` sends
every URL through that proxy (NO_PROXY still applies); `proxy = false` ignores the environment.

A proxy's credentials (`http://user:password@host:port`) become a `Proxy-Authorization: Basic`
header and nothing else: `Proxy.display` (used in messages) shows `***` in their place, and
`Proxy.secrets` lists what a redactor must mask if a server or a library echoes them.
"""

from __future__ import annotations

import base64
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit


class ProxyError(ValueError):
    """A proxy setting that cannot be used (the message never holds its credentials)."""


@dataclass(frozen=True)
class Proxy:
    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)  # Proxy-Authorization value
    secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def url(self) -> str:
        """The proxy's URL without credentials (what aiohttp is given)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def display(self) -> str:
        """For messages: credentials shown as `***`."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        auth = "***@" if self.authorization else ""
        return f"http://{auth}{host}:{self.port}"

    def __repr__(self) -> str:
        return f"Proxy({self.display})"


def _safe(url: str) -> str:
    """`url` for a message, its credentials (if any) masked."""
    if "://" not in url:  # scheme-less (host:3128): what comes before an "@" is credentials
        return f"***@{url.rsplit('@', 1)[1]}" if "@" in url else url
    try:
        parts = urlsplit(url)
    except ValueError:  # not even a URL: whatever comes before an "@" may be credentials
        scheme, sep, rest = url.rpartition("://")
        return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}" if "@" in rest else url
    if "@" in parts.netloc:
        return url.replace(parts.netloc, "***@" + parts.netloc.rsplit("@", 1)[1], 1)
    return url


def parse_proxy(url: str, where: str = "proxy") -> Proxy:
    """`http://[user:password@]host[:port]` → `Proxy`. A scheme-less value (`host:3128`, as
    some clusters set it) is taken as http. Only http proxies are supported: the tunnel to the
    proxy is plain TCP, what goes through it to an https API is TLS end to end."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ProxyError(f"{where}: {_safe(url)!r} is not a proxy URL") from None
    if parts.scheme.lower() != "http":
        raise ProxyError(f"{where}: {_safe(url)!r}: only http:// proxies are supported "
                         "(https APIs are tunnelled through them with CONNECT)")
    if not parts.hostname:
        raise ProxyError(f"{where}: {_safe(url)!r} has no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ProxyError(f"{where}: {_safe(url)!r}: a proxy URL is scheme://host:port only")
    auth = None
    secrets: tuple[str, ...] = ()
    if parts.username is not None or parts.password is not None:
        user = unquote(parts.username or "")
        password = unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        auth = f"Basic {token}"
        raw_user, raw_pw = parts.username or "", parts.password or ""
        secrets = tuple(s for s in {token, password, raw_pw, f"{raw_user}:{raw_pw}"} if s)
    return Proxy(parts.hostname, port or 80, auth, secrets)


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name.lower())
    if value is None or not value.strip():
        value = env.get(name.upper())
    return value.strip() if value and value.strip() else None


def bypassed(host: str, port: int, no_proxy: str | None) -> bool:
    """Whether NO_PROXY sends `host:port` direct: `*` (everything), a host name and its
    subdomains (`example.com`, `.example.com`, `*.example.com`), an IP address or a CIDR
    range (`10.0.0.0/8`), each optionally with `:port`; comma- or space-separated."""
    if not no_proxy:
        return False
    host = host.strip("[]").lower().rstrip(".")
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        addr = None
    for entry in no_proxy.replace(",", " ").split():
        entry = entry.strip().lower()
        if entry == "*":
            return True
        want_port = None
        if entry.startswith("["):  # [v6]:port
            end = entry.find("]")
            rest = entry[end + 1:]
            entry = entry[1:end]
            if rest.startswith(":") and rest[1:].isdigit():
                want_port = int(rest[1:])
        elif entry.count(":") == 1:
            name, _, p = entry.partition(":")
            if p.isdigit():
                entry, want_port = name, int(p)
        if want_port is not None and want_port != port:
            continue
        if addr is not None:
            try:
                if addr in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = entry.lstrip("*").lstrip(".").rstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False


class ProxyChooser:
    """The proxy (or None: direct) for each URL, from the setting and the environment as they
    were when it was made."""

    def __init__(self, setting: str | bool | None = None,
                 env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        self._cache: dict[tuple[str, str, int], Proxy | None] = {}
        self._no_proxy = _env(env, "no_proxy")
        self._fixed: Proxy | None = None
        self._by_scheme: dict[str, Proxy | None] = {"http": None, "https": None}
        self.source = "off"
        if setting is False:
            self._no_proxy = None
            return
        if isinstance(setting, str):
            self._fixed = parse_proxy(setting, "endpoint.proxy")
            self._by_scheme = {"http": self._fixed, "https": self._fixed}
            self.source = "endpoint.proxy"
            return
        any_url = _env(env, "all_proxy")
        for scheme in ("http", "https"):
            value = _env(env, f"{scheme}_proxy") or any_url
            if value:
                name = f"{scheme}_proxy" if _env(env, f"{scheme}_proxy") else "all_proxy"
                self._by_scheme[scheme] = parse_proxy(value, name.upper())
                self.source = "environment"

    @property
    def active(self) -> bool:
        return any(self._by_scheme.values())

    @property
    def secrets(self) -> tuple[str, ...]:
        out: list[str] = []
        for p in self._by_scheme.values():
            if p is not None:
                out.extend(p.secrets)
        return tuple(out)

    def for_url(self, scheme: str, host: str, port: int) -> Proxy | None:
        """The proxy for a URL (None: direct); decided once per origin."""
        key = (scheme, host, port)
        try:
            return self._cache[key]
        except KeyError:
            pass
        proxy = self._by_scheme.get(scheme.lower())
        if proxy is not None and bypassed(host, port, self._no_proxy):
            proxy = None
        if len(self._cache) < 1024:
            self._cache[key] = proxy
        return proxy

    def describe(self) -> str:
        """One line for the log (no credentials)."""
        if not self.active:
            return "no proxy"
        parts = [f"{s} via {p.display}" for s, p in self._by_scheme.items() if p is not None]
        if self._no_proxy:
            parts.append(f"NO_PROXY {self._no_proxy}")
        return f"proxy ({self.source}): " + ", ".join(parts)


def urlopen(url: str, *, setting: str | bool | None = None,
            headers: dict[str, str] | None = None, timeout: float = 30.0):
    """`urllib.request.urlopen` of a GET through the proxy `ProxyChooser(setting)` picks for
    `url` (specgen's few stdlib requests: `preview --fetch-prices`); the credentials go in
    `Proxy-Authorization` (urllib moves it to the CONNECT of an https tunnel)."""
    import urllib.request

    parts = urlsplit(url)
    proxy = ProxyChooser(setting).for_url(parts.scheme, parts.hostname or "",
                                          parts.port or (443 if parts.scheme == "https" else 80))
    handler = urllib.request.ProxyHandler({parts.scheme: proxy.url} if proxy else {})
    req = urllib.request.Request(url, headers=dict(headers or {}))
    if proxy is not None and proxy.authorization:
        req.add_header("Proxy-Authorization", proxy.authorization)
    return urllib.request.build_opener(handler).open(req, timeout=timeout)
