"""Streaming benchmark (not a test): thousands of SSE streams paced like a real provider.

A server in its own process (a raw asyncio Protocol, uvloop when installed, one shared pacing
timer) streams every answer one token per write, `--rate` tokens/s per stream, `--tokens`
tokens per answer, as OpenAI-compatible chat chunks (`choices[0].delta.content`), then a finish
chunk, a usage chunk and `data: [DONE]`. Clients, each in a fresh process, in the same run:

* lean    — an aiohttp session, `async for line in resp.content`, `json.loads` per event: the
            leanest reader people write;
* client  — `specgen.client.ChatClient.chat` alone (no engine);
* specgen — a real `specgen run` (engine, store, renderer, witness) on a small dataset.

Reported per client: CPU µs per streamed token over the streaming window (first request sent
to last answer; the process's CPU time, sampled by a thread, so it is robust to a shared
machine), the same over the whole process (start-up included), achieved events/s against the
offered rate, wall time against the ideal (tokens / rate), peak RSS. Medians over `--runs`.

    python -P bench/streams.py                                  # 2,000 x 40 tok/s x 400 tokens
    python -P bench/streams.py --rate 80 --server-procs 2       # 160,000 writes/s: two servers
    python -P bench/streams.py --streams 10000 --rate 20 --server-procs 3 --modes specgen
    python -P bench/streams.py --modes specgen --tick-ms 100    # another tick

One server process writes ~120,000 one-token events/s here (loopback TCP costs the kernel
~6 us per write); beyond that, `--server-procs` shares the port between several (SO_REUSEPORT),
each also adding a listen backlog (4,096 here) for the connections opened at start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# run with -P (bench/tokenize.py would shadow the standard library's): this folder goes last
sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

ROOT = _common.ROOT
MODEL = "moonshotai/kimi-k2.5"
PROMPT = ("Explain, in a long and careful answer, why the sky looks blue at noon and red at "
          "sunset, and what that says about the size of the particles in the air.")
WORDS = ("the light of day scatters off small molecules and short waves bend more than long "
         "ones so that blue fills the sky while red passes straight through the thick air "
         "near the horizon at dusk when the sun sits low").split()


def raise_nofile(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def try_uvloop() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


# -- the answer: pieces that are one demo-tokenizer token each -----------------------------------
def answer(tokens: int) -> tuple[list[str], int, int]:
    """(token texts, prompt count, completion count) as specgen's renderer counts them."""
    sys.path.insert(0, str(ROOT / "src"))
    from specgen.render import get_renderer
    from specgen.tokenizer import load_tokenizer

    tok = load_tokenizer("demo")
    words: list[str] = []
    i = 0
    while len(tok.encode("".join(words) + ".")) < tokens - 8:
        words.append((" " if words else "") + WORDS[i % len(WORDS)])
        i += 1
    # finish with whichever words make the count exact (no token repeated back to back:
    # the client flags byte-identical consecutive events as possible retransmissions)
    for _ in range(10_000):
        ids = tok.encode("".join(words) + ".")
        if len(ids) == tokens and all(a != b for a, b in zip(ids, ids[1:], strict=False)):
            break
        if len(ids) > tokens:
            words.pop()
        else:
            words.append(" " + WORDS[i % len(WORDS)])
        i += 7
    else:
        raise SystemExit(f"no {tokens}-token answer found")
    text = "".join(words) + "."
    pieces = [tok.decode([t]) for t in ids]
    assert "".join(pieces) == text and len(pieces) == tokens, "pieces do not round-trip"
    r = get_renderer("kimi-k2.5", tok, thinking=False)
    n_prompt = len(r.prompt_ids([{"role": "user", "content": PROMPT}]))
    n_completion = len(r.completion_ids({"role": "assistant", "content": text}))
    return pieces, n_prompt, n_completion


# -- the server ----------------------------------------------------------------------------------
class Pacer:
    """One timer for every stream: a wheel of `tick`-second slots, each holding the streams
    whose next token is due in it; every due stream gets one token per write."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pieces: list[str], rate: float,
                 n_prompt: int, n_completion: int, tick: float = 0.002):
        import orjson

        self.loop = loop
        self.rate = rate
        self.tick = tick
        self.slots: dict[int, list[Stream]] = {}
        self.cursor = int(loop.time() / tick)
        self.events = 0
        self.started = 0
        self.done = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.open = 0
        self.peak_open = 0
        # a chunk = hex size + CRLF + per-stream prefix + per-token body + CRLF
        self.prefix_len = len(self.prefix(0))
        self.bodies: list[bytes] = []
        self.heads: list[bytes] = []
        for p in pieces:
            body = (b',"choices":[{"index":0,"delta":{"content":' + orjson.dumps(p)
                    + b'},"finish_reason":null}]}\n\n')
            self.heads.append(b"%x\r\n" % (self.prefix_len + len(body)))
            self.bodies.append(body + b"\r\n")
        self.finish = (b',"choices":[{"index":0,"delta":{},"finish_reason":"stop",'
                       b'"native_finish_reason":"stop"}]}\n\n')
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                 "total_tokens": n_prompt + n_completion, "cost": 0.0}
        self.usage = b',"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\n"
        self.handle = loop.call_at((self.cursor + 1) * tick, self.run)

    @staticmethod
    def prefix(n: int) -> bytes:
        return (b'data: {"id":"gen-%010d","object":"chat.completion.chunk","created":1700000000,'
                b'"model":"moonshotai/kimi-k2.5","provider":"Bench"' % n)

    def start(self, stream: Stream) -> None:
        now = self.loop.time()
        if self.first_at is None:
            self.first_at = time.time()
        self.started += 1
        self.open += 1
        self.peak_open = max(self.peak_open, self.open)
        stream.t0 = now
        self.slots.setdefault(max(int(now / self.tick), self.cursor), []).append(stream)

    def run(self) -> None:
        now = self.loop.time()
        upto = int(now / self.tick)
        slots, tick, rate = self.slots, self.tick, self.rate
        heads, bodies, n_tokens = self.heads, self.bodies, len(self.bodies)
        written = 0
        for slot in range(self.cursor, upto + 1):
            due = slots.pop(slot, None)
            if not due:
                continue
            for s in due:
                tr = s.transport
                if tr.is_closing():
                    self.open -= 1
                    continue
                k = s.k
                tr.write(heads[k] + s.prefix + bodies[k])
                written += 1
                k += 1
                s.k = k
                if k == n_tokens:
                    self.end(s)
                    continue
                at = int((s.t0 + k / rate) / tick)
                slots.setdefault(at if at > upto else upto + 1, []).append(s)
        self.events += written
        self.cursor = upto + 1
        self.handle = self.loop.call_at((upto + 1) * tick, self.run)

    def end(self, s: Stream) -> None:
        tail = b"".join(s.prefix + part for part in (self.finish, self.usage))
        s.transport.write(b"%x\r\n%s\r\n" % (len(tail) + 14, tail + b"data: [DONE]\n\n")
                          + b"0\r\n\r\n")
        self.done += 1
        self.open -= 1
        self.last_at = time.time()
        s.proto.busy = False


class Stream:
    __slots__ = ("transport", "proto", "prefix", "k", "t0")

    def __init__(self, proto: Conn, n: int):
        self.proto = proto
        self.transport = proto.transport
        self.prefix = Pacer.prefix(n)
        self.k = 0
        self.t0 = 0.0


class Conn(asyncio.Protocol):
    """HTTP/1.1 keep-alive: a POST to /v1/chat/completions starts a paced stream; GET /stats
    answers the counters; anything else is a 404."""

    pacer: Pacer
    counter = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buf = b""
        self.busy = False

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < head_end + 4 + length:
                return
            self.buf = self.buf[head_end + 4 + length:]
            method, path = head.split(" ", 2)[:2]
            self.request(method, path)

    def request(self, method: str, path: str) -> None:
        p = self.pacer
        if method == "POST" and path.endswith("/chat/completions"):
            Conn.counter += 1
            self.busy = True
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
            p.start(Stream(self, Conn.counter))
            return
        if path == "/stats":
            body = json.dumps({
                "events": p.events, "started": p.started, "done": p.done, "open": p.open,
                "peak_open": p.peak_open, "first_at": p.first_at, "last_at": p.last_at,
                "cpu_s": time.process_time(), "user_s": os.times().user,
                "sys_s": os.times().system}).encode()
            status = b"200 OK"
        else:
            body, status = b'{"error":{"message":"not found","code":404}}', b"404 Not Found"
        self.transport.write(b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (status, len(body), body))


def serve(args: argparse.Namespace) -> None:
    """One server process: the streaming port (shared by `--server-procs` processes through
    SO_REUSEPORT) and a port of its own for its counters."""
    loop_name = try_uvloop()
    raise_nofile(args.streams * 2 + 1024)
    pieces, n_prompt, n_completion = answer(args.tokens)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        Conn.pacer = Pacer(loop, pieces, args.rate, n_prompt, n_completion)
        server = await loop.create_server(Conn, "127.0.0.1", args.port, backlog=16384,
                                          reuse_port=True)
        stats_server = await loop.create_server(Conn, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        stats_port = stats_server.sockets[0].getsockname()[1]
        print(f"PORT {port} {stats_port} {loop_name}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


# -- the clients (each in a child process) -------------------------------------------------------
class CpuClock:
    """(wall, process CPU) samples every 20 ms, so the CPU of any window can be read after."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), time.process_time()))
            self._stop.wait(0.02)

    def cpu_between(self, t0: float, t1: float) -> float:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time(), time.process_time()))

        def at(t: float) -> float:
            prev = self.samples[0]
            for s in self.samples:
                if s[0] >= t:
                    if s[0] == prev[0]:
                        return s[1]
                    return prev[1] + (s[1] - prev[1]) * (t - prev[0]) / (s[0] - prev[0])
                prev = s
            return prev[1]

        return at(t1) - at(t0)


def request_body() -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 4096, "stream": True, "stream_options": {"include_usage": True}}


async def lean(url: str, n: int, conc: int) -> dict[str, Any]:
    import json as stdjson

    import aiohttp

    raise_nofile(conc * 2 + 1024)
    payload = stdjson.dumps(request_body()).encode()
    sem = asyncio.Semaphore(conc)
    tokens = 0
    answers = 0
    ends: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=None)) as s:
        async def one() -> None:
            nonlocal tokens, answers
            async with sem, s.post(url + "/chat/completions", data=payload,
                                   headers={"Content-Type": "application/json"}) as r:
                parts = []
                async for line in r.content:
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        break
                    chunk = stdjson.loads(data)
                    if chunk["choices"]:
                        text = chunk["choices"][0]["delta"].get("content")
                        if text:
                            parts.append(text)
                tokens += len(parts)
                answers += 1
                ends.append(time.time())
        t0 = time.time()
        await asyncio.gather(*(one() for _ in range(n)))
    return {"answers": answers, "tokens": tokens, "t0": t0, "t1": max(ends)}


async def client_only(url: str, n: int, conc: int, tokens_each: int,
                      tick_ms: float | None) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "src"))
    import gc

    from specgen.client import ChatClient
    from specgen.engine.runner import RUN_GC_THRESHOLD

    gc.freeze()  # the collector as a specgen run tunes it
    gc.set_threshold(*RUN_GC_THRESHOLD)
    tick = {} if tick_ms is None else {"stream_tick": tick_ms / 1000}

    body = request_body()
    sem = asyncio.Semaphore(conc)
    tokens = 0
    answers = 0
    ends: list[float] = []
    async with ChatClient(url, api_key="bench", concurrency=conc, **tick) as client:
        async def one() -> None:
            nonlocal tokens, answers
            async with sem:
                r = await client.chat(body)
            tokens += tokens_each if r.content else 0
            answers += 1
            ends.append(time.time())
        t0 = time.time()
        await asyncio.gather(*(one() for _ in range(n)))
    return {"answers": answers, "tokens": tokens, "t0": t0, "t1": max(ends)}


def specgen_run(url: str, n: int, conc: int, tokens_each: int, workdir: Path,
                tick_ms: float | None, event_loop: str) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "src"))
    from specgen.config import load_config
    from specgen.engine.runner import RunOptions, run
    from specgen.store import Store

    data = workdir / f"rows-{n}.jsonl"
    if not data.exists():
        with data.open("w") as f:
            for i in range(n):
                f.write(json.dumps({"id": f"r{i}", "messages": [
                    {"role": "user", "content": PROMPT}]}) + "\n")
    run_dir = workdir / f"run-{os.getpid()}"
    tick = "" if tick_ms is None else f"stream_tick_ms = {tick_ms:g}\n"
    cfg_path = workdir / f"run-{os.getpid()}.toml"
    _common.run_config(
        cfg_path, run_dir=run_dir, model=MODEL, url=url, data=data, n=n,
        endpoint=f"concurrency = {conc}\nstream = true\nreturn_token_ids = false\n"
                 f'fetch_endpoints = false\ndialect = "openrouter"\nmax_attempts = 2\n{tick}',
        sampling="max_tokens = 4096\nreasoning = false",
        engine=f'log_interval = 60\nevent_loop = "{event_loop}"')
    outcome = run(load_config(cfg_path), RunOptions(live=False))
    with Store.open(run_dir) as s:
        t0, t1, ok = s.conn.execute(
            "SELECT MIN(started_at), MAX(ended_at), SUM(outcome='ok') FROM attempts").fetchone()
        outcomes = dict(s.conn.execute(
            "SELECT outcome, COUNT(*) FROM attempts GROUP BY outcome").fetchall())
        checks = dict(s.conn.execute(
            "SELECT count_check, COUNT(*) FROM results GROUP BY count_check").fetchall())
        starts = sorted(r[0] for r in s.conn.execute("SELECT started_at FROM attempts"))
        firsts = sorted(r[0] - r[1] for r in s.conn.execute(
            "SELECT first_byte_at, started_at FROM attempts WHERE first_byte_at IS NOT NULL"))
    return {"answers": int(ok or 0), "tokens": int(ok or 0) * tokens_each, "t0": t0, "t1": t1,
            "state": outcome.state, "outcomes": outcomes, "count_checks": checks,
            "last_start_s": starts[-1] - starts[0] if starts else None,
            "first_byte_p50_s": firsts[len(firsts) // 2] if firsts else None,
            "first_byte_max_s": firsts[-1] if firsts else None}


def child(args: argparse.Namespace) -> None:
    import logging

    if args.loop == "uvloop":
        try_uvloop()
    logging.getLogger("specgen").setLevel(logging.WARNING)
    clock = CpuClock()
    if args.child == "lean":
        out = asyncio.run(lean(args.url, args.requests, args.streams))
    elif args.child == "client":
        out = asyncio.run(client_only(args.url, args.requests, args.streams, args.tokens,
                                      args.tick_ms))
    else:
        out = specgen_run(args.url, args.requests, args.streams, args.tokens,
                          Path(args.workdir), args.tick_ms, args.engine_loop)
    out["cpu_window"] = clock.cpu_between(out["t0"], out["t1"])
    print("RESULT " + json.dumps(out), flush=True)


# -- the driver ----------------------------------------------------------------------------------
def stats(port: int) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as r:
        return json.loads(r.read())


def start_servers(args: argparse.Namespace, cores: tuple) -> tuple[list, int, list[int], str]:
    """(processes, streaming port, stats ports, their event loop)."""
    procs, stats_ports, port, loop_name = [], [], 0, "?"
    for i in range(args.server_procs):
        cmd = [sys.executable, "-P", __file__, "--serve", "--streams", str(args.streams),
               "--rate", str(args.rate), "--tokens", str(args.tokens), "--port", str(port)]
        # one server process: its own core; several: wherever the scheduler finds room
        cpu = cores[1] if args.server_procs == 1 else None
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                preexec_fn=_common.pin(cpu))
        procs.append(proc)
        line = proc.stdout.readline().split()  # type: ignore[union-attr]
        if not line or line[0] != "PORT":
            for p in procs:
                p.terminate()
            raise SystemExit(f"server {i} did not start: {line}")
        port, loop_name = int(line[1]), line[3]
        stats_ports.append(int(line[2]))
    return procs, port, stats_ports, loop_name


def server_stats(ports: list[int]) -> dict[str, Any]:
    parts = [stats(p) for p in ports]
    firsts = [x["first_at"] for x in parts if x["first_at"]]
    lasts = [x["last_at"] for x in parts if x["last_at"]]
    out = {k: sum(x[k] for x in parts) for k in ("events", "peak_open", "cpu_s", "sys_s")}
    out.update(first_at=min(firsts) if firsts else None, last_at=max(lasts) if lasts else None)
    return out


def measure(mode: str, args: argparse.Namespace, workdir: Path, cores: tuple) -> dict[str, Any]:
    servers, port, stats_ports, server_loop = start_servers(args, cores)
    try:
        srv0 = server_stats(stats_ports)
        cmd = [sys.executable, "-P", __file__, "--child", mode, "--url",
               f"http://127.0.0.1:{port}/v1", "--requests", str(args.requests), "--streams",
               str(args.streams), "--tokens", str(args.tokens), "--workdir", str(workdir),
               "--loop", args.loop, "--engine-loop", args.engine_loop]
        if args.tick_ms is not None:
            cmd += ["--tick-ms", str(args.tick_ms)]
        status, ru, out, err = _common.run_measured(
            cmd, cpu=cores[0], child_env={**os.environ, "SPECGEN_BENCH_KEY": "bench"})
        srv = server_stats(stats_ports)
    finally:
        for server in servers:
            server.terminate()
            server.wait()
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{mode} failed (status {status}): {err[-3000:]}")
    res = json.loads(line[7:])
    wall = res["t1"] - res["t0"]
    tokens = max(res["tokens"], 1)
    ideal = args.tokens / args.rate
    waves = -(-args.requests // args.streams)
    res.update(
        mode=mode, wall=wall, ideal=ideal * waves,
        us_per_token=res["cpu_window"] * 1e6 / tokens,
        us_per_token_process=(ru.ru_utime + ru.ru_stime) * 1e6 / tokens,
        sys_share=ru.ru_stime / max(ru.ru_utime + ru.ru_stime, 1e-9),
        events_s=res["tokens"] / wall if wall > 0 else 0.0,
        offered=args.streams * args.rate, rss_mb=ru.ru_maxrss / 1024,
        server_cpu_share=(srv["cpu_s"] - srv0["cpu_s"]) / wall if wall > 0 else 0.0,
        server_sys_share=(srv["sys_s"] - srv0["sys_s"]) / wall if wall > 0 else 0.0,
        server_events=srv["events"], server_peak_open=srv["peak_open"], server_loop=server_loop)
    return res


def main() -> None:
    if not sys.flags.safe_path:  # bench/tokenize.py would shadow the stdlib's
        os.execv(sys.executable, [sys.executable, "-P", __file__, *sys.argv[1:]])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=2000, help="streams at once")
    ap.add_argument("--rate", type=float, default=40.0, help="tokens/s per stream")
    ap.add_argument("--tokens", type=int, default=400, help="tokens per answer")
    ap.add_argument("--requests", type=int, help="answers in all (default: --streams)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="lean,specgen")
    ap.add_argument("--loop", default="auto", choices=("auto", "asyncio", "uvloop"),
                    help="the lean and client loops' event loop (specgen run picks its own)")
    ap.add_argument("--engine-loop", default="auto", choices=("auto", "asyncio", "uvloop"),
                    help="[engine] event_loop for specgen run")
    ap.add_argument("--tick-ms", type=float,
                    help="[endpoint] stream_tick_ms of specgen run and the client")
    ap.add_argument("--no-pin", action="store_true", help="do not pin server and client")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--server-procs", type=int, default=1,
                    help="server processes sharing the port (pinned to a core only when one)")
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.requests = args.requests or args.streams
    if args.serve:
        serve(args)
        return
    if args.child:
        child(args)
        return
    if args.loop == "auto":
        args.loop = "asyncio"  # the lean reader as people write it
    cores: tuple = (None, None) if args.no_pin else _common.cpus()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    print(_common.machine_note())
    print(f"{args.streams:,} streams x {args.rate:g} tok/s x {args.tokens} tokens, "
          f"{args.requests:,} answers, one token per write; offered "
          f"{args.streams * args.rate:,.0f} events/s; lean/client loop {args.loop}; "
          f"specgen run: event_loop {args.engine_loop}, stream_tick_ms "
          f"{args.tick_ms if args.tick_ms is not None else 'default'}; "
          f"cores client/server {cores}, {args.server_procs} server process(es)")
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="specgen-streams-") as tmp:
        for r in range(args.runs):
            for mode in modes:
                res = measure(mode, args, Path(tmp), cores)
                results[mode].append(res)
                extra = ""
                if mode == "specgen":
                    extra = (f"  {res['state']} {res['outcomes']} {res['count_checks']}; "
                             f"last request sent {res['last_start_s']:.2f}s after the first, "
                             f"headers p50/max {res['first_byte_p50_s']:.3f}/"
                             f"{res['first_byte_max_s']:.3f}s")
                print(f"run {r + 1} {mode:7s} {res['answers']:>6,} answers "
                      f"{res['us_per_token']:6.2f} us/token (process {res['us_per_token_process']:6.2f}, "
                      f"sys {100 * res['sys_share']:2.0f}%)"
                      f"  {res['events_s']:9,.0f} ev/s  wall {res['wall']:6.2f}s / ideal "
                      f"{res['ideal']:5.1f}s  RSS {res['rss_mb']:6.1f} MB  server CPU "
                      f"{100 * res['server_cpu_share']:3.0f}% (sys {100 * res['server_sys_share']:3.0f}%, "
                      f"{res['server_loop']}){extra}",
                      flush=True)
    print("\nmedians:")
    print("| client | CPU µs/token (window) | vs lean | CPU µs/token (process) | events/s "
          f"(offered {args.streams * args.rate:,.0f}) | wall / ideal | streams open at once "
          "(server) | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    lean_cpu = (statistics.median(x["us_per_token"] for x in results["lean"])
                if "lean" in results else None)
    for mode, rs in results.items():
        def med(key: str, rs: list[dict[str, Any]] = rs) -> float:
            return statistics.median(x[key] for x in rs)
        ratio = f"{med('us_per_token') / lean_cpu:.2f}x" if lean_cpu else "-"
        print(f"| {mode} | {med('us_per_token'):.2f} | {ratio} | "
              f"{med('us_per_token_process'):.2f} | {med('events_s'):,.0f} | "
              f"{med('wall'):.2f} s / {rs[0]['ideal']:.1f} s "
              f"({100 * (med('wall') / rs[0]['ideal'] - 1):+.0f}%) | "
              f"{med('server_peak_open'):,.0f} | {med('rss_mb'):.0f} MB |")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": _common.machine_note(), "args": vars(args),
                                               "results": results}, indent=1))


if __name__ == "__main__":
    main()
