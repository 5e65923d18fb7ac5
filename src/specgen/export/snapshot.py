"""A consistent, read-only view of a run store, safe while the run is still writing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..store import Store


@contextmanager
def read_snapshot(run_dir: str | Path) -> Iterator[Store]:
    """Open the store read-only inside one read transaction.

    In WAL mode every query of the transaction sees the database as of its first read, so an
    export, verify or report of a running run is consistent even while the engine commits.
    """
    store = Store.open(run_dir, readonly=True)
    try:
        store.conn.execute("BEGIN")
        store.get_meta("schema_version")  # the first read fixes the snapshot
        yield store
    finally:
        try:
            store.conn.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        store.close()
