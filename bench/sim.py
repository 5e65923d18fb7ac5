"""Benchmark of `specgen sim` (not a test). Results go in docs/benchmarks/sim.md.

Two scenarios, each against a fresh `specgen sim` process, driven by a SEPARATE load-generator
process (`wrk` when installed, else an aiohttp client in a child process), so the server's
core is measured alone:

1. throughput: zero latency, 200-token completions, non-streaming. Reports requests/s (wall)
   and requests per CPU-second of the server process (its capacity on one core, even when the
   load generator, sharing the machine, is the bottleneck).
2. hold: 1 s latency to first token, 5,000 concurrent requests. Reports the peak of open
   requests inside the server and its peak RSS.
3. loop: 1 s latency, 2,000 keep-alive connections each re-sending as soon as it is answered
   (the engine benchmark's load, ~2,000 req/s). Reports requests/s, how busy the server's
   core was (CPU seconds / wall seconds), CPU per request and wrk's latency percentiles: the
   simulator must stay far from saturated so that clients measure themselves.

Run:  .venv/bin/python bench/sim.py [--runs 5] [--seconds 5] [--hold 5000] [--loop 2000]
                                    [--only throughput|hold|loop] [--client aiohttp]
Prints the median over the runs, with the machine noted.

`--inprocess N` instead runs N requests straight through the chat handler (aiohttp's mocked
request, no sockets) and prints microseconds per request; under
`valgrind --tool=cachegrind --cache-sim=no` the difference between two N gives instructions per
request, a number a busy machine does not disturb (docs/benchmarks/sim.md).
`--baseline` serves a fixed 2.5 KB JSON answer with plain aiohttp: the framework's own cost
per request, to compare with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BODY = {
    "model": "moonshotai/kimi-k2.5",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Tell me about the weather in Paris today, please."},
    ],
    "max_tokens": 1024,
}
CONFIG = """
seed = 0
[length]
distribution = "fixed"
tokens = 200
min = 200
max = 200
[[providers]]
name = "Bench"
tag = "bench"
latency_s = {latency}
"""


def start_server(latency: float, workdir: Path, baseline: bool = False
                 ) -> tuple[subprocess.Popen, str]:
    cfg = workdir / f"sim-{latency}.toml"
    cfg.write_text(CONFIG.format(latency=latency))
    cmd = ([sys.executable, __file__, "--serve-baseline"] if baseline else
           [sys.executable, "-m", "specgen", "sim", "--port", "0", "--config", str(cfg)])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    line = proc.stdout.readline().strip()
    if not line.startswith("specgen sim listening on "):
        proc.kill()
        raise SystemExit(f"sim did not start: {line!r} {proc.stderr.read()[-2000:]}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain
    return proc, line.rsplit(" ", 1)[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def stats(root: str) -> dict:
    with urllib.request.urlopen(root + "/sim/stats", timeout=30) as r:
        return json.load(r)


# -- load generators ------------------------------------------------------------------------
def wrk_load(url: str, seconds: float, connections: int, workdir: Path) -> None:
    subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
                    "--timeout", "30s", "-s", str(_wrk_script(workdir)), url],
                   check=True, capture_output=True)


def _aiohttp_worker(url: str, seconds: float, concurrency: int, out) -> None:
    import aiohttp

    async def main() -> None:
        done = errors = 0
        deadline = time.monotonic() + seconds
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:
            async def loop(k: int) -> None:
                nonlocal done, errors
                n = 0
                while time.monotonic() < deadline:
                    n += 1
                    body = json.dumps(BODY).replace("Paris", f"Paris #{k}.{n}").encode()
                    async with s.post(url, data=body,
                                      headers={"Content-Type": "application/json"}) as r:
                        await r.read()
                        done += r.status == 200
                        errors += r.status != 200
            await asyncio.gather(*(loop(k) for k in range(concurrency)))
        out.put((done, errors))

    asyncio.run(main())


def aiohttp_load(url: str, seconds: float, connections: int) -> None:
    q: mp.Queue = mp.Queue()
    p = mp.Process(target=_aiohttp_worker, args=(url, seconds, connections, q))
    p.start()
    q.get()
    p.join()


def _hold_worker(url: str, n: int, out) -> None:
    import resource

    import aiohttp

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1000), hard))

    async def main() -> None:
        conn = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
            async def one(k: int) -> int:
                body = json.dumps(BODY).replace("Paris", f"Paris #{k}").encode()
                async with s.post(url, data=body,
                                  headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    return r.status
            t0 = time.monotonic()
            statuses = await asyncio.gather(*(one(k) for k in range(n)), return_exceptions=True)
            out.put((time.monotonic() - t0, sum(1 for x in statuses if x == 200)))

    asyncio.run(main())


# -- scenarios ------------------------------------------------------------------------------
def serve_baseline() -> None:
    """Plain aiohttp answering every POST with a fixed 2.5 KB JSON body (and counting)."""
    from aiohttp import web

    body = json.dumps({"choices": [{"message": {"content": "x" * 2500}}]}).encode()
    count = {"completed": 0}

    async def chat(request: web.Request) -> web.Response:
        json.loads(await request.content.read())
        count["completed"] += 1
        return web.Response(body=body, content_type="application/json")

    async def stats_(request: web.Request) -> web.Response:
        return web.json_response(count)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/api/v1/chat/completions", chat)
        app.router.add_get("/sim/stats", stats_)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        print(f"specgen sim listening on http://127.0.0.1:{port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def throughput(args, workdir: Path, baseline: bool = False) -> list[tuple[float, float]]:
    proc, root = start_server(0.0, workdir, baseline)
    url = root + "/api/v1/chat/completions"
    results = []
    try:
        use_wrk = args.client == "wrk" or (args.client == "auto" and shutil.which("wrk"))
        for run in range(args.runs + 1):
            before, cpu0, t0 = stats(root)["completed"], cpu_seconds(proc.pid), time.monotonic()
            if use_wrk:
                wrk_load(url, args.seconds, args.connections, workdir)
            else:
                aiohttp_load(url, args.seconds, args.connections)
            after, cpu1, t1 = stats(root)["completed"], cpu_seconds(proc.pid), time.monotonic()
            n = after - before
            if run == 0:
                continue  # warm-up
            results.append((n / (t1 - t0), n / max(cpu1 - cpu0, 1e-9)))
            print(f"  run {run}: {n} requests, {n / (t1 - t0):,.0f} req/s wall, "
                  f"{n / max(cpu1 - cpu0, 1e-9):,.0f} req per server CPU-second", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    return results


def _wrk_script(workdir: Path) -> Path:
    # Every request has its own user message (no two bodies alike), like a real run.
    head, tail = json.dumps(BODY).split("Paris")
    script = workdir / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        "local n = 0\n"
        "request = function()\n"
        "  n = n + 1\n"
        f"  return wrk.format(nil, nil, nil, {json.dumps(head)} .. 'Paris #' .. n .. {json.dumps(tail)})\n"
        "end\n"
    )
    return script


def hold(args, workdir: Path) -> list[tuple[int, float, float, int]]:
    """Open `args.hold` requests at once against 1 s latency; sample the server's open
    requests and RSS. With wrk: that many connections, each re-sending when answered (the
    first wave arrives together); else one wave from an aiohttp client process."""
    proc, root = start_server(1.0, workdir)
    url = root + "/api/v1/chat/completions"
    use_wrk = args.client == "wrk" or (args.client == "auto" and shutil.which("wrk"))
    results = []
    try:
        for run in range(args.runs):
            before = stats(root)["completed"]
            if use_wrk:
                p = subprocess.Popen(
                    ["wrk", "-t2", f"-c{args.hold}", "-d4s", "--timeout", "30s",
                     "-s", str(_wrk_script(workdir)), url],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                def alive(p=p) -> bool:
                    return p.poll() is None
            else:
                q: mp.Queue = mp.Queue()
                p = mp.Process(target=_hold_worker, args=(url, args.hold, q))
                p.start()
                def alive(p=p, q=q) -> bool:
                    return p.is_alive() and q.empty()
            t0 = time.monotonic()
            peak_open, peak_rss = 0, 0.0
            while alive():
                peak_open = max(peak_open, stats(root)["in_flight"])
                peak_rss = max(peak_rss, rss_mb(proc.pid))
                time.sleep(0.05)
            wall = time.monotonic() - t0
            if use_wrk:
                p.wait()
                # Let the requests still open when wrk stopped finish before the next run.
                while stats(root)["in_flight"]:
                    time.sleep(0.1)
            else:
                wall, _ = q.get()
                p.join()
            done = stats(root)["completed"] - before
            results.append((peak_open, peak_rss, wall, done))
            print(f"  run {run + 1}: peak open {peak_open}, peak RSS {peak_rss:.0f} MB, "
                  f"{done} answered in {wall:.2f} s", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    return results


def loop(args, workdir: Path) -> list[tuple[float, float, float, str]]:
    """`args.loop` connections against 1 s latency, each re-sending when answered (wrk);
    the server's CPU busy share over the run."""
    if not shutil.which("wrk"):
        raise SystemExit("the loop scenario needs wrk (apt-get install wrk)")
    proc, root = start_server(1.0, workdir)
    url = root + "/api/v1/chat/completions"
    results = []
    try:
        for run in range(args.runs + 1):
            before, cpu0, t0 = stats(root)["completed"], cpu_seconds(proc.pid), time.monotonic()
            out = subprocess.run(
                ["wrk", "-t2", f"-c{args.loop}", f"-d{max(2, round(args.seconds))}s", "--latency",
                 "--timeout", "30s", "-s", str(_wrk_script(workdir)), url],
                check=True, capture_output=True, text=True).stdout
            after, cpu1, t1 = stats(root)["completed"], cpu_seconds(proc.pid), time.monotonic()
            while stats(root)["in_flight"]:  # let the last wave finish before the next run
                time.sleep(0.1)
            if run == 0:
                continue  # warm-up (connections opening, caches filling)
            n = after - before
            busy = (cpu1 - cpu0) / (t1 - t0)
            pcts = {ln.split()[0]: ln.split()[1] for ln in out.splitlines()
                    if ln.strip().startswith(("50%", "99%"))}
            lat = f"p50 {pcts.get('50%', '?')}, p99 {pcts.get('99%', '?')}"
            results.append((n / (t1 - t0), busy, (cpu1 - cpu0) / max(n, 1), lat))
            print(f"  run {run}: {n / (t1 - t0):,.0f} req/s, server core {100 * busy:.0f}% busy, "
                  f"{1e6 * (cpu1 - cpu0) / max(n, 1):.0f} us CPU per request, latency {lat}",
                  flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    return results


def inprocess(n: int, profile: bool = False) -> None:
    """N requests through the server's HTTP parser and chat handler, no sockets: raw request
    bytes go into a connection whose transport collects the answers."""
    import gc

    from specgen.sim import load_sim_config
    from specgen.sim.http import HttpConnection
    from specgen.sim.server import Simulator

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sim.toml"
        path.write_text(CONFIG.format(latency=0.0))
        sim = Simulator(load_sim_config(path))

    class Transport:  # what the connection writes to
        def __init__(self) -> None:
            self.ok = 0

        def write(self, data: bytes) -> None:
            self.ok += data.startswith(b"HTTP/1.1 200 ")

        def get_extra_info(self, name: str, default=None):
            return default

    def http(raw: bytes) -> bytes:
        return (b"POST /api/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(raw) + raw)

    requests = [http(json.dumps(BODY).replace("Paris", f"Paris #{k}").encode()) for k in range(n)]

    async def run() -> float:
        sim.attach(asyncio.get_running_loop())
        transport = Transport()
        conn = HttpConnection(sim.handle, set())
        conn.connection_made(transport)
        gc.freeze()  # as `specgen sim` does once started
        gc.set_threshold(20_000, 20, 20)
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.process_time()
        for raw in requests:
            conn.data_received(raw)
        cpu = time.process_time() - t0
        if profile:
            prof.disable()
            st = pstats.Stats(prof)
            st.sort_stats("tottime").print_stats(30)
            if os.environ.get("SIM_PROFILE_CALLERS"):  # e.g. "of 'dict' objects"
                st.print_callers(os.environ["SIM_PROFILE_CALLERS"])
        assert transport.ok == n, transport.ok
        return cpu

    cpu = asyncio.run(run())
    print(f"in-process: {n} requests, {cpu / max(n, 1) * 1e6:.1f} us CPU per request "
          f"(HTTP parsing + handler, no sockets)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--hold", type=int, default=5000)
    ap.add_argument("--client", choices=("auto", "wrk", "aiohttp"), default="auto")
    ap.add_argument("--loop", type=int, default=2000, metavar="CONNECTIONS",
                    help="connections of the loop scenario (default 2000)")
    ap.add_argument("--only", choices=("throughput", "hold", "loop"))
    ap.add_argument("--inprocess", type=int, metavar="N")
    ap.add_argument("--profile", action="store_true", help="with --inprocess: cProfile it")
    ap.add_argument("--baseline", action="store_true",
                    help="also measure plain aiohttp with a fixed answer, for comparison")
    ap.add_argument("--serve-baseline", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_baseline:
        serve_baseline()
        return
    if args.inprocess is not None:
        inprocess(args.inprocess, args.profile)
        return
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, python "
          f"{platform.python_version()}; load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.only in (None, "throughput"):
            client = "wrk" if args.client != "aiohttp" and shutil.which("wrk") else "aiohttp"
            print(f"throughput: zero latency, 200-token completions, non-streaming, "
                  f"{args.connections} connections, client {client}")
            res = throughput(args, workdir)
            print(f"  median: {statistics.median(r[0] for r in res):,.0f} req/s wall, "
                  f"{statistics.median(r[1] for r in res):,.0f} req per server CPU-second")
            if args.baseline:
                print("baseline: plain aiohttp, fixed 2.5 KB answer, same load")
                res = throughput(args, workdir, baseline=True)
                print(f"  median: {statistics.median(r[0] for r in res):,.0f} req/s wall, "
                      f"{statistics.median(r[1] for r in res):,.0f} req per server CPU-second")
        if args.only in (None, "loop"):
            print(f"loop: 1 s latency, {args.loop} keep-alive connections re-sending when "
                  "answered, 200-token completions, non-streaming")
            res = loop(args, workdir)
            print(f"  median: {statistics.median(r[0] for r in res):,.0f} req/s, server core "
                  f"{100 * statistics.median(r[1] for r in res):.0f}% busy, "
                  f"{1e6 * statistics.median(r[2] for r in res):.0f} us CPU per request")
        if args.only in (None, "hold"):
            print(f"hold: 1 s latency, {args.hold} concurrent requests")
            res = hold(args, workdir)
            print(f"  median: peak open {statistics.median(r[0] for r in res):.0f}, peak RSS "
                  f"{statistics.median(r[1] for r in res):.0f} MB")


if __name__ == "__main__":
    main()
