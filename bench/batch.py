"""Batch benchmark (not a test): `specgen run` with `mode = "batch"` against `specgen sim`,
next to the same run live (docs/batch.md).

The simulator runs in its own process (answers at once, `--tokens`-token completions, each
batch taking at least `--processing` seconds); each run is a fresh `specgen run` process on
another core. Reported per run: answers, wall time (start to the last result), client CPU ms
per answer (the process's whole CPU time / answers) and peak RSS. Batch mode is run at two
sizes (`--requests` / 10 and `--requests`) so that a peak memory that grows with the number
of requests shows (results are streamed line by line: it should not).

What the issue asks: client CPU per answer no more than the live path's, peak memory flat in
the number of requests, wall time dominated by the simulated processing time.

    .venv/bin/python bench/batch.py                                   # 100,000 requests
    .venv/bin/python bench/batch.py --requests 5000 --batch-size 1000 --processing 2   # ~1 min
"""

# ruff: noqa: E402  (the sys.path fix below must run before the imports)
from __future__ import annotations

import sys

# bench/ holds a tokenize.py that would shadow the standard library's: drop the script's dir
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import platform
import subprocess
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def pin(cpu: int | None):
    def fn():
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(0, {cpu})
            except OSError:
                pass
    return fn


def cpus() -> tuple[int | None, int | None]:
    if not hasattr(os, "sched_getaffinity"):
        return None, None
    avail = sorted(os.sched_getaffinity(0))
    return (avail[0], avail[1]) if len(avail) >= 2 else (None, None)


def start_sim(workdir: Path, processing: float, tokens: int, cpu: int | None):
    cfg = workdir / "sim.toml"
    cfg.write_text(SIM.format(processing=processing, tokens=tokens))
    err = (workdir / "sim.err").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "specgen", "sim", "--port", "0", "--config",
                             str(cfg)], stdout=subprocess.PIPE, stderr=err, text=True,
                            cwd=ROOT, preexec_fn=pin(cpu),
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    line = proc.stdout.readline().strip()
    if not line.startswith("specgen sim listening on "):
        proc.kill()
        raise SystemExit(f"sim did not start: {line!r} {(workdir / 'sim.err').read_text()[-2000:]}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc, line.rsplit(" ", 1)[1] + "/api/v1"


def make_dataset(path: Path, rows: int) -> None:
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"r{i}", "messages": [
                {"role": "user", "content": f"Question {i}: explain item {i} briefly."}]}) + "\n")


def config(workdir: Path, name: str, url: str, data: Path, n: int, endpoint: str) -> Path:
    path = workdir / f"{name}.toml"
    path.write_text(f"""run_dir = "{workdir / (name + '-dir')}"
[target]
model = "{MODEL}"
tokenizer = "demo"
[endpoint]
base_url = "{url}"
api_key_env = "SPECGEN_BENCH_KEY"
max_attempts = 3
{endpoint}
[sampling]
max_tokens = 1024
[engine]
log_interval = 30
[[dataset]]
name = "bench"
path = "{data}"
limit = {n}
""")
    return path


def measure(path: Path, cpu: int | None) -> dict:
    proc = subprocess.Popen([sys.executable, "-m", "specgen", "run", str(path), "--no-live"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=pin(cpu),
                            env={**os.environ, "SPECGEN_BENCH_KEY": "bench",
                                 "PYTHONPATH": str(ROOT / "src")})
    box: dict[str, str] = {}
    threads = [threading.Thread(target=lambda: box.update(out=proc.stdout.read()), daemon=True),
               threading.Thread(target=lambda: box.update(err=proc.stderr.read()), daemon=True)]
    for t in threads:
        t.start()
    _, status, ru = os.wait4(proc.pid, 0)
    for t in threads:
        t.join()
    if status != 0:
        raise SystemExit(f"{path.name} failed ({status}): {box.get('err', '')[-3000:]}")
    import sqlite3

    db = sqlite3.connect(path.with_name(path.stem + "-dir") / "state.sqlite")
    (answers,) = db.execute("SELECT COUNT(*) FROM results").fetchone()
    (t0,) = db.execute("SELECT MIN(started_at) FROM sessions").fetchone()
    (t1,) = db.execute("SELECT MAX(created_at) FROM results").fetchone()
    db.close()
    n = max(answers, 1)
    return {"answers": answers, "wall_s": round((t1 or 0) - (t0 or 0), 2),
            "cpu_ms_per_answer": round((ru.ru_utime + ru.ru_stime) * 1000 / n, 3),
            "peak_rss_mb": round(ru.ru_maxrss / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--batch-size", type=int, default=10_000, help="batch_max_requests")
    ap.add_argument("--processing", type=float, default=30.0, help="batch_processing_s")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=1000, help="the live run's")
    ap.add_argument("--no-live", action="store_true", help="skip the live run")
    args = ap.parse_args()
    client_cpu, sim_cpu = cpus()
    with tempfile.TemporaryDirectory(prefix="specgen-bench-batch-") as tmp:
        workdir = Path(tmp)
        data = workdir / "rows.jsonl"
        make_dataset(data, args.requests)
        sim, url = start_sim(workdir, args.processing, args.tokens, sim_cpu)
        try:
            results = {}
            batch = (f'mode = "batch"\nbatch_max_requests = {args.batch_size}\n'
                     f"concurrency = {args.batch_size * 2}\nbatch_poll_interval = 1.0\n"
                     "batch_linger_s = 1.0")
            small = max(1, args.requests // 10)
            for name, n, endpoint in (
                    ("batch-small", small, batch), ("batch", args.requests, batch),
                    *(() if args.no_live else (
                        ("live", args.requests,
                         f"stream = false\nconcurrency = {args.concurrency}"),))):
                results[name] = measure(config(workdir, name, url, data, n, endpoint),
                                        client_cpu)
                print(f"{name:12s} {json.dumps(results[name])}", flush=True)
        finally:
            sim.kill()
            sim.wait()
    print(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(),
                      "requests": args.requests, "batch_size": args.batch_size,
                      "processing_s": args.processing, "results": results}, indent=1))


if __name__ == "__main__":
    main()
