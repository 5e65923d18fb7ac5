"""Client benchmark: requests/s and client CPU ms per request at high concurrency.

A trivial aiohttp server in another process answers every request at once with a canned
200-token completion (SSE or JSON). Three clients are measured, each in a fresh process, in
the same run: a bare aiohttp loop that reads the body and parses nothing (the ceiling),
`specgen.client.ChatClient`, and the `openai` SDK with an asyncio.Semaphore (what users write
today). CPU is the client process's own CPU time over the measured window, so the server's cost
is not counted.

    .venv/bin/python bench/client.py                      # defaults: concurrency 2000, 3 runs
    .venv/bin/python bench/client.py --runs 5 --duration 20 --clients bare,specgen
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import orjson

MODEL = "bench/model-200"


# -- the canned server --------------------------------------------------------------------------


def canned(tokens: int) -> tuple[bytes, bytes, str]:
    """(SSE body, JSON body, expected content) for a `tokens`-token answer."""
    words = [f" w{i % 97}" for i in range(tokens)]
    head = {"id": "gen-bench", "object": "chat.completion.chunk", "created": 1700000000,
            "model": MODEL, "provider": "Bench"}
    parts = [b": OPENROUTER PROCESSING\n\n"]
    for w in words:
        parts.append(b"data: " + orjson.dumps({**head, "choices": [
            {"index": 0, "delta": {"content": w}, "finish_reason": None}]}) + b"\n\n")
    parts.append(b"data: " + orjson.dumps({**head, "choices": [
        {"index": 0, "delta": {}, "finish_reason": "stop", "native_finish_reason": "stop"}]})
        + b"\n\n")
    usage = {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": 12 + tokens,
             "cost": 0.0002}
    parts.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n")
    parts.append(b"data: [DONE]\n\n")
    content = "".join(words)
    body = orjson.dumps({
        "id": "gen-bench", "object": "chat.completion", "created": 1700000000, "model": MODEL,
        "provider": "Bench",
        "choices": [{"index": 0, "finish_reason": "stop", "native_finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": usage})
    return b"".join(parts), body, content


def serve(port: int, tokens: int, writes: int, spread: float) -> None:
    import logging

    from aiohttp import web

    # Clients are killed between runs with requests in flight; that is not news.
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)

    sse_body, json_body, _ = canned(tokens)
    pieces = [sse_body]
    if writes > 1:  # cut between events, as a server streaming tokens would
        events = [e + b"\n\n" for e in sse_body.split(b"\n\n") if e]
        per = -(-len(events) // writes)
        pieces = [b"".join(events[i:i + per]) for i in range(0, len(events), per)]
    pause = spread / len(pieces) if spread else 0.0

    async def handler(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if b'"stream":true' in raw or b'"stream": true' in raw:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for piece in pieces:
                await resp.write(piece)
                if pause:
                    await asyncio.sleep(pause)
            await resp.write_eof()
            return resp
        return web.Response(body=json_body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096, reuse_port=True)
        await site.start()
        real = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(real, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


# -- the clients --------------------------------------------------------------------------------


def request_body(stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 200, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def make_client(kind: str, url: str, stream: bool, concurrency: int, expected: str):
    """(one_request coroutine function, close coroutine function)."""
    body = request_body(stream)
    if kind == "bare":
        import aiohttp

        from specgen.client import raise_open_file_limit

        raise_open_file_limit(concurrency * 2 + 256)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            headers={"Content-Type": "application/json", "Authorization": "Bearer bench"},
            timeout=aiohttp.ClientTimeout(total=None))
        payload = orjson.dumps(body)
        chat_url = url + "/chat/completions"

        async def one() -> None:
            async with session.post(chat_url, data=payload) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(resp.status)

        return one, session.close
    if kind == "specgen":
        from specgen.client import ChatClient

        client = ChatClient(url, api_key="bench", stream=stream, concurrency=concurrency)
        await client.open()
        checked = [0]

        async def one() -> None:
            r = await client.chat(body)
            if checked[0] < 5:  # make sure parsing really happened
                assert r.content == expected and r.completion_tokens == 200, r
                checked[0] += 1

        return one, client.close
    if kind == "openai":
        from openai import AsyncOpenAI

        from specgen.client import raise_open_file_limit

        raise_open_file_limit(concurrency * 2 + 256)
        client = AsyncOpenAI(base_url=url, api_key="bench", max_retries=0)
        sem = asyncio.Semaphore(concurrency)
        messages = body["messages"]

        async def one() -> None:
            async with sem:
                if stream:
                    parts = []
                    resp = await client.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=200, stream=True,
                        stream_options={"include_usage": True})
                    async for ch in resp:
                        if ch.choices and ch.choices[0].delta.content:
                            parts.append(ch.choices[0].delta.content)
                    text = "".join(parts)
                else:
                    r = await client.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=200)
                    text = r.choices[0].message.content
                if len(text) != len(expected):
                    raise RuntimeError("short answer")

        return one, client.close
    raise SystemExit(f"unknown client {kind!r}")


async def measure(kind: str, url: str, stream: bool, concurrency: int, duration: float,
                  warm_s: float, expected: str) -> dict[str, Any]:
    one, close = await make_client(kind, url, stream, concurrency, expected)
    done = 0
    errors: dict[str, int] = {}
    stop = False

    async def worker() -> None:
        nonlocal done
        while not stop:
            try:
                await one()
                done += 1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # counted, the loop goes on
                name = type(exc).__name__
                errors[name] = errors.get(name, 0) + 1

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_s:  # connections opened, steady state reached
        await asyncio.sleep(0.05)
    d0, c0, w0 = done, time.process_time(), time.perf_counter()
    await asyncio.sleep(duration)
    d1, c1, w1 = done, time.process_time(), time.perf_counter()
    stop = True
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await close()
    n = d1 - d0
    return {"client": kind, "mode": "stream" if stream else "non-stream", "requests": n,
            "rps": n / (w1 - w0), "cpu_ms": (c1 - c0) * 1000 / n if n else float("nan"),
            "cpu_util": (c1 - c0) / (w1 - w0), "errors": errors}


# -- orchestration ------------------------------------------------------------------------------


def main() -> None:
    if not sys.flags.safe_path:
        # Run as a script, bench/ comes first on sys.path and bench/tokenize.py shadows the
        # stdlib module (tracebacks break); -P keeps the script's folder off sys.path.
        os.execv(sys.executable, [sys.executable, "-P", __file__, *sys.argv[1:]])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=4.0, help="seconds before measuring")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--writes", type=int, default=1,
                    help="split each SSE answer into this many writes (1 = one write)")
    ap.add_argument("--spread", type=float, default=0.0,
                    help="seconds over which the SSE writes are spread (0 = all at once)")
    ap.add_argument("--tune-gc", action="store_true",
                    help="clients run with gc.set_threshold(50000, 20, 100)")
    ap.add_argument("--clients", default="bare,specgen,openai")
    ap.add_argument("--modes", default="stream,non-stream")
    ap.add_argument("--json", help="also write the raw results here")
    # internal
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.serve:
        serve(args.port, args.tokens, args.writes, args.spread)
        return
    if args.worker:
        if args.tune_gc:
            import gc

            gc.set_threshold(50_000, 20, 100)
        expected = canned(args.tokens)[2]
        res = asyncio.run(measure(args.worker, args.url, args.mode == "stream",
                                  args.concurrency, args.duration, args.warmup, expected))
        print(json.dumps(res), flush=True)
        return

    server = subprocess.Popen(
        [sys.executable, "-P", __file__, "--serve", "--tokens", str(args.tokens),
         "--writes", str(args.writes), "--spread", str(args.spread)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        url = f"http://127.0.0.1:{port}/v1"
        results: list[dict[str, Any]] = []
        clients = args.clients.split(",")
        modes = args.modes.split(",")
        for run in range(args.runs):
            for mode in modes:
                for kind in clients:  # interleaved, so noise spreads over every client
                    out = subprocess.run(
                        [sys.executable, "-P", __file__, "--worker", kind, "--url", url, "--mode",
                         mode, "--concurrency", str(args.concurrency), "--duration",
                         str(args.duration), "--warmup", str(args.warmup), "--tokens",
                         str(args.tokens)] + (["--tune-gc"] if args.tune_gc else []),
                        capture_output=True, text=True, timeout=600)
                    if out.returncode != 0:
                        print(out.stderr[-2000:], file=sys.stderr)
                        raise SystemExit(f"{kind} {mode} failed")
                    res = json.loads(out.stdout.strip().splitlines()[-1])
                    res["run"] = run
                    results.append(res)
                    print(f"run {run + 1}: {kind:8s} {mode:10s} {res['rps']:8.0f} req/s "
                          f"{res['cpu_ms']:6.3f} ms CPU/req  errors={res['errors']}",
                          flush=True)
    finally:
        server.terminate()
        server.wait()

    print()
    print(machine_note())
    spread = f" spread over {args.spread:g} s" if args.spread else " at once"
    gc_note = ", clients with gc.set_threshold(50000, 20, 100)" if args.tune_gc else ""
    print(f"concurrency {args.concurrency}, {args.tokens}-token answers, "
          f"{args.writes} write(s) per SSE answer{spread}, {args.runs} runs x "
          f"{args.duration:g} s{gc_note}; medians:")
    print("| client | mode | req/s | client CPU ms/req | vs bare req/s |")
    print("|---|---|---:|---:|---:|")
    for mode in modes:
        bare = None
        for kind in clients:
            rows = [r for r in results if r["client"] == kind and r["mode"] == mode]
            rps = statistics.median(r["rps"] for r in rows)
            done = [r["cpu_ms"] for r in rows if r["requests"]]  # a run may finish nothing
            cpu = f"{statistics.median(done):.3f}" if done else "-"
            if kind == "bare":
                bare = rps
            ratio = f"{rps / bare:.0%}" if bare else "-"
            errors = sum(sum(r["errors"].values()) for r in rows)
            note = f" ({errors} errors)" if errors else ""
            print(f"| {kind} | {mode} | {rps:,.0f} | {cpu}{note} | {ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_note(), "args": vars(args), "results": results}, f,
                      indent=1)


def machine_note() -> str:
    try:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"machine: {cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}, load average {load}")


if __name__ == "__main__":
    main()
