"""Raw records of a dataset path, lazily and in file order, with cheap skipping.

A path is one file (`.jsonl`/`.ndjson`, `.json`, either optionally `.gz`; `.parquet`; `.arrow`),
a folder written by HF `datasets.save_to_disk` (`state.json` + Arrow stream files, or a
`dataset_dict.json` folder of splits), or a plain folder of such files (read in sorted order,
e.g. a hub snapshot's `data/train-00000-of-00002.parquet`; `split` keeps the files whose name
or folder names the split).

Row indices: a JSONL row's index is its physical line number minus one (blank lines yield
nothing but keep their index), so skipping `start` rows only counts newlines. JSON, Parquet and
Arrow rows are numbered 0, 1, ... per element. In a folder, indices continue across files.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from .. import jsonexact
from .jsonstream import iter_json

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
JSON_SUFFIXES = (".json", ".json.gz")
PARQUET_SUFFIXES = (".parquet",)
ARROW_SUFFIXES = (".arrow",)
DATA_SUFFIXES = JSONL_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES + ARROW_SUFFIXES
_BLOCK = 1 << 22
_BATCH = 1024


class SourceError(Exception):
    """The dataset as a whole cannot be read (missing file, unknown layout, bad split)."""


@dataclass(slots=True)
class Record:
    """One raw row: a parsed value or an error, where it came from, and an optional key."""

    index: int
    file: str
    line: int | None
    value: Any = None
    error: str | None = None
    key: str | None = None


def data_files(path: Path | list[Path], split: str | None = None) -> list[Path]:
    """The data files a dataset path stands for, in reading order (a list: those files, as
    a resolved Hub dataset gives them)."""
    if isinstance(path, list):
        return path
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise SourceError(f"{path}: dataset path does not exist")
    if (path / "dataset_dict.json").exists():
        return data_files(_hf_split_dir(path, split))
    if (path / "state.json").exists():
        return _hf_arrow_files(path)
    files = sorted(
        p for p in path.rglob("*")
        if p.is_file() and _kind(p) and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )
    if split is not None:
        files = [p for p in files if _names_split(p.relative_to(path), split)]
    if not files:
        what = f" for split {split!r}" if split else ""
        raise SourceError(
            f"{path}: no dataset files{what} (expected {', '.join(DATA_SUFFIXES)}, or a folder "
            "saved with datasets' save_to_disk)"
        )
    return files


def iter_records(path: Path | list[Path], start: int = 0,
                 split: str | None = None) -> Iterator[Record]:
    """Raw records of `path` from row index `start` on (earlier rows skipped cheaply)."""
    offset = 0
    for file in data_files(path, split):
        kind = _kind(file)
        if kind is None:
            raise SourceError(unsupported_file(file))
        one = not isinstance(path, list) and path.is_file()
        reader = _READERS[kind](file, max(0, start - offset), split if one else None)
        n_rows = yield from _shifted(reader, offset)
        offset += n_rows


def _shifted(reader, offset: int):
    """Re-yield a reader's records with indices shifted by `offset`; its row count."""
    while True:
        try:
            rec = next(reader)
        except StopIteration as stop:
            return stop.value
        rec.index += offset
        yield rec


def count_rows(path: Path | list[Path], split: str | None = None) -> int | None:
    """Number of row indices of `path` when cheap to know (None for JSON, which must be parsed)."""
    total = 0
    for file in data_files(path, split):
        n = count_file_rows(file)
        if n is None:
            return None
        total += n
    return total


def count_file_rows(file: Path) -> int | None:
    kind = _kind(file)
    if kind == "jsonl":
        with _open_binary(file) as f:
            n = 0
            last = b"\n"
            while block := f.read(_BLOCK):
                n += block.count(b"\n")
                last = block[-1:]
            return n + (last != b"\n")
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(file).metadata.num_rows
    if kind == "arrow":
        return sum(b.num_rows for b in _arrow_batches(file))
    return None


# -- readers -------------------------------------------------------------------------------

def _read_jsonl(file: Path, start: int, _split: str | None) -> Generator[Record, None, int]:
    name = str(file)
    with _open_binary(file) as f:
        lineno = _skip_lines(f, start) if start else 0
        for raw in f:
            lineno += 1
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                value = jsonexact.loads(raw)
            except orjson.JSONDecodeError as exc:
                yield Record(lineno - 1, name, lineno, error=_json_error(exc, lineno))
                continue
            yield Record(lineno - 1, name, lineno, value=value)
    return lineno


def _skip_lines(f: IO[bytes], n: int) -> int:
    """Position `f` after its first `n` lines without parsing them; the lines skipped."""
    seen = 0
    pos = 0
    while True:
        block = f.read(_BLOCK)
        if not block:
            return seen
        count = block.count(b"\n")
        if seen + count < n:
            seen += count
            pos += len(block)
            continue
        cut = -1
        for _ in range(n - seen):
            cut = block.index(b"\n", cut + 1)
        f.seek(pos + cut + 1)
        return n


def _read_json(file: Path, start: int, split: str | None) -> Generator[Record, None, int]:
    name = str(file)
    with _open_binary(file) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
        index = 0
        try:
            for item in iter_json(text, split):
                if index < start:
                    index += 1
                    continue
                yield Record(index, name, item.line, value=item.value, error=item.error,
                             key=item.key)
                index += 1
        except UnicodeDecodeError as exc:
            yield Record(index, name, None, error=f"file is not UTF-8 text ({exc.reason})")
            index += 1
    return index


def _read_parquet(file: Path, start: int, _split: str | None) -> Generator[Record, None, int]:
    import pyarrow.parquet as pq

    name = str(file)
    try:
        pf = pq.ParquetFile(file)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError variants
        raise SourceError(f"{file}: not a readable Parquet file ({exc})") from None
    index = 0
    groups = []
    skip_in_first = 0
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        if not groups and index + n <= start:
            index += n
            continue
        if not groups:
            skip_in_first = start - index
        groups.append(g)
    if not groups:
        return index
    for batch in pf.iter_batches(batch_size=_BATCH, row_groups=groups):
        if skip_in_first >= batch.num_rows:
            skip_in_first -= batch.num_rows
            index += batch.num_rows
            continue
        if skip_in_first:
            batch = batch.slice(skip_in_first)
            index += skip_in_first
            skip_in_first = 0
        for row in batch.to_pylist():
            yield Record(index, name, None, value=row)
            index += 1
    return index


def _read_arrow(file: Path, start: int, _split: str | None) -> Generator[Record, None, int]:
    name = str(file)
    index = 0
    for batch in _arrow_batches(file):
        if index + batch.num_rows <= start:
            index += batch.num_rows
            continue
        if start > index:
            batch = batch.slice(start - index)
            index = start
        for row in batch.to_pylist():
            yield Record(index, name, None, value=row)
            index += 1
    return index


def _arrow_batches(file: Path):
    import pyarrow as pa

    try:
        source = pa.memory_map(str(file))
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid:
            source = pa.memory_map(str(file))
            f = pa.ipc.open_file(source)
            return (f.get_batch(i) for i in range(f.num_record_batches))
    except (OSError, pa.ArrowInvalid) as exc:
        raise SourceError(f"{file}: not a readable Arrow file ({exc})") from None
    return iter(reader)


_READERS = {"jsonl": _read_jsonl, "json": _read_json, "parquet": _read_parquet,
            "arrow": _read_arrow}


def _json_error(exc: ValueError, lineno: int) -> str:
    """An invalid JSONL line's reason: where in the file line, not "line 1" of the row."""
    msg, col = getattr(exc, "msg", None), getattr(exc, "colno", None)
    if msg is None or col is None:
        return f"invalid JSON: {exc}"
    return f"invalid JSON at line {lineno}, column {col}: {msg}"


def cannot_read(path: Path | str, exc: BaseException, dataset: str | None = None) -> str:
    """"cannot read PATH: why", without PATH (or the dataset) twice when the reason already
    starts with it (a SourceError names its file or dataset)."""
    why = str(exc) or type(exc).__name__
    for prefix in (f"dataset {dataset!r} ({path}): ", f"{path}: ", f"{Path(path).name}: "):
        if why.startswith(prefix):
            why = why[len(prefix):]
            break
    return f"cannot read {path}: {why}"


def unsupported_file(file: Path) -> str:
    """Why a data file is not read: its kind, and the kinds that are."""
    ext = "".join(file.suffixes[-2:]).lower() or "(no extension)"
    return (f"{file}: {ext} is not a dataset file specgen reads (it reads .jsonl/.ndjson, "
            ".json, either optionally .gz, .parquet, .arrow, or a directory of them; a CSV "
            "holds no conversation structure: convert it to JSONL rows with a `messages` "
            "list or a `prompt` column, docs/datasets.md)")


def check_readable(path: Path) -> str | None:
    """None when `path` is a data file or directory specgen reads, else the reason."""
    if path.is_file() and _kind(path) is None:
        return unsupported_file(path)
    return None


# -- helpers -------------------------------------------------------------------------------

def _kind(file: Path) -> str | None:
    name = file.name.lower()
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(JSON_SUFFIXES):
        if name in ("dataset_info.json", "state.json", "dataset_dict.json"):
            return None
        return "json"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(ARROW_SUFFIXES):
        return "arrow"
    return None


def _open_binary(file: Path) -> IO[bytes]:
    if file.name.lower().endswith(".gz"):
        return gzip.open(file, "rb")  # type: ignore[return-value]
    return open(file, "rb", buffering=_BLOCK)


def _names_split(rel: Path, split: str) -> bool:
    parts = [p.lower() for p in rel.parts]
    stem = parts[-1].split(".")[0]
    s = split.lower()
    return s in parts[:-1] or stem == s or stem.startswith((s + "-", s + "_"))


def _hf_split_dir(path: Path, split: str | None) -> Path:
    try:
        splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{path / 'dataset_dict.json'}: cannot read the split list ({exc})") from None
    if split is None:
        if "train" in splits:
            split = "train"
        elif len(splits) == 1:
            split = splits[0]
        else:
            raise SourceError(
                f"{path}: a DatasetDict with splits {', '.join(splits)}; set `split` in the "
                "[[dataset]] table"
            )
    if split not in splits:
        raise SourceError(f"{path}: no split {split!r}; the dataset has: {', '.join(splits)}")
    return path / split


def _hf_arrow_files(path: Path) -> list[Path]:
    state_file = path / "state.json"
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        names = [d["filename"] for d in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{state_file}: not a datasets save_to_disk state file ({exc})") from None
    files = [path / n for n in names]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise SourceError(f"{path}: data file(s) listed in state.json are missing: {', '.join(missing)}")
    return files
