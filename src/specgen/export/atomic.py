"""Publishing outputs atomically: build under a temporary name, rename when complete.

Every file `export` writes (data files and manifests) and the run dir `merge` builds is first
written as `.NAME.tmp-<pid>` in the directory of its final name, fsynced, and only then renamed
to `NAME` (`os.replace` / `os.rename`, atomic within one filesystem). So a process killed at
any point leaves nothing under the final name that looks complete (and an older output stays
whole until the new one is), only a temporary name. The next export or merge to the same
place removes the temporary names of processes that are no longer running.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

from ..liveness import pid_alive as alive
from ..store import fsync_path

TMP_INFIX = ".tmp-"
_TMP_RE = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)$")


def temp_path(final: Path, pid: int | None = None) -> Path:
    """The temporary name of `final` while this process builds it: `.NAME.tmp-<pid>`."""
    return final.with_name(f".{final.name}{TMP_INFIX}{os.getpid() if pid is None else pid}")


def parse_temp_name(name: str) -> tuple[str, int] | None:
    """(final name, pid) of a temporary name, or None when `name` is not one."""
    m = _TMP_RE.match(name)
    return (m["name"], int(m["pid"])) if m else None


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` runs on this machine (this process counts as not running: a
    temporary name with our own pid is a leftover of an earlier process that had it)."""
    return pid != os.getpid() and alive(pid)


def remove_stale(directory: Path, names: set[str] | None = None) -> list[Path]:
    """Remove the temporary names in `directory` (of `names`' finals only, when given) whose
    process is gone. Returns what was removed; errors are ignored (a leftover is harmless)."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        parsed = parse_temp_name(entry.name)
        if parsed is None or (names is not None and parsed[0] not in names):
            continue
        if pid_alive(parsed[1]):
            continue  # another export/merge is building it right now
        path = Path(entry.path)
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
        except OSError:
            pass
    return removed


def remove(path: Path) -> None:
    """Remove a temporary file or directory, quietly (best effort on the failure path)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def fsync_file(path: Path) -> None:
    fsync_path(path)


def fsync_dir(path: Path) -> None:
    """Make the renames and creations in directory `path` durable (where the OS allows)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_temp(final: Path, data: bytes) -> Path:
    """Write `data` to `final`'s temporary name and fsync it; returns the temporary path."""
    tmp = temp_path(final)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        remove(tmp)
        raise
    return tmp


def describe_os_error(exc: OSError, what: str) -> str:
    """A one-line explanation of a write failure (no traceback)."""
    if exc.errno == errno.ENOSPC:
        reason = "no space left on the device"
    elif exc.errno == errno.EDQUOT:
        reason = "disk quota exceeded"
    elif exc.errno == errno.EFBIG:
        reason = "file too large (a file size limit is in force)"
    else:
        reason = exc.strerror or str(exc) or type(exc).__name__
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return f"cannot write {what}: {reason}{where}"
