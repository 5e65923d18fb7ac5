"""Streaming file writers (JSONL, Parquet in row groups) that publish atomically.

Each writer writes to `NAME.partial` and renames it on `close()`, so an interrupted export
never leaves a file that looks complete. Memory stays flat: JSONL writes line by line,
Parquet buffers one row group.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import orjson

ROW_GROUP_ROWS = 1024
ROW_GROUP_TOKENS = 4_000_000  # flush a row group early when its samples are long


class Writer:
    """Base: counts rows; `close()` publishes the file and returns its manifest entry."""

    def __init__(self, path: Path):
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.rows = 0

    def write(self, row: dict[str, Any]) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError

    def close(self) -> dict[str, Any]:
        self._finish()
        os.replace(self.partial, self.path)
        return {"path": self.path.name, "rows": self.rows, "bytes": self.path.stat().st_size,
                "sha256": file_sha256(self.path)}

    def abort(self) -> None:
        try:
            self._finish()
        except Exception:  # noqa: BLE001 - best effort before removing the partial file
            pass
        self.partial.unlink(missing_ok=True)


class JsonlWriter(Writer):
    def __init__(self, path: Path):
        super().__init__(path)
        self._f = open(self.partial, "wb")

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(orjson.dumps(row))
        self._f.write(b"\n")
        self.rows += 1

    def _finish(self) -> None:
        if not self._f.closed:
            self._f.close()


class ParquetWriter(Writer):
    """Parquet with row groups of at most ROW_GROUP_ROWS rows / ROW_GROUP_TOKENS ids."""

    def __init__(self, path: Path, schema, *, metadata: dict[str, str] | None = None):
        import pyarrow.parquet as pq

        super().__init__(path)
        if metadata:
            schema = schema.with_metadata(metadata)
        self.schema = schema
        self._w = pq.ParquetWriter(self.partial, schema, compression="zstd")
        self._buf: dict[str, list] = {name: [] for name in schema.names}
        self._buf_rows = 0
        self._buf_tokens = 0
        self._closed = False

    def write(self, row: dict[str, Any]) -> None:
        for name in self.schema.names:
            self._buf[name].append(row.get(name))
        self._buf_rows += 1
        self._buf_tokens += len(row.get("input_ids") or ())
        self.rows += 1
        if self._buf_rows >= ROW_GROUP_ROWS or self._buf_tokens >= ROW_GROUP_TOKENS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if not self._buf_rows:
            return
        table = pa.Table.from_pydict(self._buf, schema=self.schema)
        self._w.write_table(table)
        self._buf = {name: [] for name in self.schema.names}
        self._buf_rows = self._buf_tokens = 0

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flush()
        self._w.close()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
