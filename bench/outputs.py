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

# bench/tokenize.py is named like the stdlib `tokenize` module: this folder goes last
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import _common  # noqa: E402

ROOT = _common.ROOT
sys.path.insert(0, _common.SRC)
sys.path.insert(0, str(ROOT / "tests"))

import orjson  # noqa: E402

from specgen.store import Store, pack_ids, pack_json  # noqa: E402


def synthetic_store(run_dir: Path, n: int, *, seed: int, offset: int = 0) -> int:
    """N samples with random ids; returns the total number of ids."""
    rng = random.Random(seed)
    store, c = _common.synthetic_store_begin(run_dir, {"d": n})
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
            _common.insert_samples(c, rows_c, rows_t, rows_r, rows_a)
            rows_c, rows_t, rows_r, rows_a = [], [], [], []
    c.execute("COMMIT")
    store.close()
    return total


def timed(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one `python -m specgen ARGS` process."""
    wall, rss, _ = _common.timed_specgen(args)
    return wall, rss


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
    print(_common.machine_note())
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
