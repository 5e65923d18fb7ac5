"""Engine benchmark (not a test): `specgen run`'s full pipeline against `specgen sim`.

The simulator runs in its own process pinned to its own core (1 s to first token, 200-token
completions); each client runs in a fresh process pinned to another core:

* bare    — an aiohttp loop with a semaphore that reads each body and parses nothing (ceiling)
* openai  — the `openai` SDK (AsyncOpenAI) with an asyncio.Semaphore: what users write today
* specgen — the engine itself: rows read lazily from a dataset of `--queued` rows (limit =
            `--requests`), requests built and rendered, answers normalised, rendered to ids
            and committed to the SQLite store

Reported per client: requests/s (first request sent to last answer), client CPU ms per request
(the process's whole CPU time, start-up included, / requests) and peak RSS. Medians over
`--runs`, with the machine noted.

    .venv/bin/python bench/engine.py                                  # the issue's sizes
    .venv/bin/python bench/engine.py --requests 5000 --concurrency 500 --runs 1   # ~1 minute
"""

# ruff: noqa: E402  (the sys.path fix below must run before the imports)
from __future__ import annotations

import os
import sys

# bench/ holds a tokenize.py that would shadow the standard library's: this folder goes last
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import _common

ROOT = _common.ROOT
MODEL = "moonshotai/kimi-k2.5"
SIM_CONFIG = """
seed = 0
keepalive_interval_s = 0
[length]
distribution = "fixed"
tokens = {tokens}
min = {tokens}
max = {tokens}
[[providers]]
name = "Bench"
tag = "bench/bf16"
quantization = "bf16"
latency_s = {latency}
"""
PROMPT = ("Row {i}: explain, in a short paragraph, why the sky looks blue at noon and red at "
          "sunset, and what that says about the size of the particles in the air.")


def make_dataset(path: Path, rows: int) -> None:
    if path.exists() and path.stat().st_size > 0:
        with path.open("rb") as f:
            if sum(1 for _ in f) == rows:
                return
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"r{i}", "messages": [
                {"role": "user", "content": PROMPT.format(i=i)}]}) + "\n")


# -- the clients (run in a child process) -------------------------------------------------------
def body(i: int, stream: bool) -> dict:
    b = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT.format(i=i)}],
         "max_tokens": 1024}
    if stream:
        b["stream"] = True
    return b


async def bare(url: str, n: int, conc: int, stream: bool) -> dict:
    import aiohttp
    import orjson

    sem = asyncio.Semaphore(conc)
    ok = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one(i: int) -> None:
            nonlocal ok
            async with sem, s.post(url + "/chat/completions", data=orjson.dumps(body(i, stream)),
                                   headers={"Content-Type": "application/json"}) as r:
                await r.read()
                ok += r.status == 200
        t0 = time.time()
        await asyncio.gather(*(one(i) for i in range(n)))
    return {"requests": ok, "wall": time.time() - t0}


async def openai_loop(url: str, n: int, conc: int, stream: bool, seconds: float) -> dict:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="bench", max_retries=0)
    sem = asyncio.Semaphore(conc)
    ok = 0
    stop_at = time.time() + seconds

    errors = 0

    async def one(i: int) -> None:
        nonlocal ok, errors
        async with sem:
            if time.time() > stop_at:
                return
            b = body(i, stream)
            try:
                if stream:
                    resp = await client.chat.completions.create(**b)
                    async for _ in resp:
                        pass
                else:
                    await client.chat.completions.create(**b)
            except Exception:  # noqa: BLE001 - counted: the SDK's pool times out under load
                errors += 1
                return
            ok += 1
    t0 = time.time()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.time() - t0
    await client.close()
    return {"requests": ok, "errors": errors, "wall": wall}


def specgen_run(url: str, n: int, conc: int, stream: bool, data: Path, workdir: Path,
                commit_thread: bool = True, event_loop: str = "auto") -> dict:
    sys.path.insert(0, str(ROOT / "src"))
    from specgen.config import load_config
    from specgen.engine.runner import RunOptions, run
    from specgen.store import Store

    run_dir = workdir / f"run-{os.getpid()}"
    cfg_path = workdir / f"run-{os.getpid()}.toml"
    _common.run_config(
        cfg_path, run_dir=run_dir, model=MODEL, url=url, data=data, n=n,
        endpoint=f"concurrency = {conc}\nstream = {str(stream).lower()}\nmax_attempts = 3",
        engine=f"log_interval = 30\ncommit_thread = {str(commit_thread).lower()}\n"
               f'event_loop = "{event_loop}"')
    outcome = run(load_config(cfg_path), RunOptions(live=False))
    with Store.open(run_dir) as s:
        (t0, t1, ok) = s.conn.execute(
            "SELECT MIN(started_at), MAX(ended_at), SUM(outcome='ok') FROM attempts").fetchone()
        commit = s.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    return {"requests": int(ok or 0), "results": commit, "wall": (t1 or 0) - (t0 or 0),
            "state": outcome.state}


def child(args) -> None:
    import logging

    logging.getLogger("specgen").setLevel(logging.WARNING)
    if args.child == "bare":
        out = asyncio.run(bare(args.url, args.requests, args.concurrency, args.stream))
    elif args.child == "openai":
        out = asyncio.run(openai_loop(args.url, args.requests, args.concurrency, args.stream,
                                      args.openai_seconds))
    else:
        out = specgen_run(args.url, args.requests, args.concurrency, args.stream,
                          Path(args.data), Path(args.workdir),
                          commit_thread=not args.no_commit_thread, event_loop=args.event_loop)
    print("RESULT " + json.dumps(out), flush=True)


# -- the driver ---------------------------------------------------------------------------------
def measure(mode: str, args, url: str, data: Path, workdir: Path, cpu: int | None) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--url", url, "--requests",
           str(args.requests), "--concurrency", str(args.concurrency), "--data", str(data),
           "--workdir", str(workdir), "--openai-seconds", str(args.openai_seconds)]
    if args.stream:
        cmd.append("--stream")
    if args.no_commit_thread:
        cmd.append("--no-commit-thread")
    cmd += ["--event-loop", args.event_loop]
    status, ru, out, err = _common.run_measured(
        cmd, cpu=cpu, child_env={**os.environ, "SPECGEN_BENCH_KEY": "bench"})
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{mode} failed (status {status}): {err[-3000:]}")
    res = json.loads(line[7:])
    n = max(res["requests"], 1)
    res.update(mode=mode, rps=res["requests"] / res["wall"] if res["wall"] > 0 else 0.0,
               cpu_ms=(ru.ru_utime + ru.ru_stime) * 1000 / n, rss_mb=ru.ru_maxrss / 1024)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--queued", type=int, default=1_000_000,
                    help="rows in the engine's dataset (it takes --requests of them)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="bare,openai,specgen")
    ap.add_argument("--stream", action="store_true", help="stream the answers (SSE)")
    ap.add_argument("--openai-seconds", type=float, default=60.0,
                    help="stop the openai loop after this long (it is slow)")
    ap.add_argument("--no-commit-thread", action="store_true",
                    help="commit on the event loop instead of a worker thread")
    ap.add_argument("--event-loop", default="auto", choices=("auto", "asyncio", "uvloop"),
                    help="[engine] event_loop of the specgen run (auto: uvloop if installed)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    client_cpu, sim_cpu = _common.cpus()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    print(_common.machine_note())
    print(f"sim pinned to core {sim_cpu}, clients to core {client_cpu}; latency "
          f"{args.latency}s, {args.tokens}-token completions, concurrency {args.concurrency}, "
          f"{args.requests:,} requests, stream={args.stream}, {args.queued:,} rows queued")
    with tempfile.TemporaryDirectory(prefix="specgen-bench-") as tmp:
        tmp = Path(tmp)
        data = tmp / "queued.jsonl"
        if "specgen" in modes:
            t0 = time.time()
            make_dataset(data, max(args.queued, args.requests))
            print(f"dataset of {max(args.queued, args.requests):,} rows written in "
                  f"{time.time() - t0:.1f}s")
        results: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(args.runs):
            for mode in modes:
                sim, url = _common.start_sim(
                    tmp, SIM_CONFIG.format(latency=args.latency, tokens=args.tokens), sim_cpu)
                try:
                    res = measure(mode, args, url, data, tmp, client_cpu)
                finally:
                    sim.terminate()
                    sim.wait()
                results[mode].append(res)
                errs = f"  ({res['errors']:,} errors)" if res.get("errors") else ""
                print(f"run {r + 1} {mode:8s} {res['requests']:>7,} req  {res['rps']:8.1f} req/s"
                      f"  {res['cpu_ms']:6.3f} ms CPU/req  peak RSS {res['rss_mb']:6.1f} MB"
                      f"{errs}", flush=True)
    print("\nmedians:")
    bare_rps = statistics.median(x["rps"] for x in results["bare"]) if "bare" in results else None
    for mode, rs in results.items():
        rps = statistics.median(x["rps"] for x in rs)
        cpu = statistics.median(x["cpu_ms"] for x in rs)
        rss = statistics.median(x["rss_mb"] for x in rs)
        share = f"  {100 * rps / bare_rps:5.1f}% of bare" if bare_rps else ""
        print(f"  {mode:8s} {rps:8.1f} req/s  {cpu:6.3f} ms CPU/req  peak RSS {rss:6.1f} MB"
              f"{share}")


if __name__ == "__main__":
    main()
