"""Benchmark `specgen stats` (one pass over the store) on a synthetic store, as a real
`python -m specgen stats RUN_DIR --json` process: wall time, samples/s, peak RSS.

    .venv/bin/python bench/stats.py [--samples 50000] [--runs 3]

The synthetic store holds N single-turn samples in 2 datasets x 3 providers (prompt ~600 ids,
completion ~400, lognormal; random ids), written straight into the documented schema, with
1% repetition loops, 1% duplicate answers, 3% answers cut at max_tokens and 0.5%
whitespace-only answers (identical, so duplicates too); the bench checks that stats finds each planted count. It is run for
N and 2N samples, to show the time per sample stays flat.
"""

from __future__ import annotations

import os
import sys

# bench/tokenize.py is named like the stdlib `tokenize` module: this folder goes last
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE] + [HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from array import array  # noqa: E402
from pathlib import Path  # noqa: E402

import _common  # noqa: E402

ROOT = _common.ROOT
sys.path.insert(0, _common.SRC)

import orjson  # noqa: E402

from specgen.store import pack_ids, pack_json  # noqa: E402

PROVIDERS = ("Alpha", "Beta", "Gamma")


def random_ids(rng: random.Random, n: int) -> list[int]:
    a = array("I")
    a.frombytes(rng.randbytes(4 * n))
    return [v % 160000 for v in a]


def synthetic_store(run_dir: Path, n: int, *, seed: int) -> dict[str, int]:
    """N samples; returns the planted counts."""
    rng = random.Random(seed)
    store, c = _common.synthetic_store_begin(run_dir, {"d0": n // 2, "d1": n // 2})
    planted = {"loops": 0, "duplicates": 0, "truncated": 0, "whitespace": 0}
    dup_answer = random_ids(rng, 300) + [163586]
    rows_c, rows_t, rows_r = [], [], []
    seen: set[tuple[str, str]] = set()  # (dataset, kind) of the planted answers said once
    for i in range(n):
        cid = tid = i + 1
        ds = f"d{i % 2}"
        n_prompt = max(16, int(rng.lognormvariate(6.4, 0.6)))
        n_comp = max(8, min(4096, int(rng.lognormvariate(6.0, 0.7))))
        prompt = random_ids(rng, n_prompt)
        kind = rng.random()
        finish, content = "stop", "x " * 8
        if kind < 0.01:
            block = random_ids(rng, rng.randint(3, 40))
            comp = random_ids(rng, 50) + block * (200 // len(block) + 2)
            planted["loops"] += 1
        elif kind < 0.02:
            comp = list(dup_answer)
            planted["duplicates"] += (ds, "dup") in seen  # a copy after its dataset's first
            seen.add((ds, "dup"))
        elif kind < 0.05:
            comp = random_ids(rng, 4096)
            finish = "length"
            planted["truncated"] += 1
        elif kind < 0.055:
            comp, content = [220, 163586], "  "
            planted["whitespace"] += 1
            planted["duplicates"] += (ds, "blank") in seen  # identical answers too
            seen.add((ds, "blank"))
        else:
            comp = random_ids(rng, n_comp)
        msg = {"role": "assistant", "content": content}
        req = {"messages": [{"role": "user", "content": "q"}], "tools": None}
        rows_c.append((cid, ds, f"c{i}", i, "done", None, pack_json({"id": f"c{i}"})))
        rows_t.append((tid, cid, ds, 1, "done", 1))
        rows_r.append((tid, cid, ds, 1, PROVIDERS[i % 3], "m", finish, finish, pack_json(req),
                       orjson.dumps(msg).decode(), pack_ids(prompt + comp), n_prompt,
                       n_prompt, len(comp), 0.001, "[]", float(i)))
        if len(rows_r) >= 2000 or i == n - 1:
            _common.insert_samples(c, rows_c, rows_t, rows_r)
            rows_c, rows_t, rows_r = [], [], []
    c.execute("COMMIT")
    store.close()
    return planted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=50000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print(_common.machine_note())
    for n in (args.samples, 2 * args.samples):
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = Path(tmp) / "run"
            t0 = time.perf_counter()
            planted = synthetic_store(run_dir, n, seed=n)
            size = (run_dir / "state.sqlite").stat().st_size / 2**20
            print(f"\n{n:,} samples, store {size:,.0f} MiB (built in "
                  f"{time.perf_counter() - t0:.1f}s); planted {planted}")
            walls, rss = [], []
            for _ in range(args.runs):
                w, r, out = _common.timed_specgen(["stats", str(run_dir), "--json"])
                walls.append(w)
                rss.append(r)
            t = json.loads(out)["total"]
            found = {"loops": t["repetition"]["count"], "duplicates": t["duplicates"]["count"],
                     "truncated": t["truncated"]["count"],
                     "whitespace": t["whitespace_only"]["count"]}
            assert found == planted, (found, planted)
            med = statistics.median(walls)
            print(f"  specgen stats --json   {med:7.2f} s  {n / med:10,.0f} samples/s  "
                  f"peak RSS {max(rss):6.0f} MiB  (found exactly the planted counts)")
            print(f"  a million samples at this rate: ~{1e6 / (n / med):,.0f} s")


if __name__ == "__main__":
    main()
