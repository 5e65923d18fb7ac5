"""Proxies (docs/client.md, "Proxies"): HTTPS_PROXY / HTTP_PROXY / NO_PROXY by default,
`[endpoint] proxy = URL | false`, on every path: aiohttp (non-stream, GET) and the batched
stream reader (a CONNECT tunnel for https, absolute-form requests for http). A real proxy
(tests/proxy_server.py) counts what it carries; credentials never reach a message."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from proxy_server import ProxyServer
from specgen.client import ApiError, ChatClient
from specgen.config import ConfigError, parse_config
from specgen.proxy import ProxyChooser, ProxyError, bypassed, parse_proxy
from test_client import (
    BODY,
    FINISH,
    USAGE,
    Server,
    chunk,
    completion,
    events,
    json_handler,
    stream_handler,
)
from test_client_streams import LOOPS, run_on, tls_files  # noqa: F401  (a fixture)

STREAM = events(*[chunk(content=t) for t in (" a", " b", " c")], FINISH, USAGE, "[DONE]")


# -- choosing the proxy ------------------------------------------------------------------

def test_env_variables_and_their_precedence() -> None:
    env = {"HTTPS_PROXY": "http://up:1", "https_proxy": "http://low:2",
           "HTTP_PROXY": "proxy.local:3128", "NO_PROXY": "internal.corp,10.0.0.0/8,.svc"}
    c = ProxyChooser(None, env)
    assert c.for_url("https", "openrouter.ai", 443).url == "http://low:2"  # lower case wins
    assert c.for_url("http", "vllm.example", 8000).url == "http://proxy.local:3128"
    assert c.for_url("https", "api.internal.corp", 443) is None
    assert c.for_url("http", "10.1.2.3", 8000) is None
    assert c.for_url("http", "vllm.ns.svc", 80) is None
    assert c.for_url("http", "11.1.2.3", 8000) is not None
    only_all = ProxyChooser(None, {"ALL_PROXY": "http://all:9"})
    assert only_all.for_url("https", "x", 443).url == "http://all:9"
    assert ProxyChooser(False, env).for_url("https", "openrouter.ai", 443) is None
    assert not ProxyChooser(None, {}).active
    fixed = ProxyChooser("http://p:8", {"NO_PROXY": "localhost", "HTTPS_PROXY": "http://e:1"})
    assert fixed.for_url("https", "openrouter.ai", 443).url == "http://p:8"
    assert fixed.for_url("http", "localhost", 8000) is None


def test_no_proxy_forms() -> None:
    assert bypassed("anything", 1, "*")
    assert bypassed("a.example.com", 443, "*.example.com")
    assert bypassed("example.com", 443, "example.com:443")
    assert not bypassed("example.com", 8443, "example.com:443")
    assert not bypassed("notexample.com", 443, "example.com")
    assert bypassed("::1", 80, "[::1]:80") and bypassed("::1", 80, "::1")
    assert not bypassed("example.com", 443, "")


def test_credentials_never_in_messages_or_repr() -> None:
    p = parse_proxy("http://alice:s3cr%40t@proxy:3128")
    assert p.authorization == "Basic YWxpY2U6czNjckB0"  # alice:s3cr@t
    assert "s3cr" not in repr(p) and "s3cr" not in p.display and "alice" not in p.display
    with pytest.raises(ProxyError) as err:
        parse_proxy("https://alice:hunter22@proxy:3128")
    assert "hunter22" not in str(err.value) and "only http://" in str(err.value)
    c = ProxyChooser(None, {"HTTPS_PROXY": "http://alice:hunter22@proxy:3128"})
    assert "hunter22" not in c.describe() and "***@proxy:3128" in c.describe()


def test_config_key(tmp_path) -> None:
    import tomllib

    (tmp_path / "d.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')

    def load_config_text(text: str):
        return parse_config(tomllib.loads(text), tmp_path / "run.toml")

    base = 'run_dir = "r"\n[target]\nmodel = "m"\ntokenizer = "demo"\n[endpoint]\nbase_url = "http://h/v1"\n'
    tail = '[[dataset]]\nname = "d"\npath = "d.jsonl"\n'
    assert load_config_text(base + tail).endpoint.proxy is None
    assert load_config_text(base + 'proxy = false\n' + tail).endpoint.proxy is False
    assert load_config_text(base + 'proxy = "http://p:3128"\n' + tail).endpoint.proxy \
        == "http://p:3128"
    with pytest.raises(ConfigError, match="credentials do not belong") as err:
        load_config_text(base + 'proxy = "http://u:hunter22@p:3128"\n' + tail)
    assert "hunter22" not in str(err.value)
    with pytest.raises(ConfigError, match="only http://"):
        load_config_text(base + 'proxy = "socks5://p:1080"\n' + tail)


# -- through a real proxy ----------------------------------------------------------------

def test_http_paths_through_the_proxy_from_the_environment() -> None:
    """Plain http: the batched stream (absolute-form), the aiohttp non-stream and GET paths;
    the proxy's credentials are sent to it and nowhere else."""
    async def main(proxy: ProxyServer) -> None:
        async def handler(request, body):
            if request.method == "GET":
                return await json_handler({"data": []})(request, body)
            if body.get("stream"):
                return await stream_handler(STREAM)(request, body)
            return await json_handler(completion("plain"))(request, body)

        env = {"HTTP_PROXY": proxy.url("alice", "hunter22"), "NO_PROXY": "example.invalid"}
        async with Server(handler) as srv:
            async with ChatClient(srv.url, stream_tick=0.05, env=env) as client:
                assert client._pool is not None  # the batched reader stays on
                streamed = await client.chat({**BODY, "stream": True})
                plain = await client.chat({**BODY, "stream": False})
                listed = await client.get_json("models")
        assert streamed.content == " a b c" and plain.content == "plain"
        assert listed == {"data": []}
        assert proxy.forwarded == 3 and proxy.tunnels == 0 and proxy.refused == 0
        assert all(t.startswith(f"http://127.0.0.1:{srv.port}/v1/") for t in proxy.targets)
        for seen in srv.seen:  # the proxy took its header off
            assert not any(k.lower() == "proxy-authorization" for k in seen.headers)

    with ProxyServer("alice", "hunter22") as proxy:
        run_on("asyncio", lambda: main(proxy))


def test_no_proxy_and_proxy_false_go_direct() -> None:
    async def main(proxy: ProxyServer) -> None:
        async with Server(stream_handler(STREAM)) as srv:
            for kwargs in ({"env": {"HTTP_PROXY": proxy.url(), "NO_PROXY": "127.0.0.1"}},
                           {"env": {"http_proxy": proxy.url(), "no_proxy": "*"}},
                           {"env": {"HTTP_PROXY": proxy.url()}, "proxy": False}):
                async with ChatClient(srv.url, stream_tick=0.05, **kwargs) as client:
                    assert (await client.chat({**BODY, "stream": True})).content == " a b c"
            assert len(srv.seen) == 3
            async with ChatClient(srv.url, stream_tick=0.05, env={},
                                  proxy=proxy.url()) as client:  # the config key
                assert (await client.chat({**BODY, "stream": True})).content == " a b c"
        assert proxy.forwarded == 1 and proxy.tunnels == 0

    with ProxyServer() as proxy:
        run_on("asyncio", lambda: main(proxy))


def test_wrong_proxy_credentials_are_redacted_from_the_error() -> None:
    async def main(proxy: ProxyServer) -> None:
        async with Server(stream_handler(STREAM)) as srv:
            env = {"HTTP_PROXY": proxy.url("alice", "wrong-pass")}
            async with ChatClient(srv.url, stream_tick=0.05, env=env) as client:
                with pytest.raises(ApiError) as err:
                    await client.chat({**BODY, "stream": True})
        assert err.value.status == 407 and err.value.kind == "unreachable" and proxy.refused == 1
        text = f"{err.value} {err.value.body} {err.value!r}"
        assert "wrong-pass" not in text and "YWxpY2U6d3JvbmctcGFzcw" not in text

    with ProxyServer("alice", "hunter22") as proxy:
        run_on("asyncio", lambda: main(proxy))


@pytest.mark.parametrize("stream_tick", [0.05, 0])
def test_a_refused_connect_is_unreachable_without_the_credentials(stream_tick) -> None:
    async def main(proxy: ProxyServer) -> None:
        env = {"HTTPS_PROXY": proxy.url("alice", "wrong-pass")}
        async with ChatClient("https://127.0.0.1:9/v1", stream_tick=stream_tick,
                              env=env) as client:
            with pytest.raises(ApiError) as err:
                await client.chat({**BODY, "stream": True})
        assert err.value.kind == "unreachable" and proxy.refused == 1 and proxy.tunnels == 0
        if stream_tick:
            assert "407" in str(err.value) and "***@127.0.0.1" in str(err.value)
        text = f"{err.value} {err.value.body} {err.value!r}"
        assert "wrong-pass" not in text and "YWxpY2U6d3JvbmctcGFzcw" not in text

    with ProxyServer("alice", "hunter22") as proxy:
        run_on("asyncio", lambda: main(proxy))


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("stream_tick", [0.05, 0])
def test_https_through_a_connect_tunnel(stream_tick, loop, tls_files, monkeypatch) -> None:  # noqa: F811
    """https: one CONNECT per connection, TLS end to end through it; the batched reader
    (stream_tick > 0) and aiohttp (0) both tunnel; kept-alive connections reuse the tunnel."""
    from specgen.client.pool import H1Pool

    cert, key = tls_files
    trusted = ssl.create_default_context(cafile=str(cert))
    monkeypatch.setattr(H1Pool, "_ssl_context", lambda self: trusted)
    import aiohttp.connector

    monkeypatch.setattr(aiohttp.connector, "_SSL_CONTEXT_VERIFIED", trusted)

    async def main(proxy: ProxyServer) -> None:
        env = {"HTTPS_PROXY": proxy.url("alice", "hunter22"), "HTTP_PROXY": "http://unused:1"}
        async with Server(stream_handler(STREAM), tls=(cert, key)) as server:
            async with ChatClient(server.url, stream_tick=stream_tick, env=env) as client:
                assert (client._pool is not None) == (stream_tick > 0)
                for _ in range(3):
                    r = await client.chat({**BODY, "stream": True})
                    assert r.content == " a b c" and r.usage == USAGE["usage"]
                await asyncio.gather(*[client.chat({**BODY, "stream": True})
                                       for _ in range(4)])
                if stream_tick and loop == "asyncio":  # held and read by the tick, directly
                    held = [c for c in client._pool._conns if c.reader is not None]
                    assert held and all(c.read_step is not None for c in held)
        assert proxy.targets and set(proxy.targets) == {f"127.0.0.1:{server.port}"}
        assert 1 <= proxy.tunnels <= 5 and proxy.forwarded == 0, proxy.tunnels
        seen = [s.headers for s in server.seen]
        assert len(seen) == 7 and not any("Proxy-Authorization" in h for h in seen)

    with ProxyServer("alice", "hunter22") as proxy:
        run_on(loop, lambda: main(proxy))


# -- a real run ----------------------------------------------------------------------------

def test_specgen_run_reaches_the_sim_through_the_proxy(tmp_path) -> None:
    """`specgen run` (a process) with HTTPS_PROXY / HTTP_PROXY set: every request to the sim
    goes through the proxy (its credentials in neither the log nor the store); with NO_PROXY
    naming the sim's host, the same run goes direct past a dead proxy."""
    from test_engine_support import count, prompt_rows, run_cli, write_config, write_jsonl

    write_jsonl(tmp_path / "a.jsonl", prompt_rows(5))
    clean = {k: "" for k in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy",
                             "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy")}
    with ProxyServer("alice", "hunter22") as proxy:
        url = proxy.url("alice", "hunter22")
        path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}],
                            endpoint="stream = true\n")
        out = run_cli(path, env={**clean, "HTTPS_PROXY": url, "HTTP_PROXY": url})
        assert out.returncode == 0, out.stderr[-2000:]
        assert proxy.forwarded >= 5 and proxy.refused == 0, proxy.targets
        assert sum("/chat/completions" in t for t in proxy.targets) >= 5
    run_dir = tmp_path / "run-dir"
    assert count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status = 'done'") == 5
    for f in run_dir.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert b"hunter22" not in data and b"YWxpY2U6aHVudGVyMjI" not in data, f
    assert "***@127.0.0.1" in (run_dir / "specgen.log").read_text()
    assert "hunter22" not in out.stderr + out.stdout

    dead = ProxyServer()  # bound, never served: a proxy that does not answer
    dead.__exit__()
    write_jsonl(tmp_path / "b.jsonl", prompt_rows(3, "q"))
    path = write_config(tmp_path, "sim", [{"name": "b", "path": "b.jsonl"}], name="direct")
    out = run_cli(path, env={**clean, "HTTP_PROXY": dead.url(), "NO_PROXY": "127.0.0.1"},
                  timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # [endpoint] proxy = false: the environment's (dead) proxy is not used at all
    path = write_config(tmp_path, "sim", [{"name": "b", "path": "b.jsonl"}], name="off",
                        endpoint="proxy = false\n")
    out = run_cli(path, env={**clean, "HTTP_PROXY": dead.url(), "HTTPS_PROXY": dead.url()},
                  timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "network: no proxy" in (tmp_path / "off-dir" / "specgen.log").read_text()


def test_stdlib_get_honours_the_same_rules() -> None:
    """`preview --fetch-prices`'s GET (urllib): through the proxy, NO_PROXY, proxy = false."""
    import http.server
    import threading

    from specgen.proxy import urlopen

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = b'{"data": {"endpoints": []}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/models"
    try:
        with ProxyServer("alice", "hunter22") as proxy:
            env = {"HTTP_PROXY": proxy.url("alice", "hunter22"), "NO_PROXY": ""}
            with pytest.MonkeyPatch.context() as mp:
                for k in ("NO_PROXY", "no_proxy", "http_proxy", "ALL_PROXY", "all_proxy"):
                    mp.delenv(k, raising=False)
                for k, v in env.items():
                    mp.setenv(k, v)
                with urlopen(url) as r:
                    assert r.read() == b'{"data": {"endpoints": []}}'
                assert proxy.forwarded == 1 and proxy.refused == 0
                with urlopen(url, setting=False) as r:
                    r.read()
                mp.setenv("NO_PROXY", "127.0.0.1")
                with urlopen(url) as r:
                    r.read()
            assert proxy.forwarded == 1
    finally:
        httpd.shutdown()
