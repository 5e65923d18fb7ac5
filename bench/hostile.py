"""Hostile-stream benchmark (not a test): one answer that is a repetition loop.

A model stuck in a loop until `max_tokens` streams a run of byte-identical events. This script
serves such answers — N events each carrying the same one-token piece (`" the"`), then a
finish chunk and a usage chunk counting them — from a small threaded HTTP server, and runs a
real `specgen run` (engine, client, witness, store) on one prompt against it, for N = 1k, 8k,
64k. Two write patterns: one event per write (`--per-write 1`) and many per write.

Reported per size: the run's CPU time (user + system of the child process) with the start-up
subtracted (a run answering a 16-token answer), divided by N: µs of CPU per token. Medians over
`--runs`. Linear code gives the same figure at every size.

    python -P bench/hostile.py                       # 1k, 8k, 64k; one and 256 events per write
    python -P bench/hostile.py --sizes 1000 32000 --runs 5
    SPECGEN_BENCH_SRC=/other/checkout/src python -P bench/hostile.py   # another version

`serve()` is also what `tests/test_hostile_streams.py` runs its server with.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "moonshotai/kimi-k2.5"
PIECE = " the"


def event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def feed_loop(parser, rep: bytes, end: bytes, first: bytes, n: int, per_feed: int):
    """Feed `parser` a loop of n repeated events, `per_feed` at a time; its finished answer."""
    parser.feed(first)
    block = rep * per_feed
    left = n
    while left > 0:
        k = min(per_feed, left)
        parser.feed(block if k == per_feed else rep * k)
        left -= k
    parser.feed(end)
    return parser.finish()


def answer_events(tokens: int, *, piece: str = PIECE, usage: dict | None = None,
                  finish: str = "stop", provider: object = "Loop", model: object = MODEL,
                  extra: dict | None = None) -> tuple[bytes, bytes, bytes]:
    """(the repeated event, the ending, the first event) of an N-token repetition loop
    (`extra`: more top-level fields of every chunk)."""
    head = {"id": "gen-loop", "provider": provider, "model": model, **(extra or {}),
            "object": "chat.completion.chunk", "created": 1}
    first = event({**head, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                               "content": ""},
                                        "finish_reason": None}]})
    rep = event({**head, "choices": [{"index": 0, "delta": {"content": piece},
                                      "finish_reason": None}]})
    if usage is None:
        usage = {"prompt_tokens": 0, "completion_tokens": tokens,
                 "total_tokens": tokens, "cost": 0.0}
    end = (event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish,
                                       "native_finish_reason": finish}]})
           + event({**head, "choices": [], "usage": usage}) + b"data: [DONE]\n\n")
    return rep, end, first


def serve(tokens_for, per_write: int = 1, usage_for=None, finish: str = "stop",
          endpoints: list | None = None, doubled: bool = False, distinct: bool = False,
          **head):
    """A threaded HTTP server on 127.0.0.1 answering every chat request with a repetition
    loop of `tokens_for(body)` tokens, `per_write` events per socket write; returns
    (server, base_url). `usage_for(body, tokens)` may replace the usage object; `head`:
    `provider`, `model`, `extra` of `answer_events`; `endpoints`: the endpoint list served at
    GET .../endpoints; `distinct`: distinct pieces instead of one repeated (`doubled`: each
    event sent twice)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def do_GET(self):  # noqa: N802
            body = json.dumps({"data": {"endpoints": endpoints or []}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            tokens = tokens_for(body)
            usage = usage_for(body, tokens) if usage_for else None
            rep, end, first = answer_events(tokens, usage=usage, finish=finish, **head)
            if doubled or distinct:  # distinct words (each sent twice: a doubling relay)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                out = [first]
                for i in range(tokens):
                    ev = answer_events(1, piece=f" w{i}", **head)[0]
                    out += [ev, ev] if doubled else [ev]
                self.wfile.write(b"".join(out) + end)
                self.close_connection = True
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                self.wfile.write(first)
                block = rep * per_write
                left = tokens
                while left > 0:
                    k = min(per_write, left)
                    self.wfile.write(block if k == per_write else rep * k)
                    left -= k
                self.wfile.write(end)
            except OSError:  # the client closed it: a stream it did not read to its end
                self.server.broken_off += 1  # type: ignore[attr-defined]
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.broken_off = 0  # type: ignore[attr-defined]  # streams the client cut short
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def write_run(tmp: Path, base_url: str, name: str, max_tokens: int = 200_000,
              endpoint: str = "") -> Path:
    data = tmp / f"{name}.jsonl"
    data.write_text(json.dumps({"id": "q0", "messages": [
        {"role": "user", "content": "Say the word, again and again."}]}) + "\n")
    cfg = tmp / f"{name}.toml"
    cfg.write_text(f"""run_dir = {json.dumps(str(tmp / (name + '-dir')))}
[target]
model = "{MODEL}"
tokenizer = "demo"
[endpoint]
base_url = {json.dumps(base_url)}
api_key_env = "SPECGEN_BENCH_NO_KEY"
max_attempts = 1
{endpoint}
[sampling]
max_tokens = {max_tokens}
[engine]
commit_interval = 0.05
[[dataset]]
name = "loop"
path = {json.dumps(str(data))}
""")
    return cfg


def run_cpu(cfg: Path, env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """CPU seconds (user + system) of one `specgen run` of `cfg`, and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([sys.executable, "-P", "-m", "specgen", "run", str(cfg), "--no-live"],
                         capture_output=True, text=True, timeout=1800,
                         env={**os.environ, **(env or {}),
                              "PYTHONPATH": os.environ.get("SPECGEN_BENCH_SRC",
                                                           str(ROOT / "src"))})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, res


def cpu_per_token(sizes: list[int], per_write: int, runs: int) -> dict[int, float]:
    """µs of CPU per token of a real run answering one N-token loop, start-up subtracted."""
    wanted = {"n": 0}
    server, url = serve(lambda body: wanted["n"], per_write=per_write)
    out: dict[int, float] = {}
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            k = 0

            def one(n: int) -> float:
                nonlocal k
                k += 1
                wanted["n"] = n
                cpu, res = run_cpu(write_run(tmp, url, f"r{k}"))
                if res.returncode not in (0, 4):
                    raise SystemExit(f"run failed ({res.returncode}): {res.stderr[-2000:]}")
                return cpu

            base = statistics.median(one(16) for _ in range(runs))
            for n in sizes:
                cpu = statistics.median(one(n) for _ in range(runs))
                out[n] = max(cpu - base, 0.0) / n * 1e6
    finally:
        server.shutdown()
    return out


def parse_per_token(n: int, per_feed: int, runs: int) -> float:
    """µs of CPU per token to parse an n-event loop fed `per_feed` events at a time, finish
    it and build the witness's dedup candidates (in this process: no start-up noise)."""
    sys.path.insert(0, os.environ.get("SPECGEN_BENCH_SRC", str(ROOT / "src")))
    from specgen.client.parse import StreamParser
    from specgen.quality.repairs import dedup_candidates

    rep, end, first = answer_events(n)
    best = []
    for _ in range(runs):
        t0 = time.process_time()
        dedup_candidates(feed_loop(StreamParser(), rep, end, first, n, per_feed))
        best.append(time.process_time() - t0)
    return statistics.median(best) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 8000, 64000])
    ap.add_argument("--per-write", type=int, nargs="+", default=[1, 256])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--parser-only", action="store_true", help="skip the real runs")
    a = ap.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; median of {a.runs} runs")
    for pw in a.per_write:
        row = "  ".join(f"N={n}: {parse_per_token(n, pw, a.runs):7.2f}" for n in a.sizes)
        print(f"parser + dedup candidates, {pw:>3} event(s) per read, µs/token:  {row}")
    if a.parser_only:
        return
    for pw in a.per_write:
        figures = cpu_per_token(a.sizes, pw, a.runs)
        row = "  ".join(f"N={n}: {us:7.1f}" for n, us in figures.items())
        print(f"specgen run (start-up subtracted), {pw:>3} event(s) per write, µs/token:  "
              f"{row}")


if __name__ == "__main__":
    main()
