"""The run store: one SQLite file (WAL) per run dir, the single source of truth of a run.

Schema and semantics: docs/design.md, "Store schema". Writers batch their inserts inside
transactions (see specgen.engine); readers (status, export, verify, report) open the file
read-only and never block the writer.
"""

from __future__ import annotations

import sqlite3
import sys
import time
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

SCHEMA_VERSION = 1
STORE_FILE = "state.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions(
  id INTEGER PRIMARY KEY, pid INTEGER, host TEXT, started_at REAL, heartbeat_at REAL,
  ended_at REAL, state TEXT NOT NULL, stop_reason TEXT, argv TEXT);
CREATE TABLE IF NOT EXISTS datasets(
  name TEXT PRIMARY KEY, position INTEGER NOT NULL, path TEXT, format TEXT,
  rows_read INTEGER NOT NULL DEFAULT 0, rows_invalid INTEGER NOT NULL DEFAULT 0,
  rows_duplicate INTEGER NOT NULL DEFAULT 0, rows_other_shard INTEGER NOT NULL DEFAULT 0,
  exhausted INTEGER NOT NULL DEFAULT 0, state TEXT NOT NULL DEFAULT 'active');
CREATE TABLE IF NOT EXISTS invalid_rows(
  dataset TEXT NOT NULL, row_index INTEGER NOT NULL, line INTEGER, reason TEXT NOT NULL,
  PRIMARY KEY(dataset, row_index));
CREATE TABLE IF NOT EXISTS conversations(
  id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, conv_id TEXT NOT NULL,
  row_index INTEGER NOT NULL, status TEXT NOT NULL, end_reason TEXT, data BLOB NOT NULL,
  UNIQUE(dataset, conv_id));
CREATE INDEX IF NOT EXISTS conversations_status ON conversations(status);
CREATE TABLE IF NOT EXISTS tasks(
  id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL REFERENCES conversations(id),
  dataset TEXT NOT NULL, turn INTEGER NOT NULL, status TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0, error TEXT, UNIQUE(conversation, turn));
CREATE INDEX IF NOT EXISTS tasks_status ON tasks(status);
CREATE TABLE IF NOT EXISTS attempts(
  id INTEGER PRIMARY KEY, task INTEGER NOT NULL, session INTEGER, base_url TEXT,
  provider TEXT, model TEXT, started_at REAL, first_byte_at REAL, ended_at REAL,
  outcome TEXT NOT NULL, http_status INTEGER, error TEXT, prompt_tokens INTEGER,
  completion_tokens INTEGER, cost_usd REAL, generation_id TEXT);
CREATE INDEX IF NOT EXISTS attempts_task ON attempts(task);
CREATE TABLE IF NOT EXISTS results(
  task INTEGER PRIMARY KEY REFERENCES tasks(id), conversation INTEGER NOT NULL,
  dataset TEXT NOT NULL, turn INTEGER NOT NULL, provider TEXT, model TEXT,
  finish_reason TEXT, native_finish_reason TEXT, request BLOB NOT NULL, message TEXT NOT NULL,
  input_ids BLOB NOT NULL, n_prompt INTEGER NOT NULL, true_prompt_ids BLOB,
  true_completion_ids BLOB, prompt_tokens INTEGER, completion_tokens INTEGER,
  reasoning_tokens INTEGER, cost_usd REAL, repairs TEXT, latency_s REAL, created_at REAL);
CREATE INDEX IF NOT EXISTS results_conversation ON results(conversation, turn);
CREATE TABLE IF NOT EXISTS quarantine(
  id INTEGER PRIMARY KEY, task INTEGER, dataset TEXT, provider TEXT, reason TEXT NOT NULL,
  response BLOB, created_at REAL);
CREATE TABLE IF NOT EXISTS events(
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, session INTEGER, kind TEXT NOT NULL,
  dataset TEXT, provider TEXT, detail TEXT);
"""


class StoreError(Exception):
    """The store cannot be opened or is not a specgen store."""


# -- encodings --------------------------------------------------------------------------------
def pack_ids(ids: Sequence[int]) -> bytes:
    """Token ids as little-endian uint32."""
    a = array("I", ids)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


def unpack_ids(blob: bytes | None) -> list[int] | None:
    if blob is None:
        return None
    a = array("I")
    a.frombytes(blob)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tolist()


def pack_json(obj: Any) -> bytes:
    return zlib.compress(orjson.dumps(obj), 1)


def unpack_json(blob: bytes | None) -> Any:
    return None if blob is None else orjson.loads(zlib.decompress(blob))


# -- rows -------------------------------------------------------------------------------------
@dataclass(slots=True)
class ResultRow:
    """One stored sample (one API answer) with what exporters and verify need."""

    task: int
    conversation: int
    conv_id: str
    dataset: str
    turn: int
    provider: str | None
    model: str | None
    finish_reason: str | None
    native_finish_reason: str | None
    request: dict[str, Any]  # {"messages": [...], "tools": [...] | None} as sent
    message: dict[str, Any]  # normalised assistant message (OpenAI format)
    input_ids: list[int]
    n_prompt: int
    true_prompt_ids: list[int] | None
    true_completion_ids: list[int] | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    cost_usd: float | None
    repairs: list[str]
    latency_s: float | None
    created_at: float | None

    @property
    def loss_mask(self) -> list[int]:
        return [0] * self.n_prompt + [1] * (len(self.input_ids) - self.n_prompt)


RESULT_COLUMNS = (
    "r.task, r.conversation, c.conv_id, r.dataset, r.turn, r.provider, r.model, "
    "r.finish_reason, r.native_finish_reason, r.request, r.message, r.input_ids, r.n_prompt, "
    "r.true_prompt_ids, r.true_completion_ids, r.prompt_tokens, r.completion_tokens, "
    "r.reasoning_tokens, r.cost_usd, r.repairs, r.latency_s, r.created_at"
)


def _result_row(row: tuple) -> ResultRow:
    return ResultRow(
        task=row[0], conversation=row[1], conv_id=row[2], dataset=row[3], turn=row[4],
        provider=row[5], model=row[6], finish_reason=row[7], native_finish_reason=row[8],
        request=unpack_json(row[9]), message=orjson.loads(row[10]),
        input_ids=unpack_ids(row[11]) or [], n_prompt=row[12],
        true_prompt_ids=unpack_ids(row[13]), true_completion_ids=unpack_ids(row[14]),
        prompt_tokens=row[15], completion_tokens=row[16], reasoning_tokens=row[17],
        cost_usd=row[18], repairs=orjson.loads(row[19]) if row[19] else [],
        latency_s=row[20], created_at=row[21],
    )


# -- the store --------------------------------------------------------------------------------
class Store:
    """A run's SQLite store. Use `Store.create(run_dir)` / `Store.open(run_dir, readonly=)`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, readonly: bool):
        self.path = path
        self.conn = conn
        self.readonly = readonly

    @classmethod
    def create(cls, run_dir: str | Path) -> Store:
        """Open the store of `run_dir` for writing, creating the dir and schema if needed."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / STORE_FILE
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=10000")
        conn.executescript(SCHEMA)
        store = cls(path, conn, readonly=False)
        version = store.get_meta("schema_version")
        if version is None:
            store.set_meta("schema_version", str(SCHEMA_VERSION))
            store.set_meta("created_at", repr(time.time()))
        elif int(version) != SCHEMA_VERSION:
            raise StoreError(f"{path}: schema version {version}, this specgen reads {SCHEMA_VERSION}")
        return store

    @classmethod
    def open(cls, run_dir: str | Path, *, readonly: bool = True) -> Store:
        """Open an existing run's store (read-only by default: safe while a run writes)."""
        run_dir = Path(run_dir)
        path = run_dir / STORE_FILE if run_dir.is_dir() or not run_dir.exists() else run_dir
        if not path.exists():
            raise StoreError(f"{run_dir}: no specgen run here ({STORE_FILE} not found)")
        if not readonly:
            return cls.create(path.parent)
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=10000")
        try:
            conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path}: not a specgen store ({exc})") from None
        return cls(path, conn, readonly=True)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- meta ---------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute(
            "INSERT INTO meta(key, value) VALUES(?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value))

    def meta(self) -> dict[str, str]:
        return dict(self.conn.execute("SELECT key, value FROM meta"))

    # -- reads --------------------------------------------------------------------------------
    def iter_results(
        self, datasets: Sequence[str] | None = None, *, batch: int = 256
    ) -> Iterator[ResultRow]:
        """Every stored sample in a deterministic order: dataset position, source row, turn."""
        sql = (
            f"SELECT {RESULT_COLUMNS} FROM results r "
            "JOIN conversations c ON c.id = r.conversation "
            "JOIN datasets d ON d.name = r.dataset "
        )
        args: list[Any] = []
        if datasets:
            sql += f"WHERE r.dataset IN ({','.join('?' * len(datasets))}) "
            args.extend(datasets)
        sql += "ORDER BY d.position, c.row_index, r.turn"
        cur = self.conn.execute(sql, args)
        while rows := cur.fetchmany(batch):
            for row in rows:
                yield _result_row(row)

    def conversation(self, conversation: int):
        """The stored source Conversation of a conversation row id."""
        from .conversation import Conversation

        row = self.conn.execute(
            "SELECT data FROM conversations WHERE id=?", (conversation,)).fetchone()
        if row is None:
            raise KeyError(conversation)
        return Conversation.from_json(unpack_json(row[0]))

    def dataset_names(self) -> list[str]:
        return [r[0] for r in self.conn.execute("SELECT name FROM datasets ORDER BY position")]
