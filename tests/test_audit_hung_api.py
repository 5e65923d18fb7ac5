"""A hung API — connections accepted, requests never answered — is an outage that pauses the
run, not a reason to fail tasks (third reliability audit): `specgen run` against such a server
ends stopped (exit 5, resumable) with no failed task, whatever `max_attempts` is."""

from __future__ import annotations

import socket
import sqlite3
import threading

from test_engine_support import prompt_rows, run_cli, write_config, write_jsonl


class HungServer:
    """Accepts every connection and reads the request; never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.conns: list[socket.socket] = []
        self.accepted = 0
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)  # held open, never written to

    def stop(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def test_first_byte_timeouts_across_many_tasks_pause_the_run_instead_of_failing_tasks(tmp_path):
    srv = HungServer()
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(40))
        path = write_config(
            tmp_path, srv.url, [{"name": "a", "path": "a.jsonl"}],
            endpoint="concurrency = 8\nmax_attempts = 2\nfirst_byte_timeout = 0.5\n"
                     "fetch_endpoints = false\noutage_probe_max = 0.5",
            extra="outage_timeout = 4")
        res = run_cli(path, timeout=120)
    finally:
        srv.stop()
    out = res.stdout + res.stderr
    assert res.returncode == 5, out[-3000:]
    assert "Traceback" not in out
    assert "first-byte timeout" in out
    db = sqlite3.connect(tmp_path / "run-dir" / "state.sqlite")
    assert db.execute("SELECT COUNT(*) FROM tasks WHERE status='failed'").fetchone()[0] == 0
    assert srv.accepted >= 5
