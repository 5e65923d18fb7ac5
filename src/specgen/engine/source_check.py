"""Has a dataset's source changed since the run last read it?

The resume cursor is a row count (`datasets.rows_read`): rows edited, inserted or removed
before it would be skipped silently. So each session records every single-file source's size
and the SHA-256 of its content (meta `source:<dataset>`), and the next one compares the part
the earlier session saw: the same bytes, or the same bytes followed by more (rows appended,
which are read as usual), resume quietly; anything else is said, with what the run does —
resume by position, the rows before the cursor not read again (`--force-new` starts over).
Folders (HF `save_to_disk`) are not fingerprinted.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson

CHUNK = 1 << 20


def _digest(path: Path, limit: int | None = None) -> tuple[int, str]:
    """(bytes hashed, sha256 hex) of the first `limit` bytes of `path` (all when None)."""
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while limit is None or done < limit:
            want = CHUNK if limit is None else min(CHUNK, limit - done)
            block = f.read(want)
            if not block:
                break
            h.update(block)
            done += len(block)
    return done, h.hexdigest()


def check_sources(store, datasets) -> list[str]:
    """Warnings for the sources changed since the last session; records the new fingerprints.
    `datasets`: the run's DatasetConfig list."""
    out = []
    cursors = {name: rows for name, rows in store.conn.execute(
        "SELECT name, rows_read FROM datasets")}
    for ds in datasets:
        path = Path(ds.path)
        if not path.is_file():
            continue
        key = f"source:{ds.name}"
        try:
            old = orjson.loads(store.get_meta(key) or "null")
        except orjson.JSONDecodeError:
            old = None
        try:
            size, digest = _digest(path)
            if isinstance(old, dict) and cursors.get(ds.name):
                then, then_hash = int(old.get("size", -1)), old.get("sha256")
                if size < then:
                    what = f"it is shorter than when it was last read ({size:,} < {then:,} bytes)"
                elif size == then:
                    what = None if digest == then_hash else "its content changed (same size)"
                else:
                    _, prefix = _digest(path, then)
                    what = None if prefix == then_hash else (
                        f"its first {then:,} bytes, read before, changed")
                if what:
                    out.append(
                        f"dataset {ds.name!r}: the source {path} changed since the last "
                        f"session: {what}; the run resumes by position at row "
                        f"{cursors[ds.name]:,} — rows edited, inserted or removed before it "
                        "are not read again (run with --force-new to start over)")
            store.set_meta(key, orjson.dumps({"size": size, "sha256": digest}).decode())
        except OSError:
            continue  # the reader reports an unreadable source itself
    return out
