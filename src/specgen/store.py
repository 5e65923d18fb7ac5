"""The run store: one SQLite file (WAL) per run dir, the single source of truth of a run.

Schema and semantics: docs/design.md, "Store schema". Writers batch their inserts inside
transactions (see specgen.engine); readers (status, export, verify, report) open the file
read-only and never block the writer.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import sys
import tempfile
import time
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from . import jsonexact
from .display import provider_label
from .records import (
    AttemptRecord,
    ConversationRecord,
    DatasetRecord,
    EventRecord,
    InvalidRowRecord,
    QuarantineRecord,
    ResultRecord,
    TaskRecord,
    VerdictRecord,
)

SCHEMA_VERSION = 1
STORE_FILE = "state.sqlite"

# the totals row of a new (or re-judged) attempt: one more attempt, its tokens and cost
_ADD_NEW_TO_TOTALS = """\
  INSERT INTO totals VALUES(COALESCE(NEW.dataset, ''), COALESCE(NEW.provider, ''), NEW.outcome,
    1, COALESCE(NEW.prompt_tokens, 0), COALESCE(NEW.completion_tokens, 0),
    COALESCE(NEW.cost_usd, 0), NEW.cost_usd IS NOT NULL)
  ON CONFLICT(dataset, provider, outcome) DO UPDATE SET attempts = attempts + 1,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    cost_usd = cost_usd + excluded.cost_usd, cost_known = cost_known + excluded.cost_known;
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions(
  id INTEGER PRIMARY KEY, pid INTEGER, host TEXT, started_at REAL, heartbeat_at REAL,
  ended_at REAL, state TEXT NOT NULL, stop_reason TEXT, argv TEXT);
CREATE TABLE IF NOT EXISTS datasets(
  name TEXT PRIMARY KEY, position INTEGER NOT NULL, path TEXT, format TEXT,
  rows_read INTEGER NOT NULL DEFAULT 0, rows_invalid INTEGER NOT NULL DEFAULT 0,
  rows_duplicate INTEGER NOT NULL DEFAULT 0, rows_other_shard INTEGER NOT NULL DEFAULT 0,
  exhausted INTEGER NOT NULL DEFAULT 0, state TEXT NOT NULL DEFAULT 'active',
  config_hash TEXT);
CREATE TABLE IF NOT EXISTS invalid_rows(
  dataset TEXT NOT NULL, row_index INTEGER NOT NULL, line INTEGER, reason TEXT NOT NULL,
  PRIMARY KEY(dataset, row_index));
CREATE TABLE IF NOT EXISTS conversations(
  id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, conv_id TEXT NOT NULL,
  row_index INTEGER NOT NULL, status TEXT NOT NULL, end_reason TEXT, data BLOB NOT NULL,
  UNIQUE(dataset, conv_id));
CREATE INDEX IF NOT EXISTS conversations_status ON conversations(status);
CREATE INDEX IF NOT EXISTS conversations_dataset_status ON conversations(dataset, status);
CREATE TABLE IF NOT EXISTS tasks(
  id INTEGER PRIMARY KEY, conversation INTEGER NOT NULL REFERENCES conversations(id),
  dataset TEXT NOT NULL, turn INTEGER NOT NULL, status TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0, error TEXT, UNIQUE(conversation, turn));
CREATE INDEX IF NOT EXISTS tasks_status ON tasks(status);
CREATE INDEX IF NOT EXISTS tasks_dataset_status ON tasks(dataset, status);
CREATE TABLE IF NOT EXISTS attempts(
  id INTEGER PRIMARY KEY, task INTEGER NOT NULL, session INTEGER, base_url TEXT,
  provider TEXT, model TEXT, started_at REAL, first_byte_at REAL, ended_at REAL,
  outcome TEXT NOT NULL, http_status INTEGER, error TEXT, prompt_tokens INTEGER,
  completion_tokens INTEGER, cost_usd REAL, generation_id TEXT, dataset TEXT,
  first_token_at REAL);
CREATE INDEX IF NOT EXISTS attempts_task ON attempts(task);
CREATE TABLE IF NOT EXISTS results(
  task INTEGER PRIMARY KEY REFERENCES tasks(id), conversation INTEGER NOT NULL,
  dataset TEXT NOT NULL, turn INTEGER NOT NULL, provider TEXT, model TEXT,
  finish_reason TEXT, native_finish_reason TEXT, request BLOB NOT NULL, message TEXT NOT NULL,
  input_ids BLOB NOT NULL, n_prompt INTEGER NOT NULL, true_prompt_ids BLOB,
  true_completion_ids BLOB, prompt_tokens INTEGER, completion_tokens INTEGER,
  reasoning_tokens INTEGER, cost_usd REAL, repairs TEXT, latency_s REAL, created_at REAL,
  count_check TEXT, tool_matches TEXT, quantization TEXT, sampling TEXT,
  prompt_delta INTEGER, completion_delta INTEGER, prompt_check TEXT, completion_check TEXT,
  prompt_shape TEXT);
CREATE INDEX IF NOT EXISTS results_conversation ON results(conversation, turn);
CREATE TABLE IF NOT EXISTS quarantine(
  id INTEGER PRIMARY KEY, task INTEGER, dataset TEXT, provider TEXT, reason TEXT NOT NULL,
  response BLOB, created_at REAL, detail TEXT);
-- Running totals of attempts per (dataset, provider, outcome), kept by a trigger so every
-- writer (the engine, merge) keeps them right; status and resume read them instead of
-- scanning millions of attempts.
CREATE TABLE IF NOT EXISTS totals(
  dataset TEXT NOT NULL, provider TEXT NOT NULL, outcome TEXT NOT NULL,
  attempts INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
  cost_usd REAL NOT NULL, cost_known INTEGER NOT NULL, PRIMARY KEY(dataset, provider, outcome));
CREATE TRIGGER IF NOT EXISTS attempts_totals AFTER INSERT ON attempts BEGIN
{ADD_NEW_TO_TOTALS}END;
-- an answered attempt whose sample was judged again and moved to quarantine changes outcome:
-- the totals move with it, so no count reads it as kept
CREATE TRIGGER IF NOT EXISTS attempts_totals_moved AFTER UPDATE OF outcome ON attempts
WHEN OLD.outcome != NEW.outcome BEGIN
  UPDATE totals SET attempts = attempts - 1,
    prompt_tokens = prompt_tokens - COALESCE(OLD.prompt_tokens, 0),
    completion_tokens = completion_tokens - COALESCE(OLD.completion_tokens, 0),
    cost_usd = cost_usd - COALESCE(OLD.cost_usd, 0),
    cost_known = cost_known - (OLD.cost_usd IS NOT NULL)
  WHERE dataset = COALESCE(OLD.dataset, '') AND provider = COALESCE(OLD.provider, '')
    AND outcome = OLD.outcome;
  DELETE FROM totals WHERE dataset = COALESCE(OLD.dataset, '')
    AND provider = COALESCE(OLD.provider, '') AND outcome = OLD.outcome AND attempts <= 0;
{ADD_NEW_TO_TOTALS}END;
-- work made again because its provider was excluded (engine.redo): one row per conversation
-- per redo, from `turn` on; the samples it replaced are kept in superseded_results
CREATE TABLE IF NOT EXISTS redone(
  conversation INTEGER NOT NULL, turn INTEGER NOT NULL, tasks INTEGER NOT NULL,
  samples INTEGER NOT NULL, session INTEGER, at REAL NOT NULL, attempt_floor INTEGER NOT NULL,
  providers TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events(
  id INTEGER PRIMARY KEY, ts REAL NOT NULL, session INTEGER, kind TEXT NOT NULL,
  dataset TEXT, provider TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS batches(
  id TEXT PRIMARY KEY, session INTEGER, created_at REAL NOT NULL, state TEXT NOT NULL,
  provider_id TEXT, input_file_id TEXT, output_file_id TEXT, error_file_id TEXT,
  lines INTEGER NOT NULL, bytes INTEGER NOT NULL, completed INTEGER, failed INTEGER,
  updated_at REAL, detail TEXT, in_progress_at REAL);
CREATE TABLE IF NOT EXISTS batch_lines(
  batch TEXT NOT NULL, custom_id TEXT NOT NULL, dataset TEXT NOT NULL, conv_id TEXT NOT NULL,
  turn INTEGER NOT NULL, outcome TEXT, PRIMARY KEY(batch, custom_id));
CREATE INDEX IF NOT EXISTS batch_lines_key ON batch_lines(dataset, conv_id, turn);
""".replace("{ADD_NEW_TO_TOTALS}", _ADD_NEW_TO_TOTALS)


# Columns added to a table after its first release; `Store.create` adds them to older stores.
ADDED_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "results": (("count_check", "TEXT"), ("tool_matches", "TEXT"), ("quantization", "TEXT"),
                ("sampling", "TEXT"), ("prompt_delta", "INTEGER"),
                ("completion_delta", "INTEGER"), ("prompt_check", "TEXT"),
                ("completion_check", "TEXT"), ("prompt_shape", "TEXT")),
    "attempts": (("first_token_at", "REAL"),),
    "quarantine": (("detail", "TEXT"),),
    "batches": (("in_progress_at", "REAL"),),
}


class StoreError(Exception):
    """The store cannot be opened or is not a specgen store."""


class StoreWriteError(Exception):
    """A write the store could not take because of where it lives (not a bug): the disk is
    full, the run dir is read-only, the file is corrupt or gone, another process holds it.
    `kind` is one of STORE_ERROR_KINDS; the original error is `__cause__`. The rows of the
    failed write are not in the store (the transaction was rolled back) and can be retried."""

    def __init__(self, kind: str, message: str, path: str | Path | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.path = path


STORE_ERROR_KINDS = ("disk_full", "read_only", "corrupt", "missing", "locked", "io")
_KIND_LABELS = {
    "disk_full": "disk full", "read_only": "store not writable", "corrupt": "store corrupt",
    "missing": "store missing", "locked": "store locked", "io": "store I/O error",
}
# primary SQLite result codes (https://sqlite.org/rescode.html)
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_IOERR = 5, 6, 8, 10
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 11, 13, 14, 26
_SQLITE_READONLY_DBMOVED = _SQLITE_READONLY | (4 << 8)  # the db file was unlinked / moved
_SQLITE_KINDS = {
    _SQLITE_FULL: "disk_full", _SQLITE_READONLY: "read_only", _SQLITE_CORRUPT: "corrupt",
    _SQLITE_NOTADB: "corrupt", _SQLITE_IOERR: "io", _SQLITE_CANTOPEN: "missing",
    _SQLITE_BUSY: "locked", _SQLITE_LOCKED: "locked",
}
_MESSAGE_KINDS = (  # fallback when the error carries no code
    ("database or disk is full", "disk_full"),
    ("readonly database", "read_only"),
    ("database disk image is malformed", "corrupt"),
    ("file is not a database", "corrupt"),
    ("disk i/o error", "io"),
    ("unable to open database file", "missing"),
    ("database is locked", "locked"),
    ("database table is locked", "locked"),
)
_ERRNO_KINDS = {
    errno.ENOSPC: "disk_full", errno.EDQUOT: "disk_full", errno.EROFS: "read_only",
    errno.EACCES: "read_only", errno.EPERM: "read_only", errno.ENOENT: "missing",
    errno.EIO: "io",
}
_NEARLY_FULL = 1 << 20  # free bytes under which an I/O error is taken for a full disk


def _run_dir_of(path: str | Path) -> Path:
    p = Path(path)
    return p if p.is_dir() else p.parent


def classify_store_error(exc: BaseException, path: str | Path) -> StoreWriteError | None:
    """The `StoreWriteError` an exception from writing the store at `path` (the store file or
    its run dir) amounts to, or None when it is not about the store's medium (a constraint
    violation, a closed connection, a bad value: a bug, to be raised as it is)."""
    if isinstance(exc, StoreWriteError):
        return exc
    kind: str | None = None
    moved = False
    if isinstance(exc, sqlite3.Error):
        if isinstance(exc, sqlite3.IntegrityError | sqlite3.ProgrammingError
                      | sqlite3.InterfaceError):
            return None
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            kind = _SQLITE_KINDS.get(code & 0xFF)
            moved = code == _SQLITE_READONLY_DBMOVED
        if kind is None:
            text = str(exc).lower()
            kind = next((k for needle, k in _MESSAGE_KINDS if needle in text), None)
    elif isinstance(exc, OSError):
        kind = _ERRNO_KINDS.get(exc.errno)  # type: ignore[arg-type]
    if kind is None:
        return None
    run_dir = _run_dir_of(path)
    file_gone = Path(path) != run_dir and not Path(path).exists()
    if moved or (kind in ("io", "missing", "read_only") and not run_dir.exists()):
        kind = "missing"  # SQLite: "attempt to write a readonly database" once it is unlinked
    elif kind in ("io", "missing") and file_gone:
        kind = "missing"
    elif kind in ("io", "missing") and free_bytes(run_dir) < _NEARLY_FULL:
        kind = "disk_full"  # some failed writes on a full disk come back as I/O errors
    elif kind == "missing":  # "unable to open database file" with the file there
        kind = "read_only" if check_writable(run_dir) else "io"
    detail = str(exc) or type(exc).__name__
    return StoreWriteError(kind, f"{_KIND_LABELS[kind]}: {detail} (run dir {run_dir})", path)


def open_problem(exc: BaseException, run_dir: str | Path) -> str | None:
    """What to tell a user whose run store cannot be opened or created because of where it
    lives (a full disk, a read-only dir, a lock), else None (a file that is not a store is
    another matter)."""
    err = classify_store_error(exc, Path(run_dir) / STORE_FILE)
    if err is None or err.kind == "corrupt":
        return None
    if err.kind == "disk_full":
        return (f"the disk of the run dir {run_dir} is full ({free_bytes(run_dir):,} bytes "
                f"free): the run store cannot be written ({exc}); free space there or choose "
                "another run_dir — nothing was sent")
    if err.kind == "read_only":
        return (f"the run store in {run_dir} cannot be written ({exc}): "
                f"{check_writable(run_dir) or 'a read-only file or directory'}")
    if err.kind == "locked":
        return f"the run store in {run_dir} is locked by another process ({exc})"
    return f"the run store in {run_dir} cannot be used: {err.message}"


def free_bytes(path: str | Path) -> int:
    """Bytes free for this user on the filesystem of `path` (or of its nearest existing
    parent); 0 when it cannot be told."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return 0


def check_writable(run_dir: str | Path) -> str | None:
    """None when the run dir (or, if it does not exist yet, the nearest existing parent that
    would hold it) and its store files can be written; else a message saying why not
    (read-only filesystem, permissions, no space). Tested for real: a small temp file is
    created, written, synced and removed, and the store files are opened for appending
    (which changes nothing), so it holds for root and read-only mounts alike."""
    run_dir = Path(run_dir)
    where = run_dir
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        return f"the run dir {run_dir} is not a directory ({where} is a file)"
    name = None
    try:
        fd, name = tempfile.mkstemp(prefix=".specgen-writable-", dir=where)
        try:
            os.write(fd, b"specgen\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return _not_writable(run_dir, where, exc)
    finally:
        if name is not None:
            try:
                os.unlink(name)
            except OSError:
                pass
    for suffix in ("", "-wal", "-shm"):
        f = run_dir / (STORE_FILE + suffix)
        if not f.exists():
            continue
        try:
            with open(f, "ab"):
                pass
        except OSError as exc:
            return _not_writable(run_dir, f, exc)
    return None


def _not_writable(run_dir: Path, what: Path, exc: OSError) -> str:
    why = {
        errno.EROFS: "it is on a read-only filesystem",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted (permissions or an immutable file)",
        errno.ENOSPC: "the disk is full (no space left on the device)",
        errno.EDQUOT: "the disk quota is exhausted",
    }.get(exc.errno, exc.strerror or str(exc))  # type: ignore[arg-type]
    if what == run_dir:
        head = f"cannot write to the run dir {run_dir}"
    elif what.is_dir():
        head = f"cannot create the run dir {run_dir} in {what}"
    else:
        head = f"cannot write to the run store {what}"
    return f"{head}: {why}; the run needs to write its store there (fix it or choose another run_dir)"


def _rollback_quietly(conn: sqlite3.Connection) -> None:
    """Roll back an open transaction, if any, without letting a failed rollback (SQLite
    often rolled back itself already, e.g. on SQLITE_FULL) hide the error that caused it."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _connect_rw(path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=10000")
    return conn


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
    return zlib.compress(jsonexact.dumps(obj), 1)


def unpack_json(blob: bytes | None) -> Any:
    return None if blob is None else jsonexact.loads(zlib.decompress(blob))


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
    # what the provider's own token counts say of the sample (quality.witness): exact,
    # repaired, unverified, mismatch or true_ids; None for samples stored before the check
    count_check: str | None = None
    # how each recorded tool result in the prompt was matched to the model's call (exact,
    # name, position; specgen.planner), in order; empty when it holds none
    tool_matches: list[str] = field(default_factory=list)
    # the quantization that served it: revealed by the answer, else the endpoint list's for its
    # provider ("a+b" when several of its allowed endpoints could have); None without a list
    quantization: str | None = None
    # the sampling this sample was drawn with (specgen.sampling.SampleSettings.to_json:
    # temperature, top_p, reasoning, thinking, sample index); None for samples stored before
    sampling: dict[str, Any] | None = None
    # the count witness's two sides (docs/quality.md, "Two sides"): the deltas provider −
    # ours, each side's verdict and the request shape; None for samples stored before them
    prompt_delta: int | None = None
    completion_delta: int | None = None
    prompt_check: str | None = None
    completion_check: str | None = None
    prompt_shape: str | None = None

    @property
    def loss_mask(self) -> list[int]:
        return [0] * self.n_prompt + [1] * (len(self.input_ids) - self.n_prompt)


RESULT_COLUMNS = (
    "r.task, r.conversation, c.conv_id, r.dataset, r.turn, r.provider, r.model, "
    "r.finish_reason, r.native_finish_reason, r.request, r.message, r.input_ids, r.n_prompt, "
    "r.true_prompt_ids, r.true_completion_ids, r.prompt_tokens, r.completion_tokens, "
    "r.reasoning_tokens, r.cost_usd, r.repairs, r.latency_s, r.created_at, r.count_check, "
    "r.tool_matches, r.quantization, r.sampling, r.prompt_delta, r.completion_delta, "
    "r.prompt_check, r.completion_check, r.prompt_shape"
)


def decode_result_row(row: tuple) -> ResultRow:
    """A `ResultRow` from a row selected with `RESULT_COLUMNS` (raises on a corrupt blob)."""
    return ResultRow(
        task=row[0], conversation=row[1], conv_id=row[2], dataset=row[3], turn=row[4],
        provider=row[5], model=row[6], finish_reason=row[7], native_finish_reason=row[8],
        request=unpack_json(row[9]), message=jsonexact.loads(row[10]),
        input_ids=unpack_ids(row[11]) or [], n_prompt=row[12],
        true_prompt_ids=unpack_ids(row[13]), true_completion_ids=unpack_ids(row[14]),
        prompt_tokens=row[15], completion_tokens=row[16], reasoning_tokens=row[17],
        cost_usd=row[18], repairs=orjson.loads(row[19]) if row[19] else [],
        latency_s=row[20], created_at=row[21], count_check=row[22],
        tool_matches=decode_tool_matches(row[23]), quantization=row[24],
        sampling=orjson.loads(row[25]) if len(row) > 25 and row[25] else None,
        **(dict(zip(("prompt_delta", "completion_delta", "prompt_check", "completion_check",
                     "prompt_shape"), row[26:31], strict=True)) if len(row) >= 31 else {}),
    )


def encode_tool_matches(kinds: Sequence[str]) -> str | None:
    """The `results.tool_matches` text of a sample: a JSON list, NULL when it is empty."""
    return orjson.dumps(list(kinds)).decode() if kinds else None


def decode_tool_matches(text: str | None) -> list[str]:
    return orjson.loads(text) if text else []


# -- the store --------------------------------------------------------------------------------
class Store:
    """A run's SQLite store. Use `Store.create(run_dir)` / `Store.open(run_dir, readonly=)`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, readonly: bool):
        self.path = path
        self.conn = conn
        self.readonly = readonly
        self._remember_files()

    def _remember_files(self) -> None:
        """Record which files (device, inode) the connection has open, for identity_problem."""
        self._abspath = os.path.abspath(self.path)
        self._file_ids = {suffix: _file_id(self._abspath + suffix)
                          for suffix in ("", "-wal", "-shm")}

    @classmethod
    def create(cls, run_dir: str | Path) -> Store:
        """Open the store of `run_dir` for writing, creating the dir and schema if needed."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / STORE_FILE
        conn = _connect_rw(path)
        conn.executescript(SCHEMA)
        store = cls(path, conn, readonly=False)  # after the schema: the -wal/-shm exist
        store._rebuild_totals_if_missing()
        store._add_missing_columns()
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
        if path.is_dir():
            raise StoreError(f"{path} is a directory, not a specgen store: move it away "
                             "(or point at another run dir)")
        if path.stat().st_size == 0:
            raise StoreError(f"{path} is empty (0 bytes), not a specgen store: move it away "
                             "to start a new run there (or restore it from a copy)")
        if not readonly:
            return cls.create(path.parent)
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA busy_timeout=10000")
            conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            # a full disk (a WAL to recover, a -shm to make) is not a file that is no store
            raise StoreError(open_problem(exc, path.parent)
                             or f"{path}: not a specgen store ({exc})") from None
        return cls(path, conn, readonly=True)

    def close(self) -> None:
        self.conn.close()

    def _rebuild_totals_if_missing(self) -> None:
        """A store written before the totals trigger existed gets its totals computed once."""
        c = self.conn
        if c.execute("SELECT 1 FROM totals LIMIT 1").fetchone() is not None:
            return
        if c.execute("SELECT 1 FROM attempts LIMIT 1").fetchone() is None:
            return
        c.execute("BEGIN IMMEDIATE")
        try:
            c.execute(f"INSERT INTO totals {_TOTALS_FROM_ATTEMPTS}")
            c.execute("COMMIT")
        except BaseException:
            _rollback_quietly(c)
            raise

    def _result_columns(self) -> str:
        """RESULT_COLUMNS, with NULL for columns an older store (opened read-only) lacks."""
        have = {row[1] for row in self.conn.execute("PRAGMA table_info(results)")}
        cols = RESULT_COLUMNS
        for name, _decl in ADDED_COLUMNS["results"]:
            if name not in have:
                cols = cols.replace(f"r.{name}", f"NULL AS {name}")
        return cols

    def _add_missing_columns(self) -> None:
        """Columns added since a store was created (same schema version: additive only)."""
        for table, added in ADDED_COLUMNS.items():
            have = {row[1] for row in self.conn.execute(f"PRAGMA table_info({table})")}
            for name, decl in added:
                if name not in have:
                    self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")

    def _attempt_groups(self) -> list[tuple]:
        """(dataset, provider, outcome, attempts, prompt, completion, cost, cost_known) rows:
        from the totals table, or (an older store opened read-only) from the attempts."""
        try:
            rows = self.conn.execute("SELECT * FROM totals").fetchall()
        except sqlite3.OperationalError:
            rows = []
        if rows:
            return rows
        return self.conn.execute(_TOTALS_FROM_ATTEMPTS).fetchall()

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
        for row in self.iter_result_tuples(datasets, batch=batch):
            yield decode_result_row(row)

    def iter_result_tuples(
        self, datasets: Sequence[str] | None = None, *, batch: int = 256
    ) -> Iterator[tuple]:
        """`iter_results` undecoded (rows of `RESULT_COLUMNS`), for readers such as verify that
        report a corrupt blob instead of stopping at it."""
        sql = (
            f"SELECT {self._result_columns()} FROM results r "
            "LEFT JOIN conversations c ON c.id = r.conversation "
            "LEFT JOIN datasets d ON d.name = r.dataset "
        )
        args: list[Any] = []
        if datasets:
            sql += f"WHERE r.dataset IN ({','.join('?' * len(datasets))}) "
            args.extend(datasets)
        sql += "ORDER BY d.position, c.row_index, r.turn, r.task"
        cur = self.conn.execute(sql, args)
        while rows := cur.fetchmany(batch):
            yield from rows

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

    # -- writes (the engine's; one writer process per run dir) --------------------------------
    def write(self, batch: Batch) -> None:
        """Apply a batch in one transaction: all of it is durable, or none of it.

        Raises `StoreWriteError` (its `kind` says why; the original error is `__cause__`)
        when the store's medium refuses the write — disk full, read-only, corrupt, deleted,
        locked, I/O error; nothing of the batch is then in the store, and the same batch can
        be written again later. Other errors (bugs) are raised as they are."""
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only")
        try:
            self._write(batch)
        except (sqlite3.Error, OSError) as exc:
            err = classify_store_error(exc, self.path)
            if err is None:
                raise
            raise err from exc

    def _write(self, batch: Batch) -> None:
        c = self.conn
        if c.in_transaction:  # a failed COMMIT whose rollback failed too: start clean
            c.execute("ROLLBACK")
        c.execute("BEGIN IMMEDIATE")
        try:
            if batch.meta:
                c.executemany(
                    "INSERT INTO meta(key, value) VALUES(?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value=excluded.value", batch.meta.items())
            if batch.datasets:
                c.executemany(_INSERT_DATASET, batch.datasets.values())
            if batch.conversations:
                c.executemany(_INSERT_CONVERSATION, batch.conversations)
            if batch.conv_status:
                c.executemany(
                    "UPDATE conversations SET status=?, end_reason=? WHERE id=?",
                    [(st, reason, cid) for cid, (st, reason) in batch.conv_status.items()])
            if batch.tasks:
                c.executemany(_INSERT_TASK, batch.tasks.values())
            if batch.attempts:
                c.executemany(_INSERT_ATTEMPT, batch.attempts)
            if batch.results:
                c.executemany(_INSERT_RESULT, _full_rows(batch.results))
            if batch.verdicts:
                c.executemany(_UPDATE_VERDICT, [(*v[1:], v.task)
                                                for v in batch.verdicts.values()])
            if batch.quarantine:
                c.executemany(_INSERT_QUARANTINE, batch.quarantine)
            if batch.moved:  # samples judged again as mismatches: quarantined after all
                tasks = [(q.task,) for q in batch.moved.values()]
                c.executemany("DELETE FROM results WHERE task=?", tasks)
                c.executemany(_INSERT_QUARANTINE, batch.moved.values())
                c.executemany("UPDATE tasks SET status='quarantined', error=? WHERE id=?",
                              [(f"quarantined:{q.reason}", q.task)
                               for q in batch.moved.values()])
                # its answered attempt too: every count of kept samples (status, the
                # providers' outcomes, the report) reads them, so none counts it as kept
                c.executemany("UPDATE attempts SET outcome=?, error=? WHERE task=? AND "
                              "outcome='ok'", [(f"quarantined:{q.reason}", _moved_why(q), q.task)
                                               for q in batch.moved.values()])
            if batch.invalid_rows:
                c.executemany(_INSERT_INVALID_ROW, batch.invalid_rows)
            if batch.events:
                c.executemany(_INSERT_EVENT, batch.events)
            if batch.session is not None:
                c.execute(
                    "UPDATE sessions SET heartbeat_at=?, state=?, stop_reason=?, ended_at=? "
                    "WHERE id=?", batch.session)
            c.execute("COMMIT")
        except BaseException:
            _rollback_quietly(c)
            raise

    # -- the file under the connection --------------------------------------------------------
    def identity_problem(self) -> str | None:
        """None while the files at `path` are the ones the connection opened; else what
        happened to them: "deleted" (no file at `path`: commits would go to an unlinked
        inode and vanish with the process), "replaced" (another file at `path`), or "partly
        deleted (its -wal/-shm file was removed or replaced)". Three stat calls."""
        ids = self._file_ids
        now = _file_id(self._abspath)
        if now is None:
            return "deleted"
        if ids[""] is not None and now != ids[""]:
            return "replaced"
        for suffix in ("-wal", "-shm"):
            if ids[suffix] is not None and _file_id(self._abspath + suffix) != ids[suffix]:
                return "partly deleted (its -wal/-shm file was removed or replaced)"
        return None

    def restore_to_path(self) -> bool:
        """Write the open connection's whole database (what the unlinked file and its WAL
        hold, as the connection sees it: every committed row) back to `path` after the file
        (or its -wal/-shm) was deleted under it, then reopen the connection on the restored
        file so later commits land in it. True when restored; False when there is nothing
        to restore (the files are intact, or another file was put at `path`: that one is
        left alone) or the copy failed (no space: nothing changed, the connection still
        holds everything; try again later). Call it only while no commit is under way.

        The copy goes through `sqlite3.Connection.backup` into a temp file in the same dir,
        is synced, then renamed over `path` once the old connection is closed and stale
        -wal/-shm files are removed (so the new connection does not replay them)."""
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only")
        problem = self.identity_problem()
        if problem is None or problem == "replaced":
            return False
        _rollback_quietly(self.conn)
        path = self._abspath
        folder = os.path.dirname(path)
        tmp = None
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{STORE_FILE}.restore-", dir=folder)
            os.close(fd)
            dst = sqlite3.connect(tmp, isolation_level=None)
            try:
                self.conn.backup(dst)
            finally:
                dst.close()
            fsync_path(tmp)
        except (sqlite3.Error, OSError):
            if tmp is not None:
                for name in (tmp, tmp + "-journal"):
                    try:
                        os.unlink(name)
                    except OSError:
                        pass
            return False
        try:
            self.conn.close()
        except sqlite3.Error:
            pass
        for suffix in ("-wal", "-shm"):  # the old file's: must not be replayed onto the copy
            try:
                os.unlink(path + suffix)
            except FileNotFoundError:
                pass
        os.replace(tmp, path)
        fsync_path(folder)
        self.conn = _connect_rw(path)
        self.conn.execute("SELECT 1 FROM meta LIMIT 1").fetchone()  # opens the -wal/-shm
        self._remember_files()
        return True

    def start_session(self, pid: int, host: str, argv: str, now: float) -> int:
        """Record a new engine session (state running); returns its id. Sessions still
        marked running (their process died without recording an end: the caller holds the
        run dir's lock, so none is alive) are closed as stopped first."""
        self.conn.execute(
            "UPDATE sessions SET state='stopped', ended_at=heartbeat_at, stop_reason="
            "'interrupted: the process ended without recording a stop (kill -9, crash, power "
            "loss)' WHERE state='running'")
        cur = self.conn.execute(
            "INSERT INTO sessions(pid, host, started_at, heartbeat_at, state, argv) "
            "VALUES(?, ?, ?, ?, 'running', ?)", (pid, host, now, now, argv))
        return int(cur.lastrowid)

    # -- reads for resume and status ----------------------------------------------------------
    def datasets_table(self) -> dict[str, dict[str, Any]]:
        """The datasets table keyed by name (resume cursors and counters)."""
        cur = self.conn.execute(f"SELECT {DATASET_COLUMNS} FROM datasets ORDER BY position")
        names = _cols(DATASET_COLUMNS)
        return {row[0]: dict(zip(names, row, strict=True)) for row in cur}

    def max_id(self, table: str) -> int:
        if table not in ("conversations", "tasks", "attempts", "sessions"):
            raise ValueError(table)
        return int(self.conn.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}").fetchone()[0])

    def task_counts(self) -> dict[str, dict[str, int]]:
        """{dataset: {task status: count}}."""
        out: dict[str, dict[str, int]] = {}
        for ds, status, n in self.conn.execute(
                "SELECT dataset, status, COUNT(*) FROM tasks GROUP BY dataset, status"):
            out.setdefault(ds, {})[status] = n
        return out

    def prompts_admitted(self, dataset: str) -> int:
        """Source rows admitted of a dataset (its n samples of a prompt share a row)."""
        return int(self.conn.execute(
            "SELECT COUNT(DISTINCT row_index) FROM conversations WHERE dataset=?",
            (dataset,)).fetchone()[0])

    def conversation_counts(self) -> dict[str, dict[str, int]]:
        """{dataset: {conversation status: count}}."""
        out: dict[str, dict[str, int]] = {}
        for ds, status, n in self.conn.execute(
                "SELECT dataset, status, COUNT(*) FROM conversations GROUP BY dataset, status"):
            out.setdefault(ds, {})[status] = n
        return out

    def spend(self) -> dict[str, dict[str, float]]:
        """What every recorded attempt cost, per dataset (billed failures included)."""
        out: dict[str, dict[str, float]] = {}
        for ds, _p, _o, n, pt, ct, cost, known in self._attempt_groups():
            d = out.setdefault(ds or None, {"attempts": 0, "prompt_tokens": 0,
                                            "completion_tokens": 0, "cost_usd": 0.0,
                                            "attempts_with_cost": 0})
            d["attempts"] += n
            d["prompt_tokens"] += pt
            d["completion_tokens"] += ct
            d["cost_usd"] += cost
            d["attempts_with_cost"] += known
        return out

    def result_totals(self) -> dict[str, dict[str, float]]:
        """Tokens and cost of the kept samples, per dataset (from their 'ok' attempts: each
        result has exactly one)."""
        out: dict[str, dict[str, float]] = {}
        for ds, _p, outcome, n, pt, ct, cost, _k in self._attempt_groups():
            if outcome != "ok":
                continue
            d = out.setdefault(ds or None, {"samples": 0, "prompt_tokens": 0,
                                            "completion_tokens": 0, "cost_usd": 0.0})
            d["samples"] += n
            d["prompt_tokens"] += pt
            d["completion_tokens"] += ct
            d["cost_usd"] += cost
        return out

    def provider_totals(self) -> dict[str, dict[str, Any]]:
        """Per answering provider: attempts by outcome, tokens, cost."""
        out: dict[str, dict[str, Any]] = {}
        for _ds, provider, outcome, n, pt, ct, cost, _k in self._attempt_groups():
            p = out.setdefault(provider_label(provider, outcome), {
                "requests": 0, "outcomes": {}, "prompt_tokens": 0, "completion_tokens": 0,
                "cost_usd": 0.0})
            p["requests"] += n
            p["outcomes"][outcome] = p["outcomes"].get(outcome, 0) + n
            p["prompt_tokens"] += pt
            p["completion_tokens"] += ct
            p["cost_usd"] += cost
        return out

    def open_conversations(self) -> Iterator[tuple[int, str, str, int, str, bytes]]:
        """(id, dataset, conv_id, row_index, status, data) of unfinished conversations."""
        yield from self.conn.execute(
            "SELECT id, dataset, conv_id, row_index, status, data FROM conversations "
            "WHERE status IN ('pending', 'active') ORDER BY id")

    def answers_of(self, conversation: int) -> dict[int, dict[str, Any]]:
        """{turn: normalised assistant message} of a conversation's stored results."""
        return {turn: jsonexact.loads(msg) for turn, msg in self.conn.execute(
            "SELECT turn, message FROM results WHERE conversation=? ORDER BY turn",
            (conversation,))}

    def result_record(self, task: int) -> ResultRecord | None:
        """A stored sample's row as it was written (None: no such sample)."""
        row = self.conn.execute(f"SELECT {RESULT_INSERT_COLUMNS} FROM results WHERE task=?",
                                (task,)).fetchone()
        return ResultRecord(*row) if row is not None else None

    def tasks_of(self, conversation: int) -> dict[int, tuple[int, str, int, str | None]]:
        """{turn: (task id, status, attempts, error)} of a conversation."""
        return {turn: (tid, st, n, err) for tid, turn, st, n, err in self.conn.execute(
            "SELECT id, turn, status, attempts, error FROM tasks WHERE conversation=?",
            (conversation,))}

    def has_conversation(self, dataset: str, conv_id: str) -> bool:
        return self.conn.execute(
            "SELECT 1 FROM conversations WHERE dataset=? AND conv_id=?",
            (dataset, conv_id)).fetchone() is not None

    def sessions(self) -> list[dict[str, Any]]:
        cur = self.conn.execute(
            "SELECT id, pid, host, started_at, heartbeat_at, ended_at, state, stop_reason, argv "
            "FROM sessions ORDER BY id")
        names = ("id", "pid", "host", "started_at", "heartbeat_at", "ended_at", "state",
                 "stop_reason", "argv")
        return [dict(zip(names, row, strict=True)) for row in cur]

    def quarantine_counts(self) -> dict[str, dict[str, int]]:
        """{dataset: {reason: count}} of quarantined answers."""
        out: dict[str, dict[str, int]] = {}
        for ds, reason, n in self.conn.execute(
                "SELECT dataset, reason, COUNT(*) FROM quarantine GROUP BY 1, 2"):
            out.setdefault(ds, {})[reason] = n
        return out

    def supersede(self, tails: dict[int, int], *, session: int | None, providers: str,
                  why: str, now: float) -> tuple[int, int]:
        """Make conversations' work from a turn on pending again, in one transaction (engine.redo
        decides which): their samples move to `superseded_results` (kept, never exported),
        their answered attempts become `superseded:<why>`, the tail's first task is pending
        again and the later ones are deleted (the planner makes them anew from its answer),
        and the conversations reopen; each is recorded in `redone`.
        Returns (tasks reset, samples superseded); raises `StoreWriteError` as `write` does."""
        try:
            return self._supersede(tails, session=session, providers=providers, why=why,
                                   now=now)
        except (sqlite3.Error, OSError) as exc:
            err = classify_store_error(exc, self.path)
            if err is None:
                raise
            raise err from exc

    def _supersede(self, tails: dict[int, int], *, session: int | None, providers: str,
                   why: str, now: float) -> tuple[int, int]:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            cols = self._superseded_columns()
            floor = c.execute("SELECT COALESCE(MAX(id), 0) FROM attempts").fetchone()[0]
            n_tasks = n_samples = 0
            for conv, turn in sorted(tails.items()):
                rows = c.execute("SELECT id, turn FROM tasks WHERE conversation=? AND "
                                 "turn>=?", (conv, turn)).fetchall()
                ids = [(t,) for t, _turn in rows]
                samples = c.executemany(
                    f"INSERT INTO superseded_results({cols}, superseded_at, superseded_why) "
                    f"SELECT {cols}, ?, ? FROM results WHERE task=?",
                    [(now, why, t) for (t,) in ids]).rowcount
                c.executemany("DELETE FROM results WHERE task=?", ids)
                c.executemany("UPDATE attempts SET outcome=? WHERE task=? AND outcome='ok'",
                              [(f"superseded:{why}", t) for (t,) in ids])
                # the first is asked again (pending: a status shows it); the planner makes
                # the later ones anew from its answer
                c.executemany("UPDATE tasks SET status='pending', attempts=0, error=NULL "
                              "WHERE id=?", [(t,) for t, n in rows if n == turn])
                c.executemany("DELETE FROM tasks WHERE id=?", [(t,) for t, n in rows if n != turn])
                c.execute("UPDATE conversations SET status=CASE WHEN EXISTS(SELECT 1 FROM "
                          "results r WHERE r.conversation=conversations.id) THEN 'active' "
                          "ELSE 'pending' END, end_reason=NULL WHERE id=?", (conv,))
                c.execute("UPDATE datasets SET state='active' WHERE state='done' AND name="
                          "(SELECT dataset FROM conversations WHERE id=?)", (conv,))
                c.execute("INSERT INTO redone VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
                          (conv, turn, len(ids), max(samples, 0), session, now, floor,
                           providers))
                n_tasks += len(ids)
                n_samples += max(samples, 0)
            c.execute("COMMIT")
        except BaseException:
            _rollback_quietly(c)
            raise
        return n_tasks, n_samples

    def _superseded_columns(self) -> str:
        """The results columns, `superseded_results` made or widened to hold them all."""
        cols = [r[1] for r in self.conn.execute("PRAGMA table_info(results)")]
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(superseded_results)")}
        if not have:
            self.conn.execute("CREATE TABLE superseded_results AS SELECT *, 0.0 AS "
                              "superseded_at, '' AS superseded_why FROM results WHERE 0")
        else:
            for name in cols:
                if name not in have:
                    self.conn.execute(f"ALTER TABLE superseded_results ADD COLUMN {name}")
        return ", ".join(cols)

    def reset_failed_tasks(self, datasets: Sequence[str] | None = None) -> int:
        """Make failed tasks (and their conversations) pending again, with a fresh attempt
        budget; returns how many."""
        where, args = "status='failed'", []
        if datasets:
            where += f" AND dataset IN ({','.join('?' * len(datasets))})"
            args = list(datasets)
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            convs = [r[0] for r in c.execute(f"SELECT conversation FROM tasks WHERE {where}", args)]
            # a fresh attempt budget: the attempts table keeps the history
            n = c.execute(f"UPDATE tasks SET status='pending', error=NULL, attempts=0 "
                          f"WHERE {where}",
                          args).rowcount
            c.executemany(
                "UPDATE conversations SET status=CASE WHEN EXISTS(SELECT 1 FROM results r "
                "WHERE r.conversation=conversations.id) THEN 'active' ELSE 'pending' END, "
                "end_reason=NULL WHERE id=? AND status='failed'", [(x,) for x in convs])
            c.execute("COMMIT")
        except BaseException:
            _rollback_quietly(c)
            raise
        return n


def _moved_why(q: QuarantineRecord) -> str:
    """The error of an attempt whose sample was judged again and quarantined: its message."""
    try:
        detail = orjson.loads(q.detail) if q.detail else {}
    except orjson.JSONDecodeError:
        detail = {}
    message = detail.get("message") if isinstance(detail, dict) else None
    return str(message or f"quarantined: {q.reason} (judged again)")[:2000]


_TOTALS_FROM_ATTEMPTS = (
    "SELECT COALESCE(dataset, ''), COALESCE(provider, ''), outcome, COUNT(*), "
    "COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0), "
    "COALESCE(SUM(cost_usd), 0), COUNT(cost_usd) FROM attempts GROUP BY 1, 2, 3"
)


# -- batched writes ---------------------------------------------------------------------------
def columns(record: type) -> str:
    """The column list of a record type (`specgen.records`): its fields, in order."""
    return ", ".join(record._fields)


DATASET_COLUMNS = columns(DatasetRecord)
ATTEMPT_COLUMNS = columns(AttemptRecord)
RESULT_INSERT_COLUMNS = columns(ResultRecord)


def fsync_path(path: str | Path) -> None:
    """fsync a file (or a directory) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cols(names: str) -> list[str]:
    return [c.strip() for c in names.split(",")]


def _insert(table: str, record: type, suffix: str = "", verb: str = "INSERT") -> str:
    """INSERT of one record type's row, by field name."""
    return (f"{verb} INTO {table}({columns(record)}) "
            f"VALUES({', '.join('?' * len(record._fields))}){suffix}")


def _upsert_suffix(record: type, key: str, fields: tuple[str, ...] | None = None) -> str:
    names = fields or tuple(f for f in record._fields if f != key)
    return f" ON CONFLICT({key}) DO UPDATE SET " + ", ".join(f"{k}=excluded.{k}" for k in names)


_INSERT_DATASET = _insert("datasets", DatasetRecord, _upsert_suffix(DatasetRecord, "name"))
_INSERT_CONVERSATION = _insert("conversations", ConversationRecord)
_INSERT_TASK = _insert("tasks", TaskRecord,
                       _upsert_suffix(TaskRecord, "id", ("status", "attempts", "error")))
_INSERT_ATTEMPT = _insert("attempts", AttemptRecord)
_INSERT_RESULT = _insert("results", ResultRecord)
_INSERT_QUARANTINE = _insert("quarantine", QuarantineRecord)
# a sample judged again: its verdicts always, its message / ids / repairs when given
_UPDATE_VERDICT = "UPDATE results SET " + ", ".join(
    f"{k}=?" if k.endswith("_check") else f"{k}=COALESCE(?, {k})"
    for k in VerdictRecord._fields[1:]) + " WHERE task=?"
_INSERT_EVENT = _insert("events", EventRecord)
_INSERT_INVALID_ROW = _insert("invalid_rows", InvalidRowRecord, verb="INSERT OR REPLACE")


def _full_rows(rows: list) -> list:
    """Result rows as the insert takes them: a plain tuple of the columns before the added
    ones (a row built before they existed) gets NULL for them."""
    n = len(ResultRecord._fields)
    if all(len(r) == n for r in rows):
        return rows
    return [r if len(r) == n else (*r, *(None,) * (n - len(r))) for r in rows]


@dataclass(slots=True)
class Batch:
    """Rows waiting for the next commit, as records (`specgen.records`); later upserts of the
    same task / dataset / conversation status replace earlier ones."""

    meta: dict[str, str] = field(default_factory=dict)
    datasets: dict[str, DatasetRecord] = field(default_factory=dict)
    conversations: list[ConversationRecord] = field(default_factory=list)
    conv_status: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    tasks: dict[int, TaskRecord] = field(default_factory=dict)
    attempts: list[AttemptRecord] = field(default_factory=list)
    results: list[ResultRecord] = field(default_factory=list)
    quarantine: list[QuarantineRecord] = field(default_factory=list)
    invalid_rows: list[InvalidRowRecord] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    session: tuple | None = None  # (heartbeat_at, state, stop_reason, ended_at, session id)
    # samples judged again (a pending side): task -> its new verdict; or, judged a mismatch,
    # moved from results to quarantine (its task quarantined)
    verdicts: dict[int, VerdictRecord] = field(default_factory=dict)
    moved: dict[int, QuarantineRecord] = field(default_factory=dict)

    def __len__(self) -> int:
        return (len(self.meta) + len(self.datasets) + len(self.conversations)
                + len(self.conv_status) + len(self.tasks) + len(self.attempts)
                + len(self.results) + len(self.quarantine) + len(self.invalid_rows)
                + len(self.events) + len(self.verdicts) + len(self.moved)
                + (self.session is not None))
