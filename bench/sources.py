"""Benchmark the dataset readers: resume skipping, rows/s per format, memory on a big file.

    .venv/bin/python bench/sources.py [--rows 1000000] [--runs 3]

Writes a JSONL file of `--rows` OpenAI-format rows (about 200 bytes each), the same rows as a
Parquet file (row groups of 64k), and 20k glaive rows, then measures (median of --runs):

* skip: `iter_rows(ds, start=rows - 1)` up to its first row (the resume path: JSONL counts
  newlines without parsing, Parquet skips whole row groups);
* read: rows/s turning rows into `Conversation`s (openai JSONL, openai Parquet, glaive JSONL);
* peak RSS of a full pass over the JSONL file (memory stays flat however long the file is).
"""

from __future__ import annotations

import os
import sys

# bench/tokenize.py is named like the stdlib module: keep this folder off the import path.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specgen.config import DatasetConfig  # noqa: E402
from specgen.sources import iter_rows  # noqa: E402

GLAIVE_SYSTEM = ("SYSTEM: You are a helpful assistant with access to the following functions. "
                 "Use them if required -\n" + json.dumps({
                     "name": "get_weather", "description": "Weather of a city",
                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                    "required": ["city"]}}, indent=4))


def openai_row(i: int) -> dict:
    return {"id": f"r{i}", "messages": [
        {"role": "user", "content": f"Question number {i}: how do plants turn light into sugar?"},
        {"role": "assistant", "content": "Through photosynthesis in the chloroplasts."}]}


def glaive_row(i: int) -> dict:
    return {"system": GLAIVE_SYSTEM, "chat": (
        f"USER: Weather in city {i}?\n\n\nASSISTANT: <functioncall> {{\"name\": \"get_weather\", "
        f"\"arguments\": '{{\"city\": \"City {i}\"}}'}} <|endoftext|>\n\n\nFUNCTION RESPONSE: "
        f"{{\"temp\": {i % 40}}}\n\n\nASSISTANT: It is {i % 40} degrees. <|endoftext|>\n\n\n")}


def write_jsonl(path: Path, rows) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def timed(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def first_row(ds: DatasetConfig, start: int):
    return next(iter_rows(ds, start=start))


def count(ds: DatasetConfig, n: int | None = None) -> int:
    k = 0
    for row in iter_rows(ds):
        assert row.conversation is not None
        k += 1
        if n is not None and k >= n:
            break
    return k


def peak_rss_of_full_pass(path: Path) -> float:
    """Peak RSS (MiB) of a child process reading the whole file."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'src')!r})\n"
            "from pathlib import Path\nfrom specgen.config import DatasetConfig\n"
            "from specgen.sources import iter_rows\n"
            f"n = sum(1 for _ in iter_rows(DatasetConfig(name='b', path=Path({str(path)!r}))))\n"
            # VmHWM: this process's own peak (ru_maxrss survives exec from the parent)
            "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(out.stdout.strip()) / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    n = args.rows
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        jl = tmp / "big.jsonl"
        write_jsonl(jl, (openai_row(i) for i in range(n)))
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist([openai_row(i) for i in range(min(n, 300_000))]),
                       tmp / "big.parquet", row_group_size=65536)
        gl = tmp / "glaive.jsonl"
        write_jsonl(gl, (glaive_row(i) for i in range(20_000)))
        n_pq = min(n, 300_000)
        ds_jl = DatasetConfig(name="jl", path=jl)
        ds_pq = DatasetConfig(name="pq", path=tmp / "big.parquet")
        ds_gl = DatasetConfig(name="gl", path=gl)
        size_mb = jl.stat().st_size / 2**20

        print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
              f"python {platform.python_version()} (shared and noisy unless noted)")
        print(f"JSONL: {n:,} rows, {size_mb:,.0f} MiB; Parquet: {n_pq:,} rows; glaive: 20,000 rows")
        t = timed(lambda: first_row(ds_jl, n - 1), args.runs)
        print(f"skip {n - 1:,} JSONL rows (resume)      {t:8.3f} s   ({(n - 1) / t / 1e6:,.1f} M rows/s)")
        t = timed(lambda: first_row(ds_pq, n_pq - 1), args.runs)
        print(f"skip {n_pq - 1:,} Parquet rows (resume)   {t:8.3f} s")
        k = min(n, 200_000)
        t = timed(lambda: count(ds_jl, k), args.runs)
        print(f"read openai JSONL                       {k / t:10,.0f} rows/s")
        k = min(n_pq, 200_000)
        t = timed(lambda: count(ds_pq, k), args.runs)
        print(f"read openai Parquet                     {k / t:10,.0f} rows/s")
        t = timed(lambda: count(ds_gl), args.runs)
        print(f"read glaive JSONL (parse + tools)       {20_000 / t:10,.0f} rows/s")
        rss = peak_rss_of_full_pass(jl)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS, full pass over {size_mb:,.0f} MiB JSONL  {rss:8.0f} MiB "
              f"(this benchmark process: {base:,.0f} MiB)")


if __name__ == "__main__":
    main()
