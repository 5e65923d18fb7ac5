"""Loop-stall benchmark (not a test): one huge answer among many small streams in flight.

A real `specgen run` against a small threaded HTTP server on 127.0.0.1: every prompt but one
is answered by a slow stream (`--events` one-word events, one every `--gap` s, with counts),
and one prompt, sent while those streams are in flight, by a huge answer near
`[endpoint] max_answer_bytes` (`--huge-mib` MiB of distinct words, written as fast as the
socket takes it, with a completion count that does not match: the witness tries its
candidates too). The run's `specgen.log` says the longest time its event loop was held
("event loop: longest stall N ms", measured by the engine's periodic tick) and, for an answer
judged off the loop, how long that took; both are printed.

    python -P bench/stall.py                                  # 3 MiB among 240 streams
    python -P bench/stall.py --huge-mib 0                     # no huge answer: the baseline
    python -P bench/stall.py --tokenizer /path/to/kimi-k2.5   # a real vocabulary
    SPECGEN_BENCH_SRC=/other/checkout/src python -P bench/stall.py   # another version

`serve()`, `write_run()` and `figures()` are what `tests/test_loop_stall.py` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "moonshotai/kimi-k2.5"
HUGE = "HUGE"  # the prompt that gets the huge answer


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunk(text: str) -> bytes:
    return _event({"id": "gen-1", "model": MODEL, "provider": "Stall",
                   "choices": [{"index": 0, "delta": {"content": text}}]})


def _end(tokens: int) -> bytes:
    return (_event({"id": "gen-1", "model": MODEL, "provider": "Stall", "choices": [
        {"index": 0, "delta": {}, "finish_reason": "stop"}]})
            + _event({"id": "gen-1", "model": MODEL, "provider": "Stall", "choices": [],
                      "usage": {"prompt_tokens": 1, "completion_tokens": tokens,
                                "total_tokens": tokens + 1}})
            + b"data: [DONE]\n\n")


def huge_body(mib: float) -> bytes:
    """About `mib` MiB of distinct words as stream events of 64 words each."""
    out, size, i = [], 0, 0
    while size < mib * 2**20:
        text = "".join(f" w{k}" for k in range(i, i + 64))
        i += 64
        size += len(text)
        out.append(_chunk(text))
    return b"".join(out) + _end(i)  # one count per word: not ours, the witness works


def serve(huge_mib: float, events: int, gap: float):
    """(server, base_url, stats): slow small streams for every prompt, the huge answer for
    the prompt holding HUGE; `stats["huge_sent_at"]` is when its last byte was written."""
    huge = huge_body(huge_mib) if huge_mib else b""
    stats: dict[str, float] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                if HUGE in json.dumps(body.get("messages")):
                    self.wfile.write(huge)
                    stats["huge_sent_at"] = time.time()
                else:
                    for k in range(events):
                        self.wfile.write(_chunk(f" word{k}"))
                        self.wfile.flush()
                        time.sleep(gap)
                    self.wfile.write(_end(events))
            except OSError:
                pass
            self.close_connection = True

    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1", stats


def write_run(tmp: Path, base_url: str, *, small: int, huge_at: int | None,
              tokenizer: str = "demo", concurrency: int = 256,
              max_answer_bytes: int = 4 * 2**20) -> Path:
    rows = [{"id": f"s{i}", "messages": [{"role": "user", "content": f"small {i}"}]}
            for i in range(small)]
    if huge_at is not None:
        rows.insert(huge_at, {"id": "huge", "messages": [
            {"role": "user", "content": f"{HUGE}: write a lot"}]})
    data = tmp / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp / "run.toml"
    cfg.write_text(f"""run_dir = {json.dumps(str(tmp / 'run-dir'))}
[target]
model = "{MODEL}"
tokenizer = {json.dumps(tokenizer)}
[endpoint]
base_url = {json.dumps(base_url)}
api_key_env = "SPECGEN_BENCH_NO_KEY"
fetch_endpoints = false
concurrency = {concurrency}
min_concurrency = {concurrency}
max_attempts = 1
max_answer_bytes = {max_answer_bytes}
[sampling]
max_tokens = 1000000
[quality]
count_witness = false
[engine]
commit_interval = 0.05
[[dataset]]
name = "d"
path = {json.dumps(str(data))}
""")
    return cfg


def figures(log_text: str) -> dict:
    """What a run's specgen.log says: `stall_ms` (the longest stall of the event loop) and,
    when an answer was judged off the loop, of the longest such judging: `off_loop_s` (how
    long), `meanwhile_ms` (the loop's longest stall meanwhile), `turns` (the loop's stall
    probes that woke meanwhile) and `thread` (the name of the thread that judged it)."""
    out: dict = {}
    stalls = re.findall(r"event loop: longest stall (\d+) ms", log_text)
    if stalls:
        out["stall_ms"] = float(stalls[-1])
    off = re.findall(r"judged off the event loop in ([\d.]+) s \(the loop's longest stall "
                     r"meanwhile: (\d+) ms; (\d+) turns of the loop meanwhile; judged in "
                     r"thread (.+?)\)$", log_text, re.M)
    if off:
        s, ms, turns, thread = max(off, key=lambda m: float(m[0]))
        out.update(off_loop_s=float(s), meanwhile_ms=float(ms), turns=int(turns),
                   thread=thread)
    return out


def run(cfg: Path, env: dict | None = None, timeout: float = 600
        ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "specgen", "run", str(cfg), "--no-live"],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {}),
                               "PYTHONPATH": os.environ.get("SPECGEN_BENCH_SRC",
                                                            str(ROOT / "src"))})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--huge-mib", type=float, default=3.0)
    ap.add_argument("--small", type=int, default=240, help="small streams")
    ap.add_argument("--events", type=int, default=40, help="events of a small stream")
    ap.add_argument("--gap", type=float, default=0.05, help="seconds between its events")
    ap.add_argument("--tokenizer", default="demo")
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    server, url, _ = serve(a.huge_mib, a.events, a.gap)
    try:
        for _ in range(a.runs):
            with tempfile.TemporaryDirectory() as d:
                tmp = Path(d)
                cfg = write_run(tmp, url, small=a.small,
                                huge_at=a.small // 4 if a.huge_mib else None,
                                tokenizer=a.tokenizer)
                t0 = time.monotonic()
                res = run(cfg)
                wall = time.monotonic() - t0
                log = (tmp / "run-dir" / "specgen.log").read_text()
                print(f"exit {res.returncode}, {wall:.1f} s: {figures(log)}")
                if res.returncode not in (0, 6):
                    print(res.stderr[-2000:])
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
