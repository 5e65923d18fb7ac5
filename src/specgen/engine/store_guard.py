"""While the process lives no paid answer is lost to the store (disk full, a read-only or
vanished run dir, a corrupt file).

When a commit fails the writer keeps every row in memory (`StoreWriter.problem`); this guard
decides what the engine does about it: stop sending new requests at once (answers of the
requests already in flight still arrive and are held too), free the ballast reserved at start
so the answers in hand can be committed, say on the terminal what is held and what to do, and
resume once the store takes commits and the space is back — or stop the run cleanly after
`store_error_timeout`. It also notices a store file deleted under the running engine and
writes it back from the open connection.

`StoreGuard.check(flushed)` is the one entry point, called after every commit attempt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("specgen.engine")

SAY_EVERY = 15.0  # seconds between repeated "answers held" messages


@dataclass(slots=True)
class Verdict:
    halt: str | None = None  # why no new requests may be sent (None: dispatch freely)
    stop: str | None = None  # the run must stop (clean, resumable)
    note: str | None = None  # something to record as an event


class StoreGuard:
    def __init__(self, writer, store, *, ballast=None, timeout: float = 600.0,
                 clock: Callable[[], float] = time.time):
        self.writer = writer
        self.store = store
        self.ballast = ballast
        self.timeout = timeout
        self.clock = clock
        self.holding: str | None = None  # set while dispatch is halted for the store
        self.holding_since = 0.0
        self._said = 0.0

    def check(self, flushed: bool) -> Verdict:
        """After a commit attempt (`flushed`: everything buffered is committed)."""
        problem = self.writer.problem
        if problem is not None:
            return self._failing(problem)
        vanished = self._identity()
        if vanished is not None:
            return vanished
        if self.holding is None:
            return Verdict()
        without = ""
        if self.ballast is not None and not self.ballast.present and not self.ballast.restore():
            # the same rule as at start: the run dir takes a write (the reserve is a help,
            # never a condition — a disk where it never fits would pause forever)
            problem = writable(self.store)
            if problem is not None:
                self._say(f"store commits again, but {problem}: new requests stay paused")
                stop = None
                if self.clock() - self.holding_since >= self.timeout:
                    stop = (f"the run dir's disk stayed full for {self.timeout:g}s "
                            "(store_error_timeout); every answer received is committed")
                return Verdict(halt=self.holding, stop=stop)
            without = (f"; without the {self.ballast.size / 2**20:.0f} MB reserve (no room "
                       "for it yet: it is recreated once there is)")
        note = (f"the store takes commits again ({self.holding}); dispatching resumes"
                f"{without}")
        log.warning("%s", note)
        self.holding = None
        return Verdict(note=note)

    def _failing(self, problem) -> Verdict:
        held = self.writer.held_results
        if self.holding is None:
            self.holding = f"{problem.kind}: {problem.message}"
            self.holding_since = problem.since
            freed = self.ballast is not None and self.ballast.release()
            log.error("%s: %d answer(s) held in memory, no new requests%s; %s",
                      problem.message, held,
                      " (released the space reserved at start)" if freed else "",
                      _advice(problem.kind))
            self._said = self.clock()
            note = f"store error ({problem.kind}): {problem.message}; {held} answer(s) held"
            return Verdict(halt=self.holding, note=note, stop=self._expired(problem))
        self._say(f"{problem.message}: {held} answer(s) held; {_advice(problem.kind)}")
        return Verdict(halt=self.holding, stop=self._expired(problem))

    def _expired(self, problem) -> str | None:
        if problem.kind == "corrupt":
            return f"the store is damaged ({problem.message}); stopping"
        if self.clock() - problem.since >= self.timeout:
            return (f"{problem.message} for {self.timeout:g}s (store_error_timeout); "
                    f"{self.writer.held_results} answer(s) could not be committed")
        return None

    def _identity(self) -> Verdict | None:
        check = getattr(self.store, "identity_problem", None)
        problem = check() if check is not None else None
        if problem is None:
            return None
        restored = self.store.restore_to_path()
        what = ("written back from the open connection, nothing lost" if restored
                else "could not be written back")
        message = f"{self.store.path} was {problem} while the run was writing to it: {what}"
        log.error("%s; stopping", message)
        return Verdict(stop=message, note=message)

    def _say(self, text: str) -> None:
        now = self.clock()
        if now - self._said >= SAY_EVERY:
            self._said = now
            log.warning("%s", text)


def writable(store) -> str | None:
    """Why the store's run dir takes no write now (store.check_writable), or None."""
    from ..store import check_writable

    path = getattr(store, "path", None)
    return None if path is None else check_writable(Path(path).parent)


def _advice(kind: str) -> str:
    return {
        "disk_full": "free space on the run dir's disk (or press Ctrl-C to stop cleanly)",
        "read_only": "make the run dir writable again (or press Ctrl-C to stop cleanly)",
        "missing": "the run dir vanished; restore it (or press Ctrl-C)",
        "locked": "another process holds the store; stop it (or press Ctrl-C)",
    }.get(kind, "press Ctrl-C to stop cleanly")


RESCUE_GLOB = "rescued-session-*.jsonl"


def _write_private(path: str, data: bytes) -> None:
    """Create `path` (never an existing file, never through a symlink), mode 0600."""
    import os

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            fd = -1
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    finally:
        if fd >= 0:
            os.close(fd)


def rescue_results(batch, run_dir, session: int) -> str | None:
    """Last resort when the store never took the session's last answers: write the held
    results as JSON lines (ids unpacked) next to the store — a new file, mode 0600, never
    through a symlink — else in the run dir's `fallback_dir` (0700, this user's own). The
    next run imports the file from the run dir or from that temp dir (`import_rescued`).
    Returns the path written, or None when there was nothing to save or nowhere to save
    it."""
    import os
    import tempfile

    import orjson

    from ..store import RESULT_INSERT_COLUMNS, unpack_ids, unpack_json

    rows = list(getattr(batch, "results", ()) or ())
    if not rows:
        return None
    names = [c.strip() for c in RESULT_INSERT_COLUMNS.split(",")]
    lines = []
    for row in rows:
        rec = dict(zip(names, row, strict=False))
        for key in ("input_ids", "true_prompt_ids", "true_completion_ids"):
            rec[key] = unpack_ids(rec.get(key))
        rec["request"] = unpack_json(rec.get("request"))
        lines.append(orjson.dumps(rec, default=str))
    data = b"\n".join(lines) + b"\n"
    name = f"rescued-session-{session}-{int(time.time())}.jsonl"
    path = os.path.join(str(run_dir), name)
    try:
        _write_private(path, data)
        return path
    except FileExistsError:
        pass  # not ours (a symlink or another file planted there): never touched
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass
    folder = fallback_dir(run_dir, create=True)
    if folder is not None:
        try:
            path = os.path.join(str(folder), name)
            _write_private(path, data)
            return path
        except OSError:
            pass
    try:  # not even that: a private dir of its own (the message names it; not imported)
        folder = tempfile.mkdtemp(prefix="specgen-rescue-")
        path = os.path.join(folder, name)
        _write_private(path, data)
        return path
    except OSError:
        return None


def fallback_dir(run_dir, create: bool = False):
    """Where a rescue file goes when the run dir takes none: a directory of this user's own
    under the temp dir, named after the run dir (so the next run of it finds the file),
    mode 0700 — None when it is missing, or is not ours alone (a shared /tmp: a directory
    someone else made, or a symlink, is never used)."""
    import hashlib
    import os
    import stat
    import tempfile
    from pathlib import Path

    key = hashlib.sha256(str(Path(run_dir).absolute()).encode()).hexdigest()[:16]
    top = Path(tempfile.gettempdir()) / f"specgen-rescue-{os.getuid()}"
    for d in (top, top / key):
        if create:
            try:
                d.mkdir(mode=0o700)
            except FileExistsError:
                pass
            except OSError:
                return None
        try:
            st = os.lstat(d)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
    return top / key


def rescue_note(where: str, run_dir) -> str:
    """What a user is told of a rescue file: where it is and what brings it back."""
    import os

    here = os.path.dirname(where) == os.path.abspath(str(run_dir))
    nxt = ("the next run of this run dir imports it" if here or where.startswith(
        str(fallback_dir(run_dir) or "\0")) else
        f"move it into the run dir {run_dir} and the next run imports it")
    return (f"they were written to {where}; {nxt} — make the store writable again (free "
            "space, fix permissions), then rerun the same command; keep the file until that "
            "run says it imported it")


def import_rescued(store, run_dir) -> str | None:
    """Take the results a previous session rescued (`rescued-session-*.jsonl` in the run dir,
    or in its `fallback_dir`) into the store: each row whose task exists and has no result
    yet becomes its result and the task is done, so a resume does not pay for it again. Each file read is renamed
    `….imported`. Returns what was done (for the log), or None when there was no file."""
    import os
    from pathlib import Path

    import orjson

    from ..records import ResultRecord
    from ..store import pack_ids, pack_json

    files = sorted(Path(run_dir).glob(RESCUE_GLOB))
    spare = fallback_dir(run_dir)  # where a session whose run dir took nothing wrote it
    if spare is not None:
        files += sorted(spare.glob(RESCUE_GLOB))
    if not files:
        return None
    taken = skipped = 0
    bad: list[str] = []
    conn = store.conn
    fields = ResultRecord._fields
    cols = ", ".join(fields)
    marks = ", ".join("?" * len(fields))
    for path in files:
        try:
            lines = path.read_bytes().splitlines()
            rows = [orjson.loads(line) for line in lines if line.strip()]
        except (OSError, orjson.JSONDecodeError) as exc:
            bad.append(f"{path.name}: {exc}")
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            for rec in rows:
                if not isinstance(rec, dict) or not isinstance(rec.get("task"), int):
                    skipped += 1
                    continue
                task = conn.execute("SELECT status FROM tasks WHERE id=?",
                                    (rec["task"],)).fetchone()
                have = conn.execute("SELECT 1 FROM results WHERE task=?",
                                    (rec["task"],)).fetchone()
                if task is None or have is not None:
                    skipped += 1  # a task the store never had, or one answered since
                    continue
                values = dict(rec)
                for key in ("input_ids", "true_prompt_ids", "true_completion_ids"):
                    if values.get(key) is not None:
                        values[key] = pack_ids(values[key])
                values["request"] = pack_json(values.get("request"))
                conn.execute(f"INSERT INTO results({cols}) VALUES({marks})",
                             [values.get(f) for f in fields])
                conn.execute("UPDATE tasks SET status='done', error=NULL WHERE id=?",
                             (rec["task"],))
                taken += 1
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        try:
            os.replace(path, str(path) + ".imported")
        except OSError as exc:
            bad.append(f"{path.name}: not renamed ({exc})")
    out = (f"imported {taken} rescued result(s) from {len(files)} file(s) "
           f"({skipped} already in the store or without a task)")
    return out + ("; could not read " + "; ".join(bad) if bad else "")
