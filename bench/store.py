"""Store benchmark (not a test): commit rate and resume start-up on a large store.

1. commit rate — results/s through `StoreWriter` (batches of `--batch` results, each with
   its conversation, task and attempt rows, as the engine writes them; `--ids` token ids per
   sample).
2. resume — a store of `--tasks` done tasks (plus `--open` unfinished conversations) is built
   once; then the time `specgen run` needs before it can dispatch: the config check
   (`resume.problems`), opening the store and `Engine.load()` (cursors, counters, spend, open
   conversations re-planned and re-rendered). Target: <= 10 s for 1,000,000 tasks.

    .venv/bin/python bench/store.py                         # 1,000,000 tasks, 3 runs
    .venv/bin/python bench/store.py --tasks 100000 --runs 1 # about a minute
"""

# ruff: noqa: E402  (the sys.path fix below must run before the imports)
from __future__ import annotations

import sys

# bench/ holds a tokenize.py that would shadow the standard library's: drop the script's dir
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specgen.store import Batch, Store, pack_ids, pack_json  # noqa: E402

MSG = "Row {i}: explain why the sky looks blue at noon and red at sunset, briefly."


def rows_for(i: int, ids: list[int], now: float, status: str = "done"):
    conv = {"id": f"r{i}", "messages": [{"role": "user", "content": MSG.format(i=i)}]}
    request = pack_json({"messages": conv["messages"], "tools": None})
    message = orjson.dumps({"role": "assistant", "content": "It is Rayleigh scattering.",
                            "reasoning_content": "Short wavelengths scatter more."}).decode()
    c = (i, "bench", f"r{i}", i, status if status != "done" else "done", None, pack_json(conv))
    t = (i, i, "bench", 1, status, 1 if status == "done" else 0, None)
    a = (i, 1, "http://sim", "Bench", "m", now, now + 0.5, now + 1.0, "ok", 200, None, 60,
         len(ids) - 60, 0.0006, f"gen-{i}", "bench")
    r = (i, i, "bench", 1, "Bench", "m", "stop", "stop", request, message, pack_ids(ids), 60,
         None, None, 60, len(ids) - 60, 20, 0.0006, "[]", 1.0, now)
    return c, t, a, r


def commit_rate(tmp: Path, n: int, batch: int, n_ids: int) -> float:
    from specgen.engine.writer import StoreWriter

    run_dir = tmp / f"commit-{time.monotonic_ns()}"
    store = Store.create(run_dir)
    writer = StoreWriter(store, threaded=False)
    ids = list(range(1000, 1000 + n_ids))
    now = time.time()
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        c, t, a, r = rows_for(i, ids, now)
        b = writer.batch
        b.conversations.append(c)
        b.tasks[i] = t
        b.attempts.append(a)
        b.results.append(r)
        if i % batch == 0:
            writer.flush()
    writer.flush()
    dt = time.perf_counter() - t0
    store.close()
    return n / dt


def build_big_store(run_dir: Path, n: int, n_open: int, n_ids: int, data: Path) -> None:
    if (run_dir / "state.sqlite").exists():
        return
    store = Store.create(run_dir)
    ids = list(range(1000, 1000 + n_ids))
    now = time.time()
    step = 20_000
    t0 = time.perf_counter()
    for start in range(1, n + n_open + 1, step):
        b = Batch()
        for i in range(start, min(start + step, n + n_open + 1)):
            done = i <= n
            c, t, a, r = rows_for(i, ids, now, "done" if done else "pending")
            b.conversations.append(c)
            b.tasks[i] = t
            if done:
                b.attempts.append(a)
                b.results.append(r)
        store.write(b)
    store.close()
    print(f"  built a store of {n:,} done + {n_open:,} open tasks in "
          f"{time.perf_counter() - t0:.0f}s "
          f"({(run_dir / 'state.sqlite').stat().st_size / 1e9:.2f} GB)", flush=True)


def resume_time(run_dir: Path, cfg_path: Path, n: int, n_open: int) -> dict[str, float]:
    from specgen.config import load_config
    from specgen.engine.budget import Budget, Prices
    from specgen.engine.policy import ProviderPolicy
    from specgen.engine.resume import meta_for, problems
    from specgen.engine.scheduler import Engine
    from specgen.engine.stages import default_stages
    from specgen.render import get_renderer
    from specgen.tokenizer import load_tokenizer

    cfg = load_config(cfg_path)
    tok = load_tokenizer("demo")
    renderer = get_renderer(cfg.target.renderer, tok, thinking=cfg.sampling.thinking)
    t0 = time.perf_counter()
    with Store.open(run_dir) as old:
        found = problems(old, cfg, tokenizer_fingerprint=tok.fingerprint, shard="")
    assert not found, found
    t1 = time.perf_counter()
    store = Store.create(run_dir)
    for k, v in meta_for(cfg, tokenizer_fingerprint=tok.fingerprint, shard="").items():
        store.set_meta(k, v)
    reader = Store.open(run_dir)

    async def load() -> Engine:
        eng = Engine(cfg, store=store, reader=reader, client=None, renderer=renderer,
                     stages=default_stages(), policy=ProviderPolicy({}),
                     budget=Budget(None, Prices()), session_id=1)
        eng.load()
        return eng

    eng = asyncio.run(load())
    t2 = time.perf_counter()
    ds = eng.datasets[0]
    assert ds.tasks.get("done") == n and eng.open_convs == n_open, (ds.tasks, eng.open_convs)
    assert len(ds.ready) == n_open
    reader.close()
    store.close()
    return {"check": t1 - t0, "load": t2 - t1, "total": t2 - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--commits", type=int, default=50_000, help="results for the commit rate")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--ids", type=int, default=1000, help="token ids per sample")
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--open", type=int, default=4000, help="unfinished conversations")
    ap.add_argument("--keep", help="directory to build the big store in (kept, reused)")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, SQLite {__import__('sqlite3').sqlite_version}")
    with tempfile.TemporaryDirectory(prefix="specgen-store-bench-") as tmp:
        tmp = Path(tmp)
        rates = []
        for r in range(args.runs):
            rate = commit_rate(tmp, args.commits, args.batch, args.ids)
            rates.append(rate)
            print(f"run {r + 1} commit rate {rate:10,.0f} results/s "
                  f"({args.ids} ids/sample, batches of {args.batch})", flush=True)
        base = Path(args.keep) if args.keep else tmp
        base.mkdir(parents=True, exist_ok=True)
        data = base / "data.jsonl"
        with data.open("w") as f:
            for i in range(1, args.tasks + args.open + 1):
                f.write(orjson.dumps({"id": f"r{i}", "messages": [
                    {"role": "user", "content": MSG.format(i=i)}]}).decode() + "\n")
        run_dir = base / f"big-{args.tasks}-{args.open}-{args.ids}"
        cfg_path = base / "run.toml"
        cfg_path.write_text(f"""run_dir = "{run_dir}"
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
base_url = "sim"
[[dataset]]
name = "bench"
path = "{data}"
""")
        # the store must look like this config made it (meta + dataset rows)
        build_big_store(run_dir, args.tasks, args.open, args.ids, data)
        from specgen.config import load_config
        from specgen.engine.resume import meta_for
        from specgen.tokenizer import load_tokenizer

        cfg = load_config(cfg_path)
        with Store.create(run_dir) as s:
            for k, v in meta_for(cfg, tokenizer_fingerprint=load_tokenizer("demo").fingerprint,
                                 shard="").items():
                s.set_meta(k, v)
            s.write(Batch(datasets={"bench": (
                "bench", 0, str(data), "auto", args.tasks + args.open, 0, 0, 0, 1, "active",
                cfg.dataset_result_hash(cfg.datasets[0]))}))
        times = []
        for r in range(args.runs):
            t = resume_time(run_dir, cfg_path, args.tasks, args.open)
            times.append(t)
            print(f"run {r + 1} resume {t['total']:.2f}s (config check {t['check']:.2f}s, "
                  f"load {t['load']:.2f}s) on {args.tasks:,} tasks + {args.open:,} open",
                  flush=True)
    print("\nmedians:")
    print(f"  commit rate  {statistics.median(rates):10,.0f} results/s")
    print(f"  resume       {statistics.median(t['total'] for t in times):.2f} s "
          f"({args.tasks:,} tasks, {args.open:,} open conversations)")


if __name__ == "__main__":
    main()
