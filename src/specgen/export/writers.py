"""Streaming file writers (JSONL, Parquet in row groups) that write under a temporary name.

Each writer writes to a temporary path (`.NAME.tmp-<pid>`, see specgen.export.atomic) and
`close()` fsyncs it; the export renames it to its final name only once every file of the
export is complete, so an interrupted export never leaves a file that looks complete. Memory
stays flat: JSONL writes line by line, Parquet buffers one row group.
"""

from __future__ import annotations

import hashlib
import os
import sys
from array import array
from pathlib import Path
from typing import Any

from .. import jsonexact
from .atomic import fsync_file, remove, temp_path

ROW_GROUP_ROWS = 1024
ROW_GROUP_TOKENS = 4_000_000  # flush a row group early when its samples are long


class Writer:
    """Base: counts rows; `close()` completes and fsyncs the temporary file and returns its
    manifest entry (the caller publishes it under `path`); `abort()` removes it."""

    def __init__(self, path: Path, temp: Path | None = None):
        self.path = path  # the final name
        self.temp = temp if temp is not None else temp_path(path)
        self.temp.parent.mkdir(parents=True, exist_ok=True)
        self.rows = 0

    def write(self, row: dict[str, Any]) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError

    def close(self) -> dict[str, Any]:
        self._finish()
        fsync_file(self.temp)
        return {"path": self.path.name, "rows": self.rows, "bytes": os.stat(self.temp).st_size,
                "sha256": file_sha256(self.temp)}

    def abort(self) -> None:
        try:
            self._finish()
        except Exception:  # noqa: BLE001 - best effort before removing the temporary file
            pass
        remove(self.temp)


class JsonlWriter(Writer):
    def __init__(self, path: Path, temp: Path | None = None):
        super().__init__(path, temp)
        self._f = open(self.temp, "wb")

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(jsonexact.dumps(row))
        self._f.write(b"\n")
        self.rows += 1

    def _finish(self) -> None:
        if not self._f.closed:
            self._f.close()


# array typecodes of the integer list columns the Parquet writer packs without Python objects
_ARRAY_CODES = {"int8": "b", "int16": "h", "int32": "i", "int64": "q"}


class ParquetWriter(Writer):
    """Parquet with row groups of at most ROW_GROUP_ROWS rows / ROW_GROUP_TOKENS ids.

    Integer list columns (input_ids, loss_mask) are buffered as flat typed arrays + offsets
    and handed to Arrow as buffers, so a row group costs about its size in bytes.
    """

    def __init__(self, path: Path, schema, *, metadata: dict[str, str] | None = None,
                 temp: Path | None = None):
        import pyarrow as pa
        import pyarrow.parquet as pq

        super().__init__(path, temp)
        if metadata:
            schema = schema.with_metadata(metadata)
        self.schema = schema
        self._packed: dict[str, str] = {}
        for f in schema:
            if pa.types.is_list(f.type) and str(f.type.value_type) in _ARRAY_CODES:
                code = _ARRAY_CODES[str(f.type.value_type)]
                if sys.byteorder == "little" and array(code).itemsize == f.type.value_type.bit_width // 8:
                    self._packed[f.name] = code
        # dictionaries help the repetitive string columns only, never the id lists
        strings = [f.name for f in schema if pa.types.is_string(f.type)]
        self._w = pq.ParquetWriter(str(self.temp), schema, compression="zstd",
                                   use_dictionary=strings)
        self._reset()
        self._closed = False

    def _reset(self) -> None:
        self._buf: dict[str, list] = {n: [] for n in self.schema.names if n not in self._packed}
        self._values = {n: array(code) for n, code in self._packed.items()}
        self._offsets = {n: array("i", [0]) for n in self._packed}
        self._buf_rows = self._buf_tokens = 0

    def write(self, row: dict[str, Any]) -> None:
        for name, values in self._buf.items():
            values.append(row.get(name))
        for name, values in self._values.items():
            v = row[name]
            # array(code, list) converts in one C loop; bytes() is faster still for 0/1 masks
            values.extend(array("b", bytes(v)) if values.typecode == "b" else array(values.typecode, v))
            self._offsets[name].append(len(values))
        self._buf_rows += 1
        self._buf_tokens += len(row.get("input_ids") or ())
        self.rows += 1
        if self._buf_rows >= ROW_GROUP_ROWS or self._buf_tokens >= ROW_GROUP_TOKENS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if not self._buf_rows:
            return
        columns = []
        for f in self.schema:
            if f.name in self._packed:
                vals = self._values[f.name]
                flat = pa.Array.from_buffers(f.type.value_type, len(vals),
                                             [None, pa.py_buffer(vals)])
                offsets = pa.Array.from_buffers(pa.int32(), len(self._offsets[f.name]),
                                                [None, pa.py_buffer(self._offsets[f.name])])
                columns.append(pa.ListArray.from_arrays(offsets, flat, type=f.type))
            else:
                columns.append(pa.array(self._buf[f.name], type=f.type))
        self._w.write_table(pa.Table.from_arrays(columns, schema=self.schema))
        self._reset()

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
