"""Batched stream reads (h1.py, ticker.py) against real loopback servers: the same answers as
the unbatched aiohttp path, fewer reads, timeouts and cancellation as before; on asyncio's
loop and, when installed, on uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiohttp import web

from specgen.client import ChatClient
from specgen.client import parse as parse_mod
from test_client import (
    BODY,
    FINISH,
    SSE_HEADERS,
    USAGE,
    Server,
    chunk,
    events,
    fail,
    stream_handler,
)

LOOPS = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])
FIELDS = ("content", "reasoning", "reasoning_field", "tool_calls", "finish_reason",
          "native_finish_reason", "provider", "model", "id", "usage", "prompt_token_ids",
          "completion_token_ids", "duplicates", "stream", "http_status", "stop_reason")


def run_on(loop: str, main: Callable[[], Awaitable[Any]]) -> Any:
    factory = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        # a guard against a hang, not a bound: a starved loop on a busy machine took > 60 s
        return runner.run(asyncio.wait_for(main(), 600))


def reasoning_chunk(text: str) -> dict:
    """OpenRouter's reasoning piece, with its copy in reasoning_details."""
    return chunk(reasoning=text, reasoning_details=[{"type": "reasoning.text", "text": text}])


def tool_chunk(index: int, args: str, **first: Any) -> dict:
    fn: dict[str, Any] = {"arguments": args}
    if "name" in first:
        fn["name"] = first["name"]
    call: dict[str, Any] = {"index": index, "function": fn}
    if "id" in first:
        call["id"] = first["id"]
    return {"id": "gen-1", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


def one_per_write(*chunks: dict | str) -> list[bytes]:
    return events(*chunks)


def cut(pieces: list[bytes], size: int) -> list[bytes]:
    data = b"".join(pieces)
    return [data[i:i + size] for i in range(0, len(data), size)]


def gzipped(pieces: list[bytes]) -> list[bytes]:
    z = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    out = [z.compress(p) + z.flush(zlib.Z_SYNC_FLUSH) for p in pieces]
    return out + [z.flush()]


TOKENS = [f" w{i}" for i in range(60)]
ANSWERS = {
    "content one token per write": (one_per_write(
        chunk(role="assistant", content=""), *[chunk(content=t) for t in TOKENS],
        FINISH, USAGE, "[DONE]"), {}),
    "reasoning then content, ids, usage": (one_per_write(
        {"prompt_token_ids": [5, 6], **chunk(role="assistant")},
        *[{**reasoning_chunk(t), "choices": [{**reasoning_chunk(t)["choices"][0],
                                              "token_ids": [i]}]}
          for i, t in enumerate(TOKENS[:20])],
        *[chunk(content=t) for t in TOKENS[20:40]],
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop",
                      "native_finish_reason": "end_turn", "token_ids": [99]}]},
        USAGE, "[DONE]"), {}),
    "tool calls in fragments": (one_per_write(
        chunk(role="assistant", content="Let me look."),
        tool_chunk(0, '{"q": ', id="c1", name="lookup"), tool_chunk(0, '"sky"}'),
        tool_chunk(1, "{}", id="c2", name="now"),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        USAGE, "[DONE]"), {}),
    "CRLF, comments, cuts mid-line": (cut(
        [b": OPENROUTER PROCESSING\r\n\r\n"]
        + events(*[chunk(content=t) for t in TOKENS[:30]], FINISH, USAGE, "[DONE]",
                 nl=b"\r\n"), 7), {}),
    "multi-line data, a repeated event, no [DONE]": (
        [b"event: message\ndata: " + b'{"id":"gen-1","choices":[{"index":0,\ndata: '
         b'"delta":{"content":"a"}}]}\n\n']
        + one_per_write(chunk(content="b"), chunk(content="b"), FINISH, USAGE), {}),
    "gzip": (gzipped(one_per_write(*[chunk(content=t) for t in TOKENS[:30]], FINISH, USAGE,
                                   "[DONE]")), {"Content-Encoding": "gzip"}),
}


@contextlib.contextmanager
def counted_feeds() -> Iterator[list[int]]:
    """Count the blocks every stream parser is fed meanwhile (`[n]`)."""
    feeds = [0]
    feed = parse_mod.StreamParser.feed

    def counting(self: parse_mod.StreamParser, block: bytes) -> None:
        feeds[0] += 1
        feed(self, block)

    parse_mod.StreamParser.feed = counting  # type: ignore[method-assign]
    try:
        yield feeds
    finally:
        parse_mod.StreamParser.feed = feed  # type: ignore[method-assign]


def ticks_of(client: ChatClient) -> int:
    """How many read ticks the client's ticker has made."""
    assert client._pool is not None and client._pool._ticker is not None
    return client._pool._ticker.ticks


async def answer_with(tick: float, pieces: list[bytes], headers: dict[str, str],
                      pause: float = 0.003) -> tuple[Any, int, int | None]:
    """(the response, how many blocks the stream parser was fed, the read ticks meanwhile
    (None unbatched))."""
    with counted_feeds() as feeds:
        handler = stream_handler(pieces, pause=pause, headers={**SSE_HEADERS, **headers})
        async with Server(handler) as srv:
            async with ChatClient(srv.url, stream_tick=tick) as client:
                resp = await client.chat({**BODY, "stream": True})
                ticks = ticks_of(client) if tick else None
    return resp, feeds[0], ticks


@pytest.mark.timing
@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("name", list(ANSWERS))
def test_batched_reads_parse_the_same_answer(loop: str, name: str) -> None:
    pieces, headers = ANSWERS[name]

    async def main() -> None:
        plain, plain_feeds, _ = await answer_with(0, pieces, headers)
        batched, batched_feeds, ticks = await answer_with(0.05, pieces, headers)
        for field in FIELDS:
            assert getattr(batched, field) == getattr(plain, field), field
        assert batched.content or batched.tool_calls or batched.reasoning
        if len(pieces) > 30:  # a trickle: the tick reads it in blocks, one per tick (a
            # count no machine speed changes: a starved loop makes ticks and reads alike
            # rarer; the read before the stream is held and the last one come on top)
            assert batched_feeds <= ticks + 3, (batched_feeds, ticks, plain_feeds)

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.timing
def test_idle_timeout_fires_on_a_stalled_batched_stream(loop: str) -> None:
    async def main() -> None:
        pieces = one_per_write(*[chunk(content=t) for t in TOKENS[:5]])
        clients: list[ChatClient] = []
        last_sent: list[int] = []  # the client's read ticks when the last piece went out

        def sending(piece: bytes) -> None:
            if piece is pieces[-1]:
                last_sent.append(ticks_of(clients[0]))

        async with Server(stream_handler(pieces, pause=0.01, then="hang",
                                         sending=sending)) as srv:
            idle, tick = 0.4, 0.1
            async with ChatClient(srv.url, idle_timeout=idle, stream_tick=tick) as client:
                clients.append(client)
                t0 = time.monotonic()
                e = await fail(client, {**BODY, "stream": True})
                took = time.monotonic() - t0
                assert client.in_flight() == {srv.url: 0}
                ticks = ticks_of(client) - last_sent[0]
        assert e.kind == "timeout" and e.timeout_phase == "idle"
        # not before its own idle timeout (a timer never fires early, on any machine) ...
        assert took >= idle
        # ... and at most a tick late: counted in the ticker's reads since the last piece,
        # which a slow or busy machine makes fewer, never more (one to read the piece, the
        # idle time's, one late, and the failure's own turns)
        assert ticks <= round(idle / tick) + 4, ticks

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.timing
def test_cancel_is_prompt_and_drops_the_connection(loop: str) -> None:
    async def main() -> None:
        gone = asyncio.Event()

        writes = [0]

        async def trickle(request: web.Request, body: Any) -> web.StreamResponse:
            resp = web.StreamResponse(headers=SSE_HEADERS)
            await resp.prepare(request)
            try:
                for t in TOKENS * 100:
                    await resp.write(events(chunk(content=t))[0])
                    writes[0] += 1
                    await asyncio.sleep(0.01)
            except (ConnectionError, asyncio.CancelledError):
                gone.set()
                raise
            return resp

        async with Server(trickle) as srv:
            async with ChatClient(srv.url, stream_tick=0.2) as client:
                task = asyncio.create_task(client.chat({**BODY, "stream": True}))
                await asyncio.sleep(0.5)
                before = writes[0]
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # prompt: done before the next read tick (0.2 s, 20 of the server's writes
                # on this same loop: a busy machine slows both alike)
                assert writes[0] - before < 10, (before, writes[0])
                assert client.in_flight() == {srv.url: 0}
                assert client._pool is not None and len(client._pool._ticker) == 0
                await asyncio.wait_for(gone.wait(), 5)  # the server saw the connection go

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_connection_kept_when_the_last_chunk_comes_after_done(loop: str) -> None:
    async def main() -> None:
        async def late_end(request: web.Request, body: Any) -> web.StreamResponse:
            resp = web.StreamResponse(headers=SSE_HEADERS)
            await resp.prepare(request)
            for piece in events(chunk(content="x"), FINISH, "[DONE]"):
                await resp.write(piece)
            await asyncio.sleep(0.15)  # the answer is complete; the body ends later
            await resp.write_eof()
            return resp

        async with Server(late_end) as srv:
            async with ChatClient(srv.url, stream_tick=0.05) as client:
                first = await client.chat({**BODY, "stream": True})
                await asyncio.sleep(0.3)
                second = await client.chat({**BODY, "stream": True})
        assert first.content == second.content == "x"
        assert srv.seen[0].peer == srv.seen[1].peer  # one keep-alive connection

    run_on(loop, main)


def test_a_reset_mid_batched_stream_is_a_connection_error() -> None:
    async def main() -> None:
        pieces = one_per_write(*[chunk(content=t) for t in TOKENS[:10]])
        async with Server(stream_handler(pieces, pause=0.01, then="abort")) as srv:
            async with ChatClient(srv.url, stream_tick=0.05) as client:
                e = await fail(client, {**BODY, "stream": True})
        assert e.kind == "connection" and e.status == 200

    run_on("asyncio", main)


def test_tick_off_and_aiohttp_only_settings_use_aiohttp() -> None:
    async def main() -> None:
        for kwargs in ({"stream_tick": 0}, {"limit": 10}):
            async with ChatClient("http://127.0.0.1:9/v1", **kwargs) as client:
                assert client._pool is None
        async with ChatClient("http://127.0.0.1:9/v1") as client:
            assert client._pool is not None and client.stream_tick == 0.2

    run_on("asyncio", main)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 (skipped without the openssl tool)."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"),
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


@pytest.mark.timing
@pytest.mark.parametrize("loop", LOOPS)
def test_batched_reads_over_tls(loop: str, tls_files, monkeypatch) -> None:
    import ssl

    from specgen.client.pool import H1Pool

    cert, key = tls_files
    trusted = ssl.create_default_context(cafile=str(cert))
    monkeypatch.setattr(H1Pool, "_ssl_context", lambda self: trusted)
    pieces = one_per_write(*[chunk(content=t) for t in TOKENS], FINISH, USAGE, "[DONE]")

    async def main() -> None:
        async with Server(stream_handler(pieces, pause=0.003), tls=(cert, key)) as server:
            with counted_feeds() as feeds:
                async with ChatClient(server.url, stream_tick=0.05) as client:
                    first = await client.chat({**BODY, "stream": True})
                    second = await client.chat({**BODY, "stream": True})
                    ticks = ticks_of(client)
        assert first.content == second.content == "".join(TOKENS)
        # read in batches through TLS too: once per tick (and the first and last reads of
        # each answer), whatever the machine's speed
        assert feeds[0] <= ticks + 6, (feeds, ticks, len(pieces))
        assert first.usage == USAGE["usage"] and first.finish_reason == "stop"

    run_on(loop, main)
