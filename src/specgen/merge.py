"""`specgen merge RUN_DIR… -o RUN_DIR`: combine the stores of shards of one config.

The inputs must share the config hash (same targets, sampling and datasets). Conversations
are keyed by (dataset, conv_id); when two inputs hold the same conversation (a shard run
twice, overlapping shard counts), the most complete copy is kept: finished over ended over
in progress over failed, then more samples, then the earlier input. Every id is re-keyed;
attempts, quarantined answers and events of every input are kept (an attempt of a dropped
copy is re-pointed to the kept copy's task for the same turn, or left out and counted when
the kept copy has no such task). Export order depends only on dataset position, source row
and turn, so the export of a merge of shards equals the export of one unsharded run.

The merged run dir is built under a temporary name next to it (`.NAME.tmp-<pid>`) and renamed
to its name only when the store is complete, closed and fsynced (into an existing empty
folder, the finished store file is moved into it), so a killed or failed merge never leaves a
run under the output name that status or export could take for the merge.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .export.atomic import fsync_dir, fsync_file, remove, remove_stale, temp_path
from .store import STORE_FILE, Store, StoreError

STATUS_RANK = {"done": 0, "ended": 1, "active": 2, "pending": 3, "failed": 4}
DATASET_STATE_RANK = {"budget_reached": 0, "limit_reached": 1, "active": 2, "done": 3}
CHUNK = 1000


class MergeError(Exception):
    """The inputs cannot be merged (different configs, output not empty, ...)."""


@dataclass
class MergeSummary:
    inputs: list[dict[str, Any]] = field(default_factory=list)
    conversations: int = 0
    duplicate_conversations: int = 0
    tasks: int = 0
    results: int = 0
    attempts: int = 0
    attempts_left_out: int = 0
    quarantine: int = 0
    events: int = 0
    sessions: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def columns(conn: sqlite3.Connection, table: str, schema: str = "main") -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA {schema}.table_info({table})")]


def merge_runs(inputs: Sequence[str | Path], out: str | Path) -> MergeSummary:
    """Merge the run stores `inputs` into a new run store at `out`."""
    if not inputs:
        raise MergeError("give at least one run dir to merge")
    out = Path(out)
    ins = [Path(p) for p in inputs]
    if (out / STORE_FILE).exists():
        raise MergeError(f"{out} already holds a run ({STORE_FILE}); merge writes a new run dir")
    for p in ins:
        if p.resolve() == out.resolve():
            raise MergeError(f"{p}: the output must not be one of the inputs")
    if len({p.resolve() for p in ins}) != len(ins):
        raise MergeError("the same run dir is given twice")

    stores: list[Store] = []
    try:
        for p in ins:
            try:
                s = Store.open(p, readonly=True)
            except StoreError as exc:
                raise MergeError(str(exc)) from None
            s.conn.execute("BEGIN")  # one consistent snapshot per input
            stores.append(s)
        metas = [s.meta() for s in stores]
        _check_compatible(ins, metas)
        work = _work_dir(out)
        try:
            target = Store.create(work)
            try:
                summary = _merge(ins, stores, metas, target)
                _close_for_publication(target, work)
            except BaseException:
                target.close()
                raise
            _publish(work, out)
        except BaseException:
            remove(work)
            raise
        return summary
    finally:
        for s in stores:
            s.close()


def _work_dir(out: Path) -> Path:
    """Where the merged store is built: `.NAME.tmp-<pid>` next to `out` (renamed to `out` at the
    end), or, when `out` is an existing folder, `out/.state.sqlite.tmp-<pid>/` (its store file
    is moved into `out`). Leftovers of killed merges to the same place are removed first."""
    out = Path(os.path.abspath(out))
    if out.is_dir():
        remove_stale(out, {STORE_FILE})
        work = temp_path(out / STORE_FILE)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(out.parent, {out.name})
        work = temp_path(out)
    work.mkdir()
    return work


def _close_for_publication(target: Store, work: Path) -> None:
    """Checkpoint the WAL into the database file, close it, fsync file and folder."""
    target.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    target.close()
    for suffix in ("-wal", "-shm"):
        side = work / (STORE_FILE + suffix)
        if side.exists():
            if suffix == "-wal" and side.stat().st_size:
                raise MergeError(f"{work}: the merged store's WAL could not be checkpointed")
            side.unlink()
    fsync_file(work / STORE_FILE)
    fsync_dir(work)


def _publish(work: Path, out: Path) -> None:
    out = Path(os.path.abspath(out))
    if work.parent == out:  # out is an existing folder: move the finished store into it
        final = out / STORE_FILE
        if final.exists():
            raise MergeError(f"{out} already holds a run ({STORE_FILE}); merge writes a new "
                             "run dir")
        try:
            os.link(work / STORE_FILE, final)  # never replaces a store that appeared meanwhile
        except FileExistsError:
            raise MergeError(f"{out} already holds a run ({STORE_FILE}); merge writes a new "
                             "run dir") from None
        except OSError:  # a filesystem without hard links
            os.rename(work / STORE_FILE, final)
        fsync_dir(out)
        remove(work)
        return
    try:
        os.rename(work, out)  # replaces nothing but an empty folder
    except OSError as exc:
        raise MergeError(f"{out} appeared while the merge was written ({exc.strerror}); "
                         "nothing was replaced") from None
    fsync_dir(out.parent)


def _check_compatible(ins: list[Path], metas: list[dict[str, str]]) -> None:
    for key, what in (("config_hash", "config hashes"),
                      ("tokenizer_fingerprint", "tokenizer fingerprints"),
                      ("renderer", "renderers")):
        values = [m.get(key) for m in metas]
        if key == "config_hash" and any(v is None for v in values):
            missing = [str(p) for p, v in zip(ins, values, strict=True) if v is None]
            raise MergeError(f"no config hash in {', '.join(missing)}: not a started specgen run")
        if len(set(values)) > 1:
            listing = "; ".join(f"{p}: {v}" for p, v in zip(ins, values, strict=True))
            raise MergeError(f"the runs have different {what} ({listing}); merge combines "
                             "shards of one config (rerun with the same config)")
    _check_hub_commits(ins, metas)


def _check_hub_commits(ins: list[Path], metas: list[dict[str, str]]) -> None:
    """Shards of a Hub dataset must have read one commit (each pinned its own at its start)."""
    from .sources.pins import hub_pins

    pins = [hub_pins(m) for m in metas]
    for name in sorted({n for p in pins for n in p}):
        read = {(p[name].get("commit"), p[name].get("data_revision")) for p in pins if name in p}
        if len(read) > 1:
            listing = "; ".join(f"{path}: {str(p[name].get('commit'))[:12]}"
                                for path, p in zip(ins, pins, strict=True) if name in p)
            raise MergeError(f"dataset {name!r} was read at different Hub commits ({listing}): "
                             "its shards hold different data; run every shard with "
                             "`revision` set to one commit")


def _merge(ins: list[Path], stores: list[Store], metas: list[dict[str, str]],
           target: Store) -> MergeSummary:
    tc = target.conn
    summary = MergeSummary()
    tc.execute("BEGIN IMMEDIATE")
    try:
        _meta(ins, stores, metas, target)
        _datasets(stores, tc, complete=_all_shards(metas))
        session_map = _sessions(stores, tc, summary)
        _merged_state(ins, stores, metas, tc)
        conv_map, task_map, turn_map = _conversations(stores, tc, summary)
        _results(stores, tc, conv_map, task_map, summary)
        _attempts(stores, tc, task_map, turn_map, session_map, summary)
        _quarantine(stores, tc, task_map, turn_map, summary)
        _events(stores, tc, session_map, summary)
        for s in stores:
            cols = _common(s.conn, tc, "invalid_rows")
            rows = s.conn.execute(f"SELECT {', '.join(cols)} FROM invalid_rows").fetchall()
            tc.executemany(f"INSERT OR IGNORE INTO invalid_rows({', '.join(cols)}) "
                           f"VALUES({', '.join('?' * len(cols))})", rows)
        tc.execute("COMMIT")
    except BaseException:
        try:
            tc.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite already rolled back (e.g. disk full): keep the original error
        raise
    for p, s, m in zip(ins, stores, metas, strict=True):
        summary.inputs.append({"run_dir": str(p), "shard": m.get("shard") or "",
                               "results": s.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]})
    return summary


def _common(src: sqlite3.Connection, dst: sqlite3.Connection, table: str) -> list[str]:
    """Columns of `table` present in both stores (the schema only grows by adding columns)."""
    have = set(columns(src, table))
    return [c for c in columns(dst, table) if c in have]


def _meta(ins, stores, metas, target: Store) -> None:
    merged = dict(metas[0])
    created = [float(m["created_at"]) for m in metas if _is_float(m.get("created_at"))]
    if created:
        merged["created_at"] = repr(min(created))
    merged["shard"] = ""
    merged["merged_from"] = orjson.dumps([
        {"run_dir": str(p.resolve()), "shard": m.get("shard") or ""}
        for p, m in zip(ins, metas, strict=True)]).decode()
    merged["merged_at"] = repr(time.time())
    for k, v in merged.items():
        if k != "schema_version":
            target.set_meta(k, v)


def _is_float(v: str | None) -> bool:
    try:
        float(v)  # type: ignore[arg-type]
        return True
    except (TypeError, ValueError):
        return False


def _all_shards(metas: list[dict[str, str]]) -> bool:
    """Whether the inputs are exactly shards 0..N-1 of one N."""
    shards = [m.get("shard") or "" for m in metas]
    try:
        pairs = [tuple(int(x) for x in s.split("/")) for s in shards]
    except ValueError:
        return False
    counts = {n for _, n in pairs}
    return len(counts) == 1 and sorted(i for i, _ in pairs) == list(range(counts.pop()))


def _datasets(stores: list[Store], tc: sqlite3.Connection, *, complete: bool) -> None:
    merged: dict[str, dict[str, Any]] = {}
    for s in stores:
        cols = _common(s.conn, tc, "datasets")
        for row in s.conn.execute(f"SELECT {', '.join(cols)} FROM datasets ORDER BY position"):
            d = dict(zip(cols, row, strict=True))
            cur = merged.get(d["name"])
            if cur is None:
                merged[d["name"]] = d
                continue
            # Every shard reads the whole file (skipping the others' rows): take the furthest
            # cursor; duplicates are per shard; the merge holds all shards' rows.
            cur["rows_read"] = max(cur.get("rows_read") or 0, d.get("rows_read") or 0)
            cur["rows_invalid"] = max(cur.get("rows_invalid") or 0, d.get("rows_invalid") or 0)
            cur["rows_duplicate"] = (cur.get("rows_duplicate") or 0) + (d.get("rows_duplicate") or 0)
            cur["rows_other_shard"] = min(cur.get("rows_other_shard") or 0,
                                          d.get("rows_other_shard") or 0)
            cur["exhausted"] = int(bool(cur.get("exhausted")) and bool(d.get("exhausted")))
            if DATASET_STATE_RANK.get(d.get("state"), 9) < DATASET_STATE_RANK.get(cur.get("state"), 9):
                cur["state"] = d["state"]
    for d in merged.values():
        if complete:  # every shard is here: no row belongs to a shard outside the merge
            d["rows_other_shard"] = 0
        cols = list(d)
        tc.execute(f"INSERT INTO datasets({', '.join(cols)}) VALUES({', '.join('?' * len(cols))})",
                   [d[c] for c in cols])


def unfinished_inputs(ins, stores, metas) -> list[str]:
    """What keeps the merge from being finished: inputs whose last session did not finish
    (still running, stopped, failed, or with tasks pending) and shards of the N missing."""
    out = []
    for p, s, m in zip(ins, stores, metas, strict=True):
        row = s.conn.execute("SELECT state FROM sessions ORDER BY id DESC LIMIT 1").fetchone()
        state = row[0] if row else "never started"
        (pending,) = s.conn.execute(
            "SELECT COUNT(*) FROM tasks WHERE status='pending'").fetchone()
        name = f"shard {m['shard']}" if m.get("shard") else str(p)
        if state != "finished" or pending:
            out.append(f"{name} ({p}) {state}, {pending} task(s) pending")
    shards = [m.get("shard") or "" for m in metas]
    try:
        pairs = [tuple(int(x) for x in s.split("/")) for s in shards if s]
    except ValueError:
        pairs = []
    if pairs:
        n = max(k for _, k in pairs)
        have = {i for i, k in pairs if k == n}
        out += [f"shard {i}/{n} missing" for i in range(n) if i not in have]
    return out


def _merged_state(ins, stores, metas, tc) -> None:
    """The merge's own session, last: `finished` only when every input finished and every
    shard is there; else `stopped`, naming the unfinished and missing shards."""
    left = unfinished_inputs(ins, stores, metas)
    now = time.time()
    (next_id,) = tc.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM sessions").fetchone()
    reason = ("merged: " + "; ".join(left) + " — run them to the end and merge again"
              if left else None)
    tc.execute("INSERT INTO sessions(id, pid, host, started_at, heartbeat_at, ended_at, state, "
               "stop_reason, argv) VALUES(?, NULL, NULL, ?, ?, ?, ?, ?, ?)",
               (next_id, now, now, now, "stopped" if left else "finished", reason,
                '["merge"]'))


def _sessions(stores, tc, summary) -> list[dict[int, int]]:
    maps: list[dict[int, int]] = []
    next_id = 1
    for s in stores:
        cols = _common(s.conn, tc, "sessions")
        m: dict[int, int] = {}
        rows = []
        for row in s.conn.execute(f"SELECT {', '.join(cols)} FROM sessions ORDER BY id"):
            d = dict(zip(cols, row, strict=True))
            m[d["id"]] = next_id
            d["id"] = next_id
            next_id += 1
            rows.append([d[c] for c in cols])
        tc.executemany(f"INSERT INTO sessions({', '.join(cols)}) VALUES({', '.join('?' * len(cols))})",
                       rows)
        summary.sessions += len(rows)
        maps.append(m)
    return maps


def _conversations(stores, tc, summary):
    """Pick one copy per (dataset, conv_id); copy it and its tasks with new ids.

    Returns per input: conversation id map, task id map (kept copies), and for dropped copies
    a map old task id -> new task id of the kept copy's task with the same turn.
    """
    best: dict[tuple[str, str], tuple[tuple, int, int]] = {}
    for k, s in enumerate(stores):
        counts = dict(s.conn.execute("SELECT conversation, COUNT(*) FROM results GROUP BY 1"))
        for cid, ds, conv_id, status in s.conn.execute(
                "SELECT id, dataset, conv_id, status FROM conversations ORDER BY id"):
            rank = (STATUS_RANK.get(status, 9), -counts.get(cid, 0), k)
            key = (ds, conv_id)
            if key in best:
                summary.duplicate_conversations += 1
                if rank >= best[key][0]:
                    continue
            best[key] = (rank, k, cid)
    keep = [set() for _ in stores]
    for _, k, cid in best.values():
        keep[k].add(cid)

    conv_maps: list[dict[int, int]] = [{} for _ in stores]
    task_maps: list[dict[int, int]] = [{} for _ in stores]
    next_conv = next_task = 1
    new_task_by_turn: dict[tuple[str, str, int], int] = {}
    for k, s in enumerate(stores):
        ccols = _common(s.conn, tc, "conversations")
        rows = []
        for row in s.conn.execute(f"SELECT {', '.join(ccols)} FROM conversations ORDER BY id"):
            d = dict(zip(ccols, row, strict=True))
            if d["id"] not in keep[k]:
                continue
            conv_maps[k][d["id"]] = next_conv
            d["id"] = next_conv
            next_conv += 1
            rows.append([d[c] for c in ccols])
            if len(rows) >= CHUNK:
                _insert(tc, "conversations", ccols, rows)
        _insert(tc, "conversations", ccols, rows)
        tcols = _common(s.conn, tc, "tasks")
        rows = []
        for row in s.conn.execute(
                f"SELECT {', '.join('t.' + c for c in tcols)}, c.conv_id FROM tasks t "
                "JOIN conversations c ON c.id = t.conversation ORDER BY t.id"):
            d = dict(zip(tcols, row[:-1], strict=True))
            new_conv = conv_maps[k].get(d["conversation"])
            if new_conv is None:
                continue
            task_maps[k][d["id"]] = next_task
            new_task_by_turn[(d["dataset"], row[-1], d["turn"])] = next_task
            d["id"], d["conversation"] = next_task, new_conv
            next_task += 1
            rows.append([d[c] for c in tcols])
            if len(rows) >= CHUNK:
                _insert(tc, "tasks", tcols, rows)
        _insert(tc, "tasks", tcols, rows)
    summary.conversations = next_conv - 1
    summary.tasks = next_task - 1

    turn_maps: list[dict[int, int]] = [{} for _ in stores]
    for k, s in enumerate(stores):
        for tid, ds, conv_id, turn in s.conn.execute(
                "SELECT t.id, t.dataset, c.conv_id, t.turn FROM tasks t "
                "JOIN conversations c ON c.id = t.conversation"):
            if tid not in task_maps[k] and (ds, conv_id, turn) in new_task_by_turn:
                turn_maps[k][tid] = new_task_by_turn[(ds, conv_id, turn)]
    return conv_maps, task_maps, turn_maps


def _insert(tc, table: str, cols: list[str], rows: list[list[Any]]) -> None:
    if rows:
        tc.executemany(f"INSERT INTO {table}({', '.join(cols)}) "
                       f"VALUES({', '.join('?' * len(cols))})", rows)
        rows.clear()


def _results(stores, tc, conv_maps, task_maps, summary) -> None:
    for k, s in enumerate(stores):
        cols = _common(s.conn, tc, "results")
        rows = []
        for row in s.conn.execute(f"SELECT {', '.join(cols)} FROM results ORDER BY task"):
            d = dict(zip(cols, row, strict=True))
            task = task_maps[k].get(d["task"])
            if task is None:
                continue  # a sample of a dropped duplicate copy
            d["task"], d["conversation"] = task, conv_maps[k][d["conversation"]]
            rows.append([d[c] for c in cols])
            summary.results += 1
            if len(rows) >= CHUNK:
                _insert(tc, "results", cols, rows)
        _insert(tc, "results", cols, rows)


def _attempts(stores, tc, task_maps, turn_maps, session_maps, summary) -> None:
    for k, s in enumerate(stores):
        cols = [c for c in _common(s.conn, tc, "attempts") if c != "id"]
        rows = []
        for row in s.conn.execute(f"SELECT {', '.join(cols)} FROM attempts ORDER BY id"):
            d = dict(zip(cols, row, strict=True))
            task = task_maps[k].get(d["task"]) or turn_maps[k].get(d["task"])
            if task is None:
                summary.attempts_left_out += 1
                continue
            d["task"] = task
            d["session"] = session_maps[k].get(d["session"], d["session"])
            rows.append([d[c] for c in cols])
            summary.attempts += 1
            if len(rows) >= CHUNK:
                _insert(tc, "attempts", cols, rows)
        _insert(tc, "attempts", cols, rows)


def _quarantine(stores, tc, task_maps, turn_maps, summary) -> None:
    for k, s in enumerate(stores):
        cols = [c for c in _common(s.conn, tc, "quarantine") if c != "id"]
        rows = []
        for row in s.conn.execute(f"SELECT {', '.join(cols)} FROM quarantine ORDER BY id"):
            d = dict(zip(cols, row, strict=True))
            if d["task"] is not None:
                d["task"] = task_maps[k].get(d["task"]) or turn_maps[k].get(d["task"])
            rows.append([d[c] for c in cols])
            summary.quarantine += 1
        _insert(tc, "quarantine", cols, rows)


def _events(stores, tc, session_maps, summary) -> None:
    for k, s in enumerate(stores):
        cols = [c for c in _common(s.conn, tc, "events") if c != "id"]
        rows = []
        for row in s.conn.execute(f"SELECT {', '.join(cols)} FROM events ORDER BY id"):
            d = dict(zip(cols, row, strict=True))
            d["session"] = session_maps[k].get(d["session"], d["session"])
            rows.append([d[c] for c in cols])
            summary.events += 1
            if len(rows) >= CHUNK:
                _insert(tc, "events", cols, rows)
        _insert(tc, "events", cols, rows)


__all__ = ["MergeError", "MergeSummary", "merge_runs"]
