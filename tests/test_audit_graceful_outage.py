"""A server that shuts down gracefully mid-run and comes back (third reliability audit): it
stops accepting, closes its keep-alive connections and finishes the answers under way — those
late answers must not read as "the endpoint is back" while new connections are refused. The
log says "endpoint down" once and "reachable again" once. A real `specgen sim` process
(`[[outages]] mode = "graceful"`) and a real `specgen run`."""

from __future__ import annotations

from specgen.engine.outcome import EXIT_OK
from specgen.engine.status import run_status
from specgen.store import Store
from test_engine_sim import go
from test_engine_support import SimProcess, check_store, prompt_rows, write_config, write_jsonl

SIM = """
[length]
distribution = "fixed"
tokens = 30
[[providers]]
name = "Solo"
tag = "solo/int4"
quantization = "int4"
latency_s = 0.3
latency_jitter = 0.5
tokens_per_second = 60             # ~0.5 s of streaming: answers are under way at the shutdown
[[outages]]
start_s = 2.5
duration_s = 4
mode = "graceful"
"""


def test_a_graceful_shutdown_is_one_outage_in_the_log(tmp_path):
    sim = SimProcess(tmp_path, SIM, name="graceful")
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(150))
        path = write_config(tmp_path, sim.url, [{"name": "a", "path": "a.jsonl"}],
                            endpoint="concurrency = 12\nmax_attempts = 2\n"
                                     "fetch_endpoints = false\ndialect = \"openrouter\"\n"
                                     "outage_probe_max = 1")
        cfg, outcome = go(path)
        started = sim.get("/sim/stats")[1]["outages_started"]
    finally:
        sim.stop()
    assert started == 1
    assert (outcome.state, outcome.exit_code) == ("finished", EXIT_OK), outcome
    st = run_status(cfg.run_dir)["datasets"]["a"]
    assert (st["done"], st["failed"]) == (150, 0)
    with Store.open(cfg.run_dir) as s:
        notes = [d for (d,) in s.conn.execute(
            "SELECT detail FROM events WHERE kind='endpoint' ORDER BY ts")]
    down = [n for n in notes if n.startswith("endpoint down")]
    up = [n for n in notes if n.startswith("endpoint reachable again")]
    assert (len(down), len(up)) == (1, 1), notes
    assert notes.index(down[0]) < notes.index(up[0])
    log = [line for line in (cfg.run_dir / "specgen.log").read_text().splitlines()
           if "WARNING" in line and ("endpoint down" in line or "reachable again" in line)]
    assert len(log) == 2 and "endpoint down" in log[0] and "reachable again" in log[1], log
    check_store(cfg.run_dir)
