"""No paid answer is lost to a store error while the process lives: a real full disk (a small
tmpfs), a read-only mount, the store deleted or corrupted under an open connection.

The disk-full and read-only tests mount a tmpfs (root only); they are skipped, saying why,
where mounting is not permitted. Everything else runs on the ordinary temp dir.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import orjson
import pytest

from specgen.engine import ballast as ballast_mod
from specgen.engine.ballast import BALLAST_FILE, Ballast, free_bytes
from specgen.engine.writer import StoreWriter
from specgen.store import (
    STORE_FILE,
    Batch,
    Store,
    StoreWriteError,
    check_writable,
    classify_store_error,
    pack_ids,
    pack_json,
)

N_IDS = 2000  # token ids per result: 8 KB, so a few dozen results fill a small disk


# -- rows -------------------------------------------------------------------------------------
def conv_row(cid: int, ds: str = "a"):
    data = {"id": f"c{cid}", "messages": [{"role": "user", "content": f"q{cid}"}]}
    return (cid, ds, f"c{cid}", cid, "active", None, pack_json(data))


def task_row(tid: int, status: str = "pending", attempts: int = 1):
    return (tid, tid, "a", 1, status, attempts, None)


def attempt_row(tid: int):
    return (tid, 1, "http://x", "p1", "m", 1.0, 1.1, 1.2, "ok", 200, None, 10, 5, 0.01, "g", "a",
            1.15)


def result_row(tid: int, n_ids: int = N_IDS):
    return (tid, tid, "a", 1, "p1", "m", "stop", "stop",
            pack_json({"messages": [{"role": "user", "content": f"q{tid}"}], "tools": None}),
            orjson.dumps({"role": "assistant", "content": f"a{tid}"}).decode(),
            pack_ids(range(tid, tid + n_ids)), 2, None, None, 10, 5, 0, 0.01, "[]", 0.5,
            time.time(), "exact", None, "fp8", None)


def add_answers(b: Batch, ids, *, status: str = "pending", attempts: int = 1,
                n_ids: int = N_IDS) -> None:
    """What the engine buffers for answered tasks: conversation, task, attempt, result, event."""
    for i in ids:
        b.conversations.append(conv_row(i))
        b.tasks[i] = task_row(i, status, attempts)
        b.conv_status[i] = ("active", None)
        b.attempts.append(attempt_row(i))
        b.results.append(result_row(i, n_ids))
        b.events.append((time.time(), 1, "answer", "a", "p1", f"e{i}"))


def dataset_row(rows_read: int):
    return ("a", 0, "/d/a.jsonl", "auto", rows_read, 0, 0, 0, 0, "active", "h")


def seed(store: Store) -> None:
    b = Batch()
    b.datasets["a"] = dataset_row(0)
    add_answers(b, [1, 2], status="done", n_ids=4)
    store.write(b)
    store.start_session(1, "host", "argv", time.time())


def column(path: Path, sql: str) -> list:
    """Rows read through a fresh connection: what is really in the file."""
    conn = sqlite3.connect(path)
    try:
        return [r[0] if len(r) == 1 else r for r in conn.execute(sql)]
    finally:
        conn.close()


# -- a small real disk ------------------------------------------------------------------------
def _mount_tmpfs(where: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a small tmpfs, and mounting one needs root")
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {r.stderr.strip()}")


def _umount(where: Path) -> None:
    r = subprocess.run(["umount", str(where)], capture_output=True)
    if r.returncode != 0:  # something still open (a failed test): detach it anyway
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs, unmounted afterwards whatever happens."""
    where = tmp_path / "disk"
    where.mkdir()
    _mount_tmpfs(where, "4m")
    try:
        yield where
    finally:
        _umount(where)


def fill(disk: Path) -> Path:
    """Fill the disk to the last page with a filler file; returns it (delete it to free)."""
    path = disk / "filler"
    with open(path, "ab", buffering=0) as f:
        for chunk in (bytes(1 << 16), bytes(1 << 12), bytes(512)):
            try:
                while True:
                    f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    assert free_bytes(disk) < 4096
    return path


# -- Store.write ------------------------------------------------------------------------------
def test_write_on_a_full_disk_raises_disk_full_not_cannot_rollback(small_disk):
    store = Store.create(small_disk / "run")
    try:
        seed(store)
        filler = fill(small_disk)
        b = Batch()
        add_answers(b, range(10, 40))
        with pytest.raises(StoreWriteError) as info:
            store.write(b)
        err = info.value
        assert err.kind == "disk_full"
        assert "disk full" in str(err) and "database or disk is full" in str(err)
        assert "cannot rollback" not in str(err)
        assert str(small_disk / "run") in str(err)
        assert isinstance(err.__cause__, sqlite3.OperationalError)
        assert err.__cause__.sqlite_errorname == "SQLITE_FULL"
        assert not store.conn.in_transaction
        # nothing of the batch is in the store; once there is room the same batch goes in
        assert column(store.path, "SELECT COUNT(*) FROM results") == [2]
        filler.unlink()
        store.write(b)
        assert column(store.path, "SELECT task FROM results ORDER BY task") == [
            1, 2, *range(10, 40)]
    finally:
        store.close()


def test_write_raises_locked_when_another_writer_holds_the_store(tmp_path):
    store = Store.create(tmp_path)
    other = sqlite3.connect(store.path, isolation_level=None)
    try:
        seed(store)
        store.conn.execute("PRAGMA busy_timeout=50")
        other.execute("BEGIN IMMEDIATE")
        b = Batch()
        add_answers(b, [5])
        with pytest.raises(StoreWriteError) as info:
            store.write(b)
        assert info.value.kind == "locked" and "database is locked" in str(info.value)
        other.execute("ROLLBACK")
        store.write(b)
        assert column(store.path, "SELECT COUNT(*) FROM results") == [3]
    finally:
        other.close()
        store.close()


def test_bugs_are_not_store_errors(tmp_path):
    store = Store.create(tmp_path)
    try:
        seed(store)
        b = Batch()
        b.conversations.append(conv_row(1))  # already stored: a constraint violation
        with pytest.raises(sqlite3.IntegrityError):
            store.write(b)
        assert not store.conn.in_transaction
        b = Batch()
        b.events.append((1.0, 1))  # wrong number of values
        with pytest.raises(sqlite3.ProgrammingError):
            store.write(b)
    finally:
        store.close()


def test_classify_store_error(tmp_path):
    path = tmp_path / STORE_FILE
    path.write_bytes(b"")
    kinds = {
        errno.ENOSPC: "disk_full", errno.EDQUOT: "disk_full", errno.EROFS: "read_only",
        errno.EACCES: "read_only", errno.EIO: "io",
    }
    for code, kind in kinds.items():
        err = classify_store_error(OSError(code, os.strerror(code)), path)
        assert err is not None and err.kind == kind, (code, err)
        assert str(tmp_path) in err.message
    assert classify_store_error(OSError(errno.EEXIST, "exists"), path) is None
    assert classify_store_error(ValueError("x"), path) is None
    assert classify_store_error(sqlite3.IntegrityError("UNIQUE constraint failed"), path) is None
    # message fallbacks (errors without a code)
    for text, kind in (("database or disk is full", "disk_full"),
                       ("attempt to write a readonly database", "read_only"),
                       ("database disk image is malformed", "corrupt"),
                       ("file is not a database", "corrupt"),
                       ("database is locked", "locked")):
        err = classify_store_error(sqlite3.OperationalError(text), path)
        assert err is not None and err.kind == kind, text
    # a real SQLITE_READONLY
    store = Store.create(tmp_path)
    store.close()
    ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        with pytest.raises(sqlite3.OperationalError) as info:
            ro.execute("INSERT INTO meta VALUES('k', 'v')")
        assert classify_store_error(info.value, path).kind == "read_only"
    finally:
        ro.close()
    # the whole run dir gone
    gone = tmp_path / "gone" / STORE_FILE
    err = classify_store_error(sqlite3.OperationalError("unable to open database file"), gone)
    assert err.kind == "missing"


# -- StoreWriter ------------------------------------------------------------------------------
def test_writer_holds_a_refused_batch_and_commits_it_once_there_is_room(small_disk):
    store = Store.create(small_disk / "run")
    try:
        seed(store)
        writer = StoreWriter(store, threaded=False)
        filler = fill(small_disk)

        b = writer.batch
        b.datasets["a"] = dataset_row(30)
        b.meta["k"] = "old"
        add_answers(b, range(10, 30))
        b.quarantine.append((99, "a", "p1", "bad", None, 1.0, None))
        b.invalid_rows.append(("a", 7, 8, "not json"))
        b.session = (100.0, "running", None, None, 1)
        writer.uncommitted_convs.update(("a", f"c{i}") for i in range(10, 30))
        rows_a = len(b)

        t0 = time.time()
        assert writer.flush() is False
        p = writer.problem
        assert p is not None and p.kind == "disk_full" and p.failures == 1
        assert "disk full" in p.message and t0 <= p.since <= time.time()
        assert isinstance(p.error, StoreWriteError)
        assert writer.held_results == 20 and writer.held_rows == rows_a
        assert writer.has_uncommitted_conv("a", "c10")
        assert writer.error is None

        # the engine keeps buffering: newer values of the same task / dataset / meta key
        b = writer.batch
        b.datasets["a"] = dataset_row(40)
        b.meta["k"] = "new"
        for i in range(10, 15):
            b.tasks[i] = task_row(i, "done", 2)
        add_answers(b, range(30, 40))
        b.session = (200.0, "running", None, None, 1)
        writer.uncommitted_convs.update(("a", f"c{i}") for i in range(30, 40))
        assert writer.held_results == 30

        since = p.since
        assert writer.flush() is False
        assert writer.problem.failures == 2 and writer.problem.since == since
        assert writer.held_results == 30
        assert column(store.path, "SELECT COUNT(*) FROM results") == [2]

        filler.unlink()
        assert writer.flush() is True
        assert writer.problem is None and writer.held_rows == 0 and writer.held_results == 0
        assert not writer.has_uncommitted_conv("a", "c10")

        path = store.path
        want = [1, 2, *range(10, 40)]
        assert column(path, "SELECT task FROM results ORDER BY task") == want
        assert column(path, "SELECT task FROM attempts ORDER BY id") == want  # in order
        assert column(path, "SELECT detail FROM events WHERE kind='answer' ORDER BY id") == [
            f"e{i}" for i in want]
        assert column(path, "SELECT id FROM conversations ORDER BY id") == want
        status = dict(column(path, "SELECT id, status FROM tasks"))
        assert all(status[i] == "done" for i in (1, 2, *range(10, 15)))
        assert all(status[i] == "pending" for i in range(15, 40))
        attempts = dict(column(path, "SELECT id, attempts FROM tasks"))
        assert attempts[10] == 2 and attempts[15] == 1
        assert column(path, "SELECT rows_read FROM datasets") == [40]
        assert column(path, "SELECT value FROM meta WHERE key='k'") == ["new"]
        assert column(path, "SELECT heartbeat_at FROM sessions") == [200.0]
        assert column(path, "SELECT COUNT(*) FROM quarantine") == [1]
        assert column(path, "SELECT COUNT(*) FROM invalid_rows") == [1]
        # the ids are intact
        blob = column(path, "SELECT input_ids FROM results WHERE task=39")[0]
        assert blob == pack_ids(range(39, 39 + N_IDS))
    finally:
        store.close()


def test_flush_async_holds_a_commit_that_fails_while_more_is_buffered(small_disk):
    store = Store.create(small_disk / "run")
    try:
        seed(store)
        filler = fill(small_disk)
        real_write = store.write
        gate = threading.Event()
        calls = []

        def gated_write(batch):  # runs in the worker thread
            calls.append(len(batch.results))
            gate.wait(10)
            real_write(batch)

        store.write = gated_write
        writer = StoreWriter(store, interval=0.05, retry_max=0.2)

        async def main():
            add_answers(writer.batch, range(10, 30))
            writer.uncommitted_convs.update(("a", f"c{i}") for i in range(10, 30))
            flushing = asyncio.ensure_future(writer.flush_async())
            while writer._flushing is None:
                await asyncio.sleep(0)
            # the commit is under way (blocked): its rows are held, more arrive meanwhile
            assert writer.held_results == 20
            assert writer.has_uncommitted_conv("a", "c10")
            for i in range(10, 15):
                writer.batch.tasks[i] = task_row(i, "done", 2)
            add_answers(writer.batch, range(30, 40))
            assert writer.held_results == 30
            gate.set()
            assert await flushing is False
            assert writer.problem.kind == "disk_full" and writer.problem.failures == 1
            assert writer.held_results == 30
            assert writer.has_uncommitted_conv("a", "c10")
            await writer.wait_idle()  # a refused commit is not an error
            assert writer.error is None
            assert [r[0] for r in writer.batch.results] == list(range(10, 40))
            assert [r[0] for r in writer.batch.attempts] == list(range(10, 40))
            assert list(writer.batch.tasks) == list(range(10, 40))

            # within the back-off a flush does not retry; force does (still full)
            assert not writer.due()
            assert await writer.flush_async() is False
            assert len(calls) == 1
            assert await writer.flush_async(force=True) is False
            assert len(calls) == 2 and writer.problem.failures == 2

            filler.unlink()
            await asyncio.sleep(writer.retry_delay())
            assert writer.due()
            assert await writer.flush_async() is True
            assert len(calls) == 3 and calls[-1] == 30
            assert writer.problem is None and writer.held_rows == 0
            assert await writer.flush_async() is True  # nothing buffered

        asyncio.run(main())
        want = [1, 2, *range(10, 40)]
        assert column(store.path, "SELECT task FROM attempts ORDER BY id") == want
        assert column(store.path, "SELECT task FROM results ORDER BY task") == want
        status = dict(column(store.path, "SELECT id, status FROM tasks"))
        assert [status[i] for i in range(10, 16)] == ["done"] * 5 + ["pending"]
    finally:
        store.close()


def test_flush_async_unthreaded_holds_and_retries(small_disk):
    store = Store.create(small_disk / "run")
    try:
        seed(store)
        filler = fill(small_disk)
        writer = StoreWriter(store, threaded=False)

        async def main():
            add_answers(writer.batch, range(10, 30))
            assert await writer.flush_async() is False
            assert writer.problem.kind == "disk_full" and writer.held_results == 20
            add_answers(writer.batch, range(30, 35))
            filler.unlink()
            assert await writer.flush_async(force=True) is True
            assert writer.problem is None and writer.held_rows == 0

        asyncio.run(main())
        assert column(store.path, "SELECT task FROM attempts ORDER BY id") == [
            1, 2, *range(10, 35)]
    finally:
        store.close()


def test_a_bug_in_a_commit_still_propagates(tmp_path):
    store = Store.create(tmp_path)
    try:
        writer = StoreWriter(store)

        def broken(batch):
            raise ValueError("bug")

        store.write = broken

        async def main():
            add_answers(writer.batch, [1])
            with pytest.raises(ValueError):
                await writer.flush_async()
            assert writer.problem is None
            with pytest.raises(ValueError):
                await writer.wait_idle()

        asyncio.run(main())
    finally:
        store.close()


# -- ballast ----------------------------------------------------------------------------------
def test_ballast_release_lets_a_held_batch_commit(small_disk):
    run = small_disk / "run"
    store = Store.create(run)
    try:
        seed(store)
        ballast = Ballast(run, 1 << 20)
        assert ballast.create() and ballast.present
        st = os.stat(run / BALLAST_FILE)
        assert st.st_size == 1 << 20 and st.st_blocks * 512 >= 1 << 20  # really allocated
        filler = fill(small_disk)

        writer = StoreWriter(store, threaded=False)
        add_answers(writer.batch, range(10, 40))
        assert writer.flush() is False and writer.problem.kind == "disk_full"

        assert ballast.release() is True and not ballast.present
        assert ballast.release() is False
        assert writer.flush() is True and writer.problem is None
        assert column(store.path, "SELECT COUNT(*) FROM results") == [32]

        assert ballast.restore() is False  # needs size + margin free: not yet
        assert not ballast.present
        filler.unlink()
        assert ballast.restore() is True and ballast.present
        assert ballast.restore() is True  # already there
        # recreating replaces it
        assert ballast.create() and os.stat(run / BALLAST_FILE).st_size == 1 << 20
    finally:
        store.close()


def test_ballast_create_fails_cleanly_without_room(small_disk):
    filler = fill(small_disk)
    ballast = Ballast(small_disk, 1 << 20)
    assert ballast.create() is False
    assert not ballast.present and not (small_disk / BALLAST_FILE).exists()
    filler.unlink()
    assert ballast.create() is True


def test_ballast_without_fallocate_writes_zeros(tmp_path, monkeypatch):
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "not supported")

    monkeypatch.setattr(ballast_mod.os, "posix_fallocate", unsupported, raising=False)
    ballast = Ballast(tmp_path, 3 * (1 << 20) + 5)
    assert ballast.create()
    st = os.stat(tmp_path / BALLAST_FILE)
    assert st.st_size == 3 * (1 << 20) + 5 and st.st_blocks * 512 >= st.st_size


def test_ballast_restore_margin(tmp_path):
    ballast = Ballast(tmp_path, 1 << 20)
    assert not ballast.present
    assert ballast.restore(margin_bytes=free_bytes(tmp_path) + (1 << 40)) is False
    assert not ballast.present
    assert ballast.restore() is True and ballast.present
    assert ballast.release() is True


def test_ballast_of_size_zero_is_a_no_op(tmp_path):
    ballast = Ballast(tmp_path, 0)
    assert ballast.create() is True and ballast.restore() is True
    assert ballast.release() is False and not ballast.present
    assert not (tmp_path / BALLAST_FILE).exists()
    assert free_bytes(tmp_path) > 0 and free_bytes(tmp_path / "not" / "there") > 0


# -- the store file deleted under the engine --------------------------------------------------
@pytest.mark.parametrize("deleted", [("", "-wal", "-shm"), ("",), ("-wal",), ("-shm",),
                                     ("-wal", "-shm")])
def test_restore_to_path_after_the_store_was_deleted(tmp_path, deleted):
    store = Store.create(tmp_path)
    reader = None
    try:
        seed(store)
        b = Batch()
        add_answers(b, range(10, 20))
        store.write(b)
        reader = Store.open(tmp_path)  # as the runner keeps one open beside the writer
        assert reader.task_counts()["a"]["pending"] == 10
        path = Path(store._abspath)
        assert os.path.getsize(str(path) + "-wal") > 0  # the rows are in the WAL only
        assert store.identity_problem() is None
        assert store.restore_to_path() is False  # nothing to restore

        for suffix in deleted:
            os.unlink(str(path) + suffix)
        problem = store.identity_problem()
        assert problem == ("deleted" if "" in deleted else
                           "partly deleted (its -wal/-shm file was removed or replaced)")

        # SQLite (WAL) keeps committing into the unlinked files without an error: that is
        # why the engine checks identity_problem() after its commits
        b = Batch()
        add_answers(b, [20])
        try:
            store.write(b)
            after = [20]
        except StoreWriteError as exc:
            assert exc.kind == "missing"
            after = []

        assert store.restore_to_path() is True
        assert store.identity_problem() is None
        want = [1, 2, *range(10, 20), *after]
        assert column(path, "SELECT task FROM results ORDER BY task") == want
        assert column(path, "PRAGMA journal_mode") == ["wal"]

        # later commits land in the restored file
        b = Batch()
        add_answers(b, [30, 31])
        store.write(b)
        assert column(path, "SELECT task FROM results ORDER BY task") == [*want, 30, 31]
        # a reader opened before still sees the old file (reopen it); closing it harms nothing
        reader.close()
        reader = None
        b = Batch()
        add_answers(b, [32])
        store.write(b)
        assert column(path, "SELECT task FROM results ORDER BY task") == [*want, 30, 31, 32]
        assert column(path, "PRAGMA integrity_check") == ["ok"]
        assert not [p for p in os.listdir(tmp_path) if ".restore-" in p]
    finally:
        if reader is not None:
            reader.close()
        store.close()
    with Store.open(tmp_path) as again:
        assert len(list(again.iter_results())) == len(want) + 3


def test_restore_when_the_whole_run_dir_was_removed(tmp_path):
    run = tmp_path / "run"
    store = Store.create(run)
    try:
        seed(store)
        shutil.rmtree(run)
        assert store.identity_problem() == "deleted"
        assert store.restore_to_path() is True
        assert column(run / STORE_FILE, "SELECT COUNT(*) FROM results") == [2]
    finally:
        store.close()


def test_a_replaced_store_is_reported_and_left_alone(tmp_path):
    store = Store.create(tmp_path)
    try:
        seed(store)
        path = Path(store._abspath)
        other = tmp_path / "other.sqlite"
        sqlite3.connect(other).close()
        os.replace(other, path)
        assert store.identity_problem() == "replaced"
        assert store.restore_to_path() is False
        assert column(path, "SELECT COUNT(*) FROM sqlite_master") == [0]
    finally:
        store.close()


def test_restore_on_a_full_disk_fails_cleanly_and_works_once_there_is_room(small_disk):
    run = small_disk / "run"
    store = Store.create(run)
    try:
        seed(store)
        path = Path(store._abspath)
        os.unlink(path)  # the space stays in use while the connection holds the file
        filler = fill(small_disk)
        assert store.identity_problem() == "deleted"
        assert store.restore_to_path() is False
        assert [p for p in os.listdir(run) if p.startswith(".")] == []  # no temp left
        assert store.conn.execute("SELECT COUNT(*) FROM results").fetchone() == (2,)
        filler.unlink()
        assert store.restore_to_path() is True
        assert column(path, "SELECT COUNT(*) FROM results") == [2]
    finally:
        store.close()


# -- a corrupt store --------------------------------------------------------------------------
def test_corruption_under_an_open_store_is_classified_corrupt(tmp_path):
    """Best effort, and what happens: the writing connection keeps the pages it has cached,
    so a small store whose pages are all cached keeps taking commits (into the WAL) after its
    file was overwritten; the damage shows when a page is read from the file — a write that
    touches an uncached page (simulated here with a 2-page cache), or any new connection —
    as "database disk image is malformed" (kind corrupt). A damaged header reads as "file is
    not a database" (corrupt too)."""
    store = Store.create(tmp_path)
    try:
        seed(store)
        for k in range(5):
            b = Batch()
            add_answers(b, range(100 + 20 * k, 120 + 20 * k))
            store.write(b)
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # all pages in the main file
        store.conn.execute("PRAGMA cache_size=2")
        size = os.path.getsize(store.path)
        with open(store.path, "r+b") as f:
            f.seek(4096)
            f.write(os.urandom(size - 4096))

        writer = StoreWriter(store, threaded=False)
        add_answers(writer.batch, [500])
        assert writer.flush() is False
        assert writer.problem.kind == "corrupt"
        assert "store corrupt" in writer.problem.message
        assert "malformed" in writer.problem.message
        assert writer.held_results == 1

        fresh = sqlite3.connect(store.path)
        try:
            with pytest.raises(sqlite3.DatabaseError) as info:
                fresh.execute("SELECT COUNT(*) FROM results").fetchall()
            assert classify_store_error(info.value, store.path).kind == "corrupt"
        finally:
            fresh.close()
    finally:
        store.close()

    with open(tmp_path / STORE_FILE, "r+b") as f:
        f.write(os.urandom(100))  # the header
    fresh = sqlite3.connect(tmp_path / STORE_FILE)
    try:
        with pytest.raises(sqlite3.DatabaseError) as info:
            fresh.execute("SELECT COUNT(*) FROM results").fetchall()
        err = classify_store_error(info.value, tmp_path / STORE_FILE)
        assert err.kind == "corrupt", info.value
    finally:
        fresh.close()


# -- a read-only run dir ----------------------------------------------------------------------
def test_check_writable(tmp_path):
    assert check_writable(tmp_path) is None
    assert check_writable(tmp_path / "new" / "run") is None  # created later, under tmp_path
    Store.create(tmp_path / "run").close()
    assert check_writable(tmp_path / "run") is None
    assert not [p for p in os.listdir(tmp_path / "run") if "writable" in p]
    (tmp_path / "file").write_text("x")
    assert "not a directory" in check_writable(tmp_path / "file" / "run")


def test_check_writable_on_a_read_only_mount(small_disk):
    """Permission bits do not stop root, so the read-only case is a read-only remount."""
    run = small_disk / "run"
    Store.create(run).close()
    r = subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot remount the tmpfs read-only here: {r.stderr.strip()}")
    problem = check_writable(run)
    assert problem is not None
    assert "read-only" in problem and str(run) in problem
    problem = check_writable(run / "sub")
    assert problem is not None and "cannot create the run dir" in problem
    with pytest.raises(sqlite3.OperationalError) as info:
        Store.create(run)
    err = classify_store_error(info.value, run / STORE_FILE)
    assert err is not None and err.kind == "read_only"


def test_check_writable_refuses_a_full_disk(small_disk):
    fill(small_disk)
    problem = check_writable(small_disk)
    assert problem is not None and "no space" in problem
    assert not [p for p in os.listdir(small_disk) if "writable" in p]
