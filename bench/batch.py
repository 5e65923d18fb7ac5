"""Batch benchmark (not a test): `specgen run` with `mode = "batch"` against `specgen sim`,
next to the same run live (docs/batch.md; figures in docs/benchmarks/batch.md).

The simulator runs in its own process (answers at once, `--tokens`-token completions, each
batch taking at least `--processing` seconds); each run is a fresh `specgen run` process on
another core. Batch mode runs at each of `--sizes` (a ladder: peak memory must not grow with
the number of requests; results are streamed line by line), `--repeat` times each (medians
printed); the live run (`stream = false`) at the largest size only, or at `--live-sizes`.

Reported per run: answers, wall time (start to the last result), the processing floor (the
simulated processing time the run must wait: waves of `concurrency / batch_size` batches of
`--processing` s each) and wall / floor, client CPU ms per answer (the process's whole CPU
time / answers), client peak RSS, and the simulator's RSS after the run.

What the issue asks: client CPU per answer no more than the live path's, peak memory flat in
the number of requests, wall time dominated by the simulated processing time.

    .venv/bin/python bench/batch.py                                   # 10k, 30k, 100k
    .venv/bin/python bench/batch.py --sizes 2000,6000 --batch-size 1000 --processing 2  # ~1 min
"""

# ruff: noqa: E402  (the sys.path fix below must run before the imports)
from __future__ import annotations

import os
import sys

# bench/ holds a tokenize.py that would shadow the standard library's: this folder goes last
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]

import argparse
import json
import sqlite3
import statistics
import tempfile
from pathlib import Path

import _common

MODEL = "moonshotai/kimi-k2.5"
SIM = """
batch_processing_s = {processing}
[length]
distribution = "fixed"
tokens = {tokens}
[[providers]]
name = "Bench"
tag = "bench/fp8"
quantization = "fp8"
latency_s = 0.0
tokens_per_second = 0
"""


def make_dataset(path: Path, rows: int) -> None:
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"r{i}", "messages": [
                {"role": "user", "content": f"Question {i}: explain item {i} briefly."}]}) + "\n")


def config(workdir: Path, name: str, url: str, data: Path, n: int, endpoint: str) -> Path:
    return _common.run_config(workdir / f"{name}.toml", run_dir=workdir / f"{name}-dir",
                              model=MODEL, url=url, data=data, n=n,
                              endpoint="max_attempts = 3\n" + endpoint)


def measure(path: Path, cpu: int | None) -> dict:
    status, ru, _, err = _common.run_measured(
        [sys.executable, "-m", "specgen", "run", str(path), "--no-live"], cpu=cpu,
        child_env=_common.env(SPECGEN_BENCH_KEY="bench"))
    if status != 0:
        raise SystemExit(f"{path.name} failed ({status}): {err[-3000:]}")
    db = sqlite3.connect(path.with_name(path.stem + "-dir") / "state.sqlite")
    (answers,) = db.execute("SELECT COUNT(*) FROM results").fetchone()
    (t0,) = db.execute("SELECT MIN(started_at) FROM sessions").fetchone()
    (t1,) = db.execute("SELECT MAX(created_at) FROM results").fetchone()
    db.close()
    n = max(answers, 1)
    return {"answers": answers, "wall_s": round((t1 or 0) - (t0 or 0), 2),
            "cpu_ms_per_answer": round((ru.ru_utime + ru.ru_stime) * 1000 / n, 3),
            "peak_rss_mb": round(ru.ru_maxrss / 1024, 1)}


def floor_s(n: int, batch_size: int, in_flight: int, processing: float) -> float:
    """The simulated processing time a batch run of `n` requests cannot beat."""
    batches = -(-n // batch_size)
    return -(-batches // max(1, in_flight // batch_size)) * processing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,30000,100000",
                    help="requests per batch run, comma-separated (a ladder)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per size (medians printed)")
    ap.add_argument("--live-sizes", default=None,
                    help="sizes of the live runs (default: the largest; 0: none)")
    ap.add_argument("--batch-size", type=int, default=10_000, help="batch_max_requests")
    ap.add_argument("--processing", type=float, default=30.0, help="batch_processing_s")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=1000, help="the live run's")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    live_sizes = ([max(sizes)] if args.live_sizes is None else
                  [int(x) for x in args.live_sizes.split(",") if int(x)])
    in_flight = args.batch_size * 2
    client_cpu, sim_cpu = _common.cpus()
    note = _common.machine_note()
    print(note + " (shared machine: other work may be running)", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="specgen-bench-batch-") as tmp:
        workdir = Path(tmp)
        data = workdir / "rows.jsonl"
        make_dataset(data, max(sizes + live_sizes))
        sim, url = _common.start_sim(
            workdir, SIM.format(processing=args.processing, tokens=args.tokens), sim_cpu)
        try:
            batch = (f'mode = "batch"\nbatch_max_requests = {args.batch_size}\n'
                     f"concurrency = {in_flight}\nbatch_poll_interval = 1.0\n"
                     "batch_linger_s = 1.0")
            live = f"stream = false\nconcurrency = {args.concurrency}"
            plan = [("batch", n, batch) for n in sizes] + [("live", n, live) for n in live_sizes]
            for k, (mode, n, endpoint) in enumerate(plan):
                runs = []
                for r in range(args.repeat if mode == "batch" else 1):
                    name = f"{mode}-{k}-{r}"
                    res = measure(config(workdir, name, url, data, n, endpoint), client_cpu)
                    res["sim"] = _common.rss_mb(sim.pid)
                    runs.append(res)
                    print(f"{mode:5s} {n:>7,} run {r + 1}: {json.dumps(res)}", flush=True)
                med = {key: statistics.median(x[key] for x in runs)
                       for key in ("wall_s", "cpu_ms_per_answer", "peak_rss_mb")}
                row = {"mode": mode, "requests": n, "runs": len(runs), **med,
                       "answers": runs[-1]["answers"], "sim_rss_mb": runs[-1]["sim"]}
                if mode == "batch":
                    row["floor_s"] = floor_s(n, args.batch_size, in_flight, args.processing)
                    row["wall_over_floor"] = round(row["wall_s"] / row["floor_s"], 2)
                rows.append(row)
        finally:
            sim.kill()
            sim.wait()
    print(f"\n{note}; batch size {args.batch_size}, {in_flight} lines in flight, processing "
          f"{args.processing} s, {args.tokens}-token answers, live concurrency "
          f"{args.concurrency}")
    print("| mode | requests | runs | client CPU ms/answer | client peak RSS MB | wall s | "
          "processing floor s | wall / floor | sim RSS after MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        sim_rss = (r["sim_rss_mb"] or {}).get("rss_mb", "?")
        print(f"| {r['mode']} | {r['requests']:,} | {r['runs']} | {r['cpu_ms_per_answer']:.3f} | "
              f"{r['peak_rss_mb']:.1f} | {r['wall_s']:.1f} | {r.get('floor_s', '')} | "
              f"{r.get('wall_over_floor', '')} | {sim_rss} |")
    print(json.dumps({"machine": note, "args": vars(args), "results": rows}))


if __name__ == "__main__":
    main()
