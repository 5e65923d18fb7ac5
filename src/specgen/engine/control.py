"""Talking to a running engine from another shell, and knowing whether one is alive.

* `specgen stop` writes `run_dir/control.json` ({"action": "drain" | "now", "session": id});
  the engine polls it a few times a second. A file meant for an earlier session is ignored and
  removed, so a stale stop request never stops the next run.
* One engine per run dir: `RunLock` holds an exclusive `flock` on `run_dir/run.lock` for the
  life of the process; the kernel releases it even after `kill -9`. A clean end removes the
  file (while still holding it); a process that locked a file removed meanwhile tries again.
* A session is alive when its process exists (same host) and its heartbeat is fresh.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

import orjson

from ..liveness import heartbeat_timeout, pid_alive, session_alive  # noqa: F401 (re-exported)

CONTROL_FILE = "control.json"
LOCK_FILE = "run.lock"


class RunLockedError(RuntimeError):
    """Another engine holds the run dir."""


def write_control(run_dir: Path, action: str, session: int | None) -> Path:
    """Ask the engine running `session` in `run_dir` to stop ("drain") or stop now ("now")."""
    path = Path(run_dir) / CONTROL_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps({"action": action, "session": session, "ts": time.time()}))
    os.replace(tmp, path)
    return path


def read_control(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / CONTROL_FILE
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError:
        return None  # half-written by an old specgen, or garbage: ignore
    return data if isinstance(data, dict) else None


def clear_control(run_dir: Path) -> None:
    try:
        (Path(run_dir) / CONTROL_FILE).unlink()
    except FileNotFoundError:
        pass


class RunLock:
    """Exclusive lock on a run dir for the life of this process."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
                finally:
                    os.close(fd)
                raise RunLockedError(
                    f"{self.path.parent}: another specgen run (pid {holder}) is using this run "
                    "dir; stop it first (specgen stop) or use another run_dir") from None
            if self._is_current(fd):
                break
            os.close(fd)  # the holder removed the file as it released it: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def _is_current(self, fd: int) -> bool:
        """Whether `fd` is still the file at the lock's path (not one unlinked since)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def release(self) -> None:
        """Remove the lock file, then let go of it: a finished run leaves no lock behind
        (removed while held, so no other process can have locked this file meanwhile)."""
        if self._fd is not None:
            try:
                if self._is_current(self._fd):
                    os.unlink(self.path)
            except OSError:
                pass  # a read-only dir, say: the flock alone is what counts
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
