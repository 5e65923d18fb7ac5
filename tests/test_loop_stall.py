"""No answer can starve the event loop (issue 25): a real `specgen run` with one answer of
2 MiB of text (~280k distinct words; normalising and rendering it costs seconds) arriving
while 200 slow small streams are in flight. The large answer is judged in a worker thread, so
the loop's longest stall (the engine's periodic tick, "event loop: longest stall" in
specgen.log) stays a small share of the time that answer took to judge; judged on the loop,
the stall was that whole time (4.3 s here at 2 MiB, 5.2 s at 3 MiB, against 0.3-0.5 s with no
large answer). Bounds are ratios, generous for a loaded machine. The server and the run
config are bench/stall.py's."""

from __future__ import annotations

import sqlite3

from test_engine_support import bench_module


def test_a_huge_answer_is_judged_off_the_loop_while_small_streams_keep_being_read(tmp_path):
    bench = bench_module("stall")
    server, url, _ = bench.serve(2.0, events=30, gap=0.05)
    try:
        cfg = bench.write_run(tmp_path, url, small=200, huge_at=40)
        res = bench.run(cfg, timeout=600)
    finally:
        server.shutdown()
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    log = (tmp_path / "run-dir" / "specgen.log").read_text()
    figures = bench.figures(log)
    assert "off_loop_s" in figures, (figures, log[-3000:])
    assert figures["off_loop_s"] > 0.5, figures  # the answer is heavy enough to matter
    # the loop was never held for more than a small share of that answer's judging
    assert figures["stall_ms"] / 1000 < 0.3 * figures["off_loop_s"], figures
    db = sqlite3.connect(tmp_path / "run-dir" / "state.sqlite")
    assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 201
    # the large answer was kept whole
    assert db.execute("SELECT max(length(message)) FROM results").fetchone()[0] > 2 * 2**20
