"""Dataset readers: files -> `Conversation` rows, lazily, in file order (docs/datasets.md).

`iter_rows(ds, start)` is what the engine calls: each source row becomes one `Row` holding
either a `Conversation` or a `RowError` (file, line, reason) for a row that cannot be used.
Problems with the dataset as a whole (missing path, unknown layout, undetectable format) raise
`SourceError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..conversation import Conversation, stable_id
from .files import Record, SourceError, count_rows, data_files, iter_records
from .formats import FORMATS, detect_format
from .messages import FormatError, check_conversation
from .toolids import assign_tool_ids, resolve_native_ids

__all__ = [
    "FORMATS", "ID_KEYS", "Row", "RowError", "SourceError", "count_rows", "data_files",
    "detect_dataset_format", "detect_format", "iter_rows", "row_to_conversation",
    "source_files",
]

class DatasetConfig(Protocol):
    """What the readers use of a `[[dataset]]` table (config.DatasetConfig)."""

    name: str
    path: Path
    format: str
    split: str | None
    native_tool_ids: bool | None
    hub: str | None
    files: list[Path] | None


# Row fields that name a conversation, in order of preference.
ID_KEYS = ("id", "conversation_id", "conv_id", "uuid", "prompt_id", "question_id",
           "sample_id", "example_id", "idx", "_id")
DETECT_SCAN = 1000  # rows looked at (from the start) to find the first valid one


@dataclass(slots=True)
class RowError:
    """Why one source row cannot be used; `line` is None where files have no lines."""

    file: str
    line: int | None
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.reason}"


@dataclass(slots=True)
class Row:
    index: int
    conversation: Conversation | None = None
    error: RowError | None = None


def iter_rows(ds: DatasetConfig, start: int = 0, *, renderer: str | None = None) -> Iterator[Row]:
    """Rows of the dataset in file order, lazily, skipping the first `start` rows cheaply.

    `renderer` (the run's renderer name) decides the default of `native_tool_ids`.
    """
    fmt = ds.format
    if fmt == "auto":
        fmt = detect_dataset_format(ds)
    elif fmt not in FORMATS:
        raise SourceError(
            f"dataset {ds.name!r}: unknown format {fmt!r}; choose auto or one of "
            f"{', '.join(sorted(FORMATS))}"
        )
    native = resolve_native_ids(ds.native_tool_ids, renderer)
    for rec in iter_records(source_files(ds), start, ds.split):
        yield _row(rec, fmt, native)


def source_files(ds: DatasetConfig) -> Path | list[Path]:
    """What the readers read: the path, or a Hub dataset's resolved files."""
    if getattr(ds, "hub", None) is None:
        return ds.path
    if ds.files is None:
        raise SourceError(f"dataset {ds.name!r}: hf://datasets/{ds.hub} is not resolved yet "
                          "(the run resolves and downloads it before its first request; "
                          "`specgen preview --download` does it beforehand)")
    return ds.files


def detect_dataset_format(ds: DatasetConfig) -> str:
    """The format of the dataset's first valid row (read from the start of the dataset)."""
    first_keys: list[str] | None = None
    for n, rec in enumerate(iter_records(source_files(ds), 0, ds.split)):
        if n >= DETECT_SCAN:
            break
        if rec.error is not None:
            continue
        fmt = detect_format(rec.value)
        if fmt is not None:
            return fmt
        if first_keys is None:
            first_keys = sorted(rec.value) if isinstance(rec.value, dict) else [type(rec.value).__name__]
    if first_keys is None:
        return "openai"  # no readable row: every row will be reported as invalid anyway
    raise SourceError(
        f"dataset {ds.name!r} ({ds.path}): cannot detect the format; the first row has "
        f"{', '.join(first_keys)}. Set format = one of {', '.join(sorted(FORMATS))}"
    )


def row_to_conversation(value: Any, fmt: str, *, native_ids: bool = True,
                        key: str | None = None) -> Conversation:
    """One parsed row -> Conversation (raises FormatError with the reason)."""
    if not isinstance(value, dict):
        raise FormatError(f"row is not an object (got {type(value).__name__})")
    messages, tools = FORMATS[fmt](value)
    check_conversation(messages, tools)
    conv_id = _row_id(value, key)
    if conv_id is None:
        conv_id = stable_id({"messages": messages, "tools": tools})
    messages = assign_tool_ids(messages, native=native_ids)
    return Conversation(id=conv_id, messages=messages, tools=tools, meta={"format": fmt})


def _row(rec: Record, fmt: str, native: bool) -> Row:
    if rec.error is not None:
        return Row(rec.index, error=RowError(rec.file, rec.line, _where(rec) + rec.error))
    try:
        conv = row_to_conversation(rec.value, fmt, native_ids=native, key=rec.key)
    except FormatError as exc:
        from .hints import format_hint

        return Row(rec.index, error=RowError(rec.file, rec.line, f"{_where(rec)}{fmt}: {exc}"
                                             + format_hint(rec.value, fmt)))
    return Row(rec.index, conversation=conv)


def _where(rec: Record) -> str:
    return f"row {rec.index}: " if rec.line is None else ""


def _row_id(row: dict[str, Any], key: str | None) -> str | None:
    for k in ID_KEYS:
        v = row.get(k)
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int | str) and str(v).strip():
            return str(v)
    return key
