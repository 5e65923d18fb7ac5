"""Budget-aware concurrency benchmark (not a test): does a run configured for thousands in
flight settle at what the account's in-flight budget allows?

`specgen sim` (its own process) enforces an in-flight spending budget of `--holds` requests
of the run's size (prompt + max_tokens at the provider's price), answering 402
`in_flight_budget_exhausted` with `Retry-After` beyond it, with `--latency` seconds per
answer. `specgen run` is configured with `--concurrency` in flight and `max_tokens = 16384`.
The best a client can do is `holds / latency` answers per second. Reported, medians over
`--runs` with the machine noted: wall time, answers/s as a share of that ideal, 402s in all
(the first burst is unavoidable: the budget is unknown until it refuses), 402s after the
first fifth of the run (settled: few), and the largest estimated cost the sim saw in flight.

    .venv/bin/python bench/settle.py                      # 2,000 in flight, holds ~150
    .venv/bin/python bench/settle.py --requests 3000 --runs 1
"""

# ruff: noqa: E402  (the sys.path fix below must run before the imports)
from __future__ import annotations

import sys

sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRICE_IN, PRICE_OUT = 0.6, 3.0  # USD per million tokens
MAX_TOKENS = 16384


def sim_config(holds: int, latency: float) -> str:
    weight = MAX_TOKENS * PRICE_OUT / 1e6 + 40 * PRICE_IN / 1e6  # ~ one request's estimate
    return f"""
seed = 0
keepalive_interval_s = 0
in_flight_budget_usd = {holds * weight:.6f}
in_flight_retry_after_s = 1
[length]
distribution = "fixed"
tokens = 100
[[providers]]
name = "Solo"
tag = "solo/int4"
quantization = "int4"
prompt_price_per_m = {PRICE_IN}
completion_price_per_m = {PRICE_OUT}
latency_s = {latency}
"""


def one_run(args, tmp: Path) -> dict:
    (tmp / "sim.toml").write_text(sim_config(args.holds, args.latency))
    sim = subprocess.Popen([sys.executable, "-m", "specgen", "sim", "--port", "0", "--config",
                            str(tmp / "sim.toml")], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        root = sim.stdout.readline().split()[-1]
        with open(tmp / "a.jsonl", "w") as f:
            for i in range(args.requests):
                f.write(json.dumps({"id": f"r{i}", "messages": [
                    {"role": "user", "content": f"Question {i}: say something short."}]}) + "\n")
        run_dir = tmp / "run"
        (tmp / "run.toml").write_text(f"""run_dir = "{run_dir}"
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
base_url = "{root}/api/v1"
api_key_env = ""
concurrency = {args.concurrency}
stream = false
[sampling]
max_tokens = {MAX_TOKENS}
[[dataset]]
name = "a"
path = "a.jsonl"
""")
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "specgen", "run", str(tmp / "run.toml"),
                              "--no-live"], capture_output=True, text=True, cwd=ROOT)
        wall = time.monotonic() - t0
        if res.returncode != 0:
            raise SystemExit(f"run failed ({res.returncode}): {res.stderr[-2000:]}")
        with urlopen_json(root + "/sim/stats") as stats:
            peak = stats["in_flight_weight_peak_usd"]
            budget = stats["in_flight_budget_usd"]
        with sqlite3.connect(run_dir / "state.sqlite") as c:
            t_first, t_last = c.execute(
                "SELECT MIN(started_at), MAX(ended_at) FROM attempts").fetchone()
            refused = c.execute("SELECT COUNT(*) FROM attempts WHERE "
                                "outcome='retry:in_flight_budget'").fetchone()[0]
            late = c.execute(
                "SELECT COUNT(*) FROM attempts WHERE outcome='retry:in_flight_budget' AND "
                "started_at > ?", (t_first + (t_last - t_first) / 5,)).fetchone()[0]
            done = c.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        span = t_last - t_first
        return {"wall_s": wall, "answers_per_s": done / span,
                "of_ideal": done / span / (args.holds / args.latency),
                "refused": refused, "refused_late": late, "peak_share": peak / budget,
                "done": done}
    finally:
        sim.terminate()
        sim.wait(10)


class urlopen_json:
    def __init__(self, url: str):
        import urllib.request

        self._r = urllib.request.urlopen(url, timeout=30)

    def __enter__(self):
        return json.loads(self._r.read())

    def __exit__(self, *exc):
        self._r.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--holds", type=int, default=150, help="requests the budget holds")
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; {args.requests} requests, concurrency "
          f"{args.concurrency}, budget holds {args.holds}, latency {args.latency}s")
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            r = one_run(args, Path(tmp))
        runs.append(r)
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else
                                           f"{k} {v}" for k, v in r.items()))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print("median: " + ", ".join(f"{k} {v:.3g}" for k, v in med.items()))


if __name__ == "__main__":
    main()
