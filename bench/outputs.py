"""Benchmark the output commands: `export` (tokens Parquet/JSONL, specforge), `report`,
`merge` and `verify`, each as a real `python -m specgen ...` process.

    .venv/bin/python bench/outputs.py [--samples 4000] [--runs 3] [--verify-samples 600]

A synthetic store of N single-turn samples (prompt ~1000 ids, completion ~400, lognormal) is
written straight into the documented schema; it is enough for export, report and merge, which
never re-render. Verify re-renders every sample, so it runs on a store whose samples are real
Kimi-K2.5 renders (demo tokenizer). Each command is timed by wall clock and its peak RSS read
from wait4(); medians of --runs runs are printed for N and 4N samples, to show that memory
stays flat as the number of samples grows.
"""

from __future__ import annotations

import os
import sys

# bench/tokenize.py is named like the stdlib `tokenize` module: keep this folder off the path.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

import orjson  # noqa: E402

from specgen.store import Store, pack_ids, pack_json  # noqa: E402


def synthetic_store(run_dir: Path, n: int, *, seed: int, offset: int = 0) -> int:
    """N samples with random ids; returns the total number of ids."""
    rng = random.Random(seed)
    store = Store.create(run_dir)
    c = store.conn
    c.execute("BEGIN")
    for k, v in {"config_hash": "bench", "renderer": "kimi-k2.5", "model": "bench/model",
                 "tokenizer_fingerprint": "bench", "thinking": "1", "shard": "",
                 "config_json": "{}"}.items():
        store.set_meta(k, v)
    c.execute("INSERT INTO sessions(id, started_at, state) VALUES(1, 0, 'finished')")
    c.execute("INSERT INTO datasets(name, position, rows_read, exhausted, state) "
              "VALUES('d', 0, ?, 1, 'done')", (n,))
    total = 0
    rows_c, rows_t, rows_r, rows_a = [], [], [], []
    for i in range(n):
        cid = tid = i + 1
        n_prompt = max(16, int(rng.lognormvariate(6.9, 0.6)))
        n_comp = max(8, int(rng.lognormvariate(6.0, 0.7)))
        ids = [rng.randrange(100, 160000) for _ in range(n_prompt + n_comp)]
        total += len(ids)
        text = " ".join("w" for _ in range(n_prompt // 4))
        req = {"messages": [{"role": "user", "content": text}], "tools": None}
        msg = {"role": "assistant", "content": "x " * (n_comp // 2), "reasoning_content": "r"}
        rows_c.append((cid, "d", f"c{i + offset}", i + offset, "done", None,
                       pack_json({"id": f"c{i + offset}", "messages": req["messages"]})))
        rows_t.append((tid, cid, "d", 1, "done", 1))
        rows_r.append((tid, cid, "d", 1, "p", "m", "stop", "stop", pack_json(req),
                       orjson.dumps(msg).decode(), pack_ids(ids), n_prompt, n_prompt, n_comp,
                       0.001, "[]", float(i)))
        rows_a.append((tid, 1, "p", "m", float(i), float(i) + 0.2, float(i) + 1.0, "ok",
                       n_prompt, n_comp, 0.001))
        if len(rows_r) >= 2000 or i == n - 1:
            c.executemany("INSERT INTO conversations(id, dataset, conv_id, row_index, status, "
                          "end_reason, data) VALUES(?,?,?,?,?,?,?)", rows_c)
            c.executemany("INSERT INTO tasks(id, conversation, dataset, turn, status, attempts) "
                          "VALUES(?,?,?,?,?,?)", rows_t)
            c.executemany("INSERT INTO results(task, conversation, dataset, turn, provider, model,"
                          " finish_reason, native_finish_reason, request, message, input_ids, "
                          "n_prompt, prompt_tokens, completion_tokens, cost_usd, repairs, "
                          "created_at) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows_r)
            c.executemany("INSERT INTO attempts(task, session, provider, model, started_at, "
                          "first_byte_at, ended_at, outcome, prompt_tokens, completion_tokens, "
                          "cost_usd) VALUES(?,?,?,?,?,?,?,?,?,?,?)", rows_a)
            rows_c, rows_t, rows_r, rows_a = [], [], [], []
    c.execute("COMMIT")
    store.close()
    return total


def timed(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one `python -m specgen ARGS` process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "specgen", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0,):
        raise SystemExit(f"specgen {' '.join(args)} failed: {proc.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024


def bench(label: str, args: list[str], runs: int, units: float, unit: str) -> None:
    walls, rss = [], []
    for _ in range(runs):
        w, r = timed(args)
        walls.append(w)
        rss.append(r)
    med = statistics.median(walls)
    print(f"  {label:<34} {med:7.2f} s  {units / med:12,.0f} {unit}/s  "
          f"peak RSS {statistics.median(rss):6.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--verify-samples", type=int, default=600)
    a = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, {platform.platform()}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for n in (a.samples, 4 * a.samples):
            run = tmp / f"run{n}"
            ids = synthetic_store(run, n, seed=n)
            print(f"\n{n} samples, {ids:,} ids ({ids / n:,.0f} per sample), "
                  f"store {(run / 'state.sqlite').stat().st_size / 2**20:.0f} MiB; "
                  f"median of {a.runs} runs:")
            bench("export tokens (Parquet)", ["export", str(run), "-f", "tokens", "-o",
                                              str(tmp / "t.parquet")], a.runs, ids, "ids")
            bench("export tokens --jsonl", ["export", str(run), "-f", "tokens", "--jsonl", "-o",
                                            str(tmp / "t.jsonl")], a.runs, ids, "ids")
            bench("export specforge", ["export", str(run), "-f", "specforge", "-o",
                                       str(tmp / "s.jsonl")], a.runs, n, "samples")
            bench("report (HTML)", ["report", str(run), "-o", str(tmp / "r.html")], a.runs, n,
                  "samples")
            half = tmp / f"half{n}"
            if not half.exists():
                synthetic_store(half, n, seed=n + 1, offset=n)
            walls = []
            for k in range(a.runs):
                out = tmp / f"merged{n}-{k}"
                walls.append(timed(["merge", str(run), str(half), "-o", str(out)]))
            med = statistics.median(w for w, _ in walls)
            print(f"  {'merge (2 stores, 2N samples)':<34} {med:7.2f} s  {2 * n / med:12,.0f} "
                  f"samples/s  peak RSS {statistics.median(r for _, r in walls):6.0f} MiB")

        from test_export_support import build_store, chat

        run = tmp / "verify"
        per = 3
        build_store(run, {"d": [chat(i, per, tools=i % 2 == 0)
                                for i in range(a.verify_samples // per)]}, turns="all")
        with Store.open(run) as s:
            n = sum(1 for _ in s.iter_results())
        print(f"\nverify: {n} rendered K2.5 samples (demo tokenizer, tool loops), "
              f"median of {a.runs} runs:")
        bench("verify", ["verify", str(run)], a.runs, n, "samples")


if __name__ == "__main__":
    main()
