"""SIGTERM or Ctrl-C while start-up waits for the API ends like a stop during the run (third
reliability audit): exit 5, a summary saying nothing was sent, no traceback, the session
recorded as stopped; not exit 143/130 with nothing said. Real `specgen run` processes against
a port that refuses every connection and against a server that never answers."""

from __future__ import annotations

import signal
import socket
import sqlite3

import pytest

from test_audit_hung_api import HungServer
from test_engine_support import prompt_rows, start_cli, wait_for, write_config, write_jsonl


def _stopped_while_starting(tmp_path, base_url, sig, started):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(3))
    path = write_config(tmp_path, base_url, [{"name": "a", "path": "a.jsonl"}])
    proc = start_cli(path)
    try:
        wait_for(lambda: started() or proc.poll() is not None, timeout=180,
                 what="start-up waiting for the API")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    name = signal.Signals(sig).name
    assert proc.returncode == 5, (proc.returncode, out, err[-3000:])
    assert "Traceback" not in out + err
    assert out.startswith(f"run stopped: stopped (signal {name}) while starting, before any "
                          "request was sent; work left pending, rerun to resume\n"), out
    db = sqlite3.connect(tmp_path / "run-dir" / "state.sqlite")
    assert db.execute("SELECT state FROM sessions").fetchall() == [("stopped",)]
    assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_waiting_for_an_unreachable_api_ends_stopped_with_a_summary(tmp_path, sig):
    closed = socket.socket()  # bound, never listening: every connection is refused
    closed.bind(("127.0.0.1", 0))
    log = tmp_path / "run-dir" / "specgen.log"
    try:
        _stopped_while_starting(
            tmp_path, f"http://127.0.0.1:{closed.getsockname()[1]}/v1", sig,
            lambda: log.exists() and "cannot reach" in log.read_text())
    finally:
        closed.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_a_hung_api_holds_the_endpoint_list_ends_stopped(tmp_path, sig):
    srv = HungServer()  # accepts the endpoint-list GET and never answers it
    try:
        _stopped_while_starting(tmp_path, srv.url, sig, lambda: srv.accepted >= 1)
    finally:
        srv.stop()
