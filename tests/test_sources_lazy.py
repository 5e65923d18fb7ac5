"""Readers are lazy: big files are never loaded whole and resume skips rows without parsing."""

from __future__ import annotations

import itertools
import json
import tracemalloc
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specgen.config import DatasetConfig
from specgen.sources import count_rows, files, iter_rows, jsonstream

N = 25_000


@pytest.fixture(scope="module")
def big_jsonl(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("big") / "big.jsonl"
    with open(p, "w") as f:
        for i in range(N):
            f.write(json.dumps({"id": f"r{i}", "messages": [
                {"role": "user", "content": f"question number {i} " + "x" * 400}]}) + "\n")
    return p


def ds(path: Path) -> DatasetConfig:
    return DatasetConfig(name="big", path=path)


def test_first_row_does_not_read_the_file(big_jsonl, monkeypatch):
    monkeypatch.setattr(files, "_BLOCK", 1 << 16)
    size = big_jsonl.stat().st_size
    assert size > 8 << 20
    tracemalloc.start()
    try:
        it = iter_rows(ds(big_jsonl))
        first = next(it)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert first.conversation.id == "r0"
    assert peak < size // 8, f"peak {peak} bytes for a {size}-byte file"


def test_full_pass_memory_is_bounded(big_jsonl, monkeypatch):
    monkeypatch.setattr(files, "_BLOCK", 1 << 16)
    size = big_jsonl.stat().st_size
    tracemalloc.start()
    try:
        n = sum(1 for _ in iter_rows(ds(big_jsonl)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == N
    assert peak < size // 8, f"peak {peak} bytes for a {size}-byte file"


def test_start_skips_lines_without_parsing_them(big_jsonl, monkeypatch):
    monkeypatch.setattr(files, "_BLOCK", 1 << 16)  # many blocks: the cut lands mid-block
    parsed = []
    real = orjson.loads

    def counting(raw):
        parsed.append(raw)
        return real(raw)

    monkeypatch.setattr(files.orjson, "loads", counting)
    start = N - 5
    got = list(iter_rows(ds(big_jsonl), start=start))
    assert [r.index for r in got] == list(range(start, N))
    assert [r.conversation.id for r in got] == [f"r{i}" for i in range(start, N)]
    # format detection reads the first row; the skipped rows are never parsed
    assert len(parsed) == 1 + 5


@pytest.mark.parametrize("start", [0, 1, 4095, 4096, 4097, N - 1, N, N + 10])
def test_every_start_position_lines_up(big_jsonl, monkeypatch, start):
    monkeypatch.setattr(files, "_BLOCK", 4096)
    got = [r.index for r in itertools.islice(iter_rows(ds(big_jsonl), start=start), 3)]
    assert got == list(range(start, min(N, start + 3)))


def test_count_rows_counts_lines_without_a_final_newline(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"prompt": "a"}\n\n{"prompt": "b"}')
    assert count_rows(p) == 3
    assert [r.index for r in iter_rows(ds(p))] == [0, 2]


def test_json_array_streams_with_bounded_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonstream, "CHUNK", 1 << 14)
    monkeypatch.setattr(files, "_BLOCK", 1 << 14)  # the file buffer
    p = tmp_path / "big.json"
    with open(p, "w") as f:
        f.write("[\n")
        for i in range(8_000):
            f.write(("," if i else "") + json.dumps({"id": i, "prompt": "y" * 500}) + "\n")
        f.write("]\n")
    size = p.stat().st_size
    tracemalloc.start()
    try:
        it = iter_rows(ds(p))
        ids = [next(it).conversation.id for _ in range(3)]
        for _ in it:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ids == ["0", "1", "2"]
    assert peak < size // 8, f"peak {peak} bytes for a {size}-byte file"


def test_parquet_start_lands_inside_row_groups_and_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_BATCH", 7)
    p = tmp_path / "t.parquet"
    table = pa.Table.from_pylist([{"id": f"q{i}", "prompt": f"p{i}"} for i in range(100)])
    pq.write_table(table, p, row_group_size=30)
    for start in (0, 5, 29, 30, 31, 64, 99, 100):
        got = [(r.index, r.conversation.id) for r in iter_rows(ds(p), start=start)]
        assert got == [(i, f"q{i}") for i in range(start, 100)]
