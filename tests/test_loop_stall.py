"""No answer can starve the event loop (issue 25): a real `specgen run` with one huge answer of
distinct words (~280k words at 2 MiB; normalising and rendering it costs a good part of a
second a MiB) arriving while 200 slow small streams are in flight. The large answer is judged
in a worker thread: the log names that thread, and counts the turns the loop made while it ran
(its stall probe, every STALL_PROBE s, woke with the work unfinished). Judged on the loop, it
would be the loop's own thread with no turn meanwhile and a stall of the whole judging time.
No bound is an absolute time: the answer is sized against the judging time the run itself
measured (a faster machine gets a larger answer), and the loop's turns and stalls are compared
with that same measurement. The server and the run config are bench/stall.py's."""

from __future__ import annotations

import sqlite3
import subprocess

import pytest

from specgen.engine.answer.pipeline import STALL_PROBE
from test_engine_support import SPECGEN, bench_module, start_cli, wait_for
from timing_support import scaled

# judging must last this many stall probes for the loop's turns to say anything
MIN_PROBES = 6


def judge_huge(tmp_path, mib: float) -> dict:
    tmp_path.mkdir()
    bench = bench_module("stall")
    server, url, _ = bench.serve(mib, events=30, gap=0.05)
    try:
        cfg = bench.write_run(tmp_path, url, small=200, huge_at=40,
                              max_answer_bytes=int((mib + 1) * 2**20))
        res = bench.run(cfg, timeout=600)
    finally:
        server.shutdown()
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    log = (tmp_path / "run-dir" / "specgen.log").read_text()
    figures = bench.figures(log)
    assert "off_loop_s" in figures, (figures, log[-3000:])
    db = sqlite3.connect(tmp_path / "run-dir" / "state.sqlite")
    assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 201
    # the large answer was kept whole
    assert db.execute("SELECT max(length(message)) FROM results").fetchone()[0] > mib * 2**20
    db.close()
    return figures


@pytest.mark.timing
def test_a_huge_answer_is_judged_off_the_loop_while_small_streams_keep_being_read(tmp_path):
    mib = scaled(2.0, minimum=0.25)
    figures = judge_huge(tmp_path / "first", mib)
    wanted = MIN_PROBES * STALL_PROBE
    if figures["off_loop_s"] < wanted:
        # judged too fast here for its turns to count: once more with an answer sized from
        # what this machine took (half as large again as that measure asks)
        mib = min(16.0, mib * 1.5 * wanted / max(figures["off_loop_s"], 0.01))
        figures = judge_huge(tmp_path / "again", mib)
    probes = figures["off_loop_s"] / STALL_PROBE
    assert probes >= MIN_PROBES / 2, (mib, figures)  # heavy enough now to show the property
    # not the loop's thread: asyncio's worker threads are named asyncio_N
    assert figures["thread"] != "MainThread" and figures["thread"].startswith("asyncio"), figures
    # meanwhile the loop turned (a judging that held it would leave no turn at all), at
    # least a quarter as often as an idle loop would, and was never held for half the time
    assert figures["turns"] >= max(1, probes / 4), figures
    assert figures["meanwhile_ms"] / 1000 < 0.5 * figures["off_loop_s"], figures


@pytest.mark.timing
def test_a_stop_now_while_a_huge_answer_is_judged_lets_it_finish_and_be_stored(tmp_path):
    # the answer is paid: `specgen stop --now` cancels what is in flight, but an answer being
    # judged in its worker thread is finished, carried out and committed (exit 3: cancelled)
    bench = bench_module("stall")
    server, url, _ = bench.serve(2.0, events=400, gap=0.05)  # small streams: 20 s each
    try:
        cfg = bench.write_run(tmp_path, url, small=20, huge_at=5)
        proc = start_cli(cfg)
        log = tmp_path / "run-dir" / "specgen.log"
        try:
            wait_for(lambda: (log.exists() and "off the event loop" in log.read_text())
                     or proc.poll() is not None, timeout=300, what="the large answer judged")
            assert proc.poll() is None, proc.communicate()
            stop = subprocess.run([*SPECGEN, "stop", str(tmp_path / "run-dir"), "--now"],
                                  capture_output=True, text=True, timeout=300)
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    finally:
        server.shutdown()
    assert proc.returncode == 3, (stop.stdout, stop.stderr, out, err[-3000:])
    assert "Traceback" not in out + err
    db = sqlite3.connect(tmp_path / "run-dir" / "state.sqlite")
    assert db.execute("SELECT max(length(message)) FROM results").fetchone()[0] > 2 * 2**20
    # the small streams were cancelled; the large answer's attempt is an answer, not that
    statuses = dict(db.execute("SELECT outcome, COUNT(*) FROM attempts GROUP BY outcome"))
    assert statuses.get("ok") == 1 and statuses.get("cancelled", 0) >= 1, statuses
