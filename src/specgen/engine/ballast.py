"""A reserve of disk space next to the store, freed when the disk fills.

At start the engine writes `run_dir/.specgen-ballast`, a file of `size` bytes with real
allocated blocks. When a commit fails because the disk is full, deleting it gives the store
room to commit the answers already paid for (and those still in flight) before the run stops
or waits for space; once there is room again the reserve is recreated.

The blocks are allocated with `posix_fallocate` where the filesystem supports it, else by
writing zeros (filesystems that compress or deduplicate zeros, such as ZFS with compression,
do not really reserve space that way).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from ..store import free_bytes

BALLAST_FILE = ".specgen-ballast"
CHUNK = 1 << 20

__all__ = ["BALLAST_FILE", "Ballast", "free_bytes"]


class Ballast:
    """`run_dir/.specgen-ballast` of `size_bytes` bytes. With a size of 0 everything is a
    no-op: `create()` and `restore()` return True (nothing to reserve), `release()` False."""

    def __init__(self, run_dir: str | Path, size_bytes: int):
        self.run_dir = Path(run_dir)
        self.size = max(0, int(size_bytes))
        self.path = self.run_dir / BALLAST_FILE

    @property
    def enabled(self) -> bool:
        return self.size > 0

    @property
    def present(self) -> bool:
        return self.size > 0 and self.path.exists()

    def create(self) -> bool:
        """Write the reserve (replacing an existing one). False, with nothing left behind,
        when there is not enough space (or the dir cannot be written)."""
        if not self.size:
            return True
        self.release()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:
            return False
        try:
            try:
                _allocate(fd, self.size)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            self.release()
            return False
        return True

    def release(self) -> bool:
        """Delete the reserve; True when there was one (its space is free now)."""
        if not self.size:
            return False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        except OSError:
            return False
        return True

    def restore(self, margin_bytes: int | None = None) -> bool:
        """Recreate the reserve if it is gone and the disk has `size + margin_bytes` free
        (default margin: `size`, so recreating it never fills the disk again at once). True
        when the reserve is in place afterwards."""
        if not self.size:
            return True
        if self.present:
            return True
        margin = self.size if margin_bytes is None else max(0, int(margin_bytes))
        try:
            free = shutil.disk_usage(self.run_dir).free
        except OSError:
            return False
        if free < self.size + margin:
            return False
        return self.create()


def _allocate(fd: int, size: int) -> None:
    if hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise  # ENOSPC, EDQUOT, EIO ...
            os.ftruncate(fd, 0)
    zeros = bytes(CHUNK)
    left = size
    while left > 0:
        n = min(left, CHUNK)
        written = os.write(fd, zeros[:n] if n < CHUNK else zeros)
        left -= written
