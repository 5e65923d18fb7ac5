"""An alarm one provider causes excludes that provider and the run goes on (issue 37), end to
end: `specgen run` as a process against the simulator and against an independent server
written here, the real store, `status`, `export` and `report` (docs/quality.md, "An alarm one
provider causes")."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler

import pyarrow.parquet as pq

from specgen.engine.outcome import EXIT_OK, EXIT_STOPPED
from test_engine_quality import SIM, specgen, tool_prompts
from test_engine_support import (
    SimProcess,
    count,
    run_cli,
    serve,
    status_json,
    write_config,
    write_jsonl,
)

TASKS = 40
AUTO = "[quality]\nauto_exclude = true\n"  # every other setting at its default


def sim_run(tmp_path, providers: str, rows: int) -> subprocess.CompletedProcess:
    """`specgen run` over `rows` tool prompts against a simulator of these providers (every
    answer that can call a tool calls one), `auto_exclude` on."""
    sim = SimProcess(tmp_path, SIM.replace("rate = 0.7", "rate = 1.0") + providers)
    try:
        write_jsonl(tmp_path / "w.jsonl", tool_prompts(rows))
        path = write_config(tmp_path, sim.url, [{"name": "tools", "path": "w.jsonl"}],
                            endpoint="concurrency = 4\n", extra=AUTO)
        return run_cli(path)
    finally:
        sim.stop()


def events(run_dir, kind: str) -> list[tuple]:
    from specgen.store import Store

    with Store.open(run_dir) as s:
        return s.conn.execute("SELECT ts, provider, detail FROM events WHERE kind=? ORDER BY id",
                              (kind,)).fetchall()


def answered(run_dir, provider: str) -> int:
    """Answers of a provider the run judged (kept, later superseded, or quarantined; not
    rejected)."""
    return count(run_dir, "SELECT COUNT(*) FROM attempts WHERE provider=? AND (outcome='ok' "
                 "OR outcome LIKE 'quarantined:%' OR outcome LIKE 'superseded:%')", (provider,))


def check_excluded_and_finished(out: subprocess.CompletedProcess, run_dir) -> None:
    """The done-when of issue 37: Bad excluded by the raw_markers alarm within its first ~30
    answers, every task finished from Good (Bad's samples redone in the same session), exit
    0, no exported sample of Bad, the alarm, the exclusion and the redo in the summary, status
    and report."""
    assert out.returncode == EXIT_OK, out.stdout[-2000:] + out.stderr[-3000:]
    (ts, who, detail), = events(run_dir, "provider_excluded")
    assert who == "Bad" and "excluded by alarm raw_markers on dataset 'tools'" in detail
    assert not events(run_dir, "alarm")  # the alarm went with the provider: no stop
    assert 5 <= answered(run_dir, "Bad") <= 30
    # nothing sent to Bad once it was out; Good answered the rest
    assert count(run_dir, "SELECT COUNT(*) FROM attempts WHERE provider='Bad' AND "
                 "started_at > ? AND outcome NOT LIKE 'rejected:%'", (ts,)) == 0
    st = status_json(run_dir)
    assert st["state"] == "finished"
    ds = st["datasets"]["tools"]
    assert ds["done"] == TASKS and ds["failed"] == ds["pending"] == ds["quarantined"] == 0
    check_redone(run_dir, out, st)
    info = st["excluded_providers"]["Bad"]
    assert info["by"] == "auto" and info["figures"]["metric"] == "alarm:raw_markers"
    assert info["figures"]["alarm"]["dataset"] == "tools"
    assert info["figures"]["alarm"]["others"]["figure"] == 0.0
    # said where the user looks: the run's summary, status, the report
    assert "excluded provider Bad (auto): provider 'Bad' excluded by alarm raw_markers" \
        in out.stdout
    text = specgen("status", str(run_dir))
    assert "excluded provider Bad" in text.stdout and "alarm raw_markers" in text.stdout
    rep = specgen("report", str(run_dir), "--text")
    assert rep.returncode == 0, rep.stderr
    assert "Excluded providers" in rep.stdout
    assert "alarm raw_markers on dataset tools" in rep.stdout
    # no exported sample of Bad
    ex = specgen("export", str(run_dir), "--format", "tokens")
    assert ex.returncode == 0, ex.stderr
    rows = pq.read_table(run_dir / "exports" / "tokens.parquet").to_pylist()
    assert {r["provider"] for r in rows} == {"Good"} and len(rows) == TASKS
    assert len(rows) == count(run_dir, "SELECT COUNT(*) FROM results WHERE provider='Good'")
    assert "redone" in rep.stdout


def check_redone(run_dir, out: subprocess.CompletedProcess, st: dict) -> None:
    """Bad's samples made again by Good, each task once: Bad's samples kept in the store as
    superseded (never deleted: paid for), its answered attempts marked so, every task done
    once from Good, and the redo said in the summary and status with what it cost."""
    kept_bad = count(run_dir, "SELECT COUNT(*) FROM attempts WHERE provider='Bad' AND "
                     "outcome='superseded:provider_excluded'")
    assert kept_bad >= 1
    assert count(run_dir, "SELECT COUNT(*) FROM results WHERE provider!='Good'") == 0
    assert count(run_dir, "SELECT COUNT(*) FROM superseded_results WHERE provider='Bad'") \
        == kept_bad
    assert count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status='done'") == TASKS
    assert count(run_dir, "SELECT COUNT(DISTINCT conversation) FROM tasks") == TASKS
    assert count(run_dir, "SELECT COUNT(*) FROM redone") == kept_bad  # each redone once
    red = st["redone"]
    assert red["tasks"] == red["samples_superseded"] == red["tasks_done_again"] == kept_bad
    assert red["attempts"] >= kept_bad  # with their tokens and cost (the status line)
    assert f"redone: {kept_bad} task(s)" in out.stdout
    assert f"redone: {kept_bad} task(s)" in specgen("status", str(run_dir)).stdout


def test_a_provider_sending_raw_markers_is_excluded_and_the_run_finishes_on_the_sim(tmp_path):
    out = sim_run(tmp_path, '[[providers]]\nname = "Good"\ntag = "good/fp8"\n'
                            '[[providers]]\nname = "Bad"\ntag = "bad/fp8"\n'
                            'quirks = { tool_calls_as_text = 0.8 }\n', TASKS)
    check_excluded_and_finished(out, tmp_path / "run-dir")


def test_a_fault_every_provider_shares_still_stops_the_run_in_its_first_answers(tmp_path):
    # the stack ignores `tools` on every provider: no provider is the cause, none excluded
    out = sim_run(tmp_path, "".join(f'[[providers]]\nname = "{p}"\n'
                                    'quirks = { tools_ignored = 1.0 }\n' for p in "AB"), 300)
    run_dir = tmp_path / "run-dir"
    assert out.returncode == EXIT_STOPPED, out.stderr[-3000:]
    assert not events(run_dir, "provider_excluded")
    (_ts, _p, detail), = events(run_dir, "alarm")
    assert "alarm raw_markers on dataset 'tools'" in detail and "not one provider's: " in detail
    judged = answered(run_dir, "A") + answered(run_dir, "B")
    assert 20 <= judged <= 30 + 4  # its first answers (and those in flight)
    assert status_json(run_dir)["datasets"]["tools"]["rows_read"] < 100


# -- an independent server: OpenRouter-like routing over two providers, one of which sends
# its tool calls as raw marker text in 4 of every 5 answers --------------------------------------
MARKERS = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
           "<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>")
ENDPOINTS = [{"provider_name": name, "tag": f"{name.lower()}/fp8", "quantization": "fp8",
              "pricing": {"prompt": "0.0000005", "completion": "0.000002"}}
             for name in ("Good", "Bad")]


class Router(BaseHTTPRequestHandler):
    """Alternates between Good and Bad (honouring `provider.ignore`); records who served."""

    lock = threading.Lock()
    turn = 0
    served: list[str] = []
    ignored: set[str] = set()

    def log_message(self, *a):  # quiet
        pass

    def reply(self, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 - the endpoint list
        self.reply({"data": {"endpoints": ENDPOINTS}})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ignore = {s.split("/")[0].lower() for s in (body.get("provider") or {}).get("ignore", [])}
        city = body["messages"][-1]["content"].rsplit(" ", 1)[-1].rstrip("?")
        args = json.dumps({"city": city})
        with self.lock:
            cls = type(self)
            cls.turn += 1
            who = "Bad" if cls.turn % 2 and "bad" not in ignore else "Good"
            cls.ignored |= ignore
            cls.served.append(who)
            raw = who == "Bad" and sum(1 for w in cls.served if w == "Bad") % 5 != 0
        if raw:
            message = {"role": "assistant", "content": MARKERS.format(args=args)}
            finish = "stop"
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": "functions.get_weather:0", "type": "function",
                 "function": {"name": "get_weather", "arguments": args}}]}
            finish = "tool_calls"
        self.reply({"id": f"gen-{len(self.served)}", "object": "chat.completion",
                    "model": "moonshotai/kimi-k2.5", "provider": who,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}]})


def test_a_provider_sending_raw_markers_is_excluded_against_an_independent_server(tmp_path):
    handler = type("R", (Router,), {"served": [], "ignored": set(), "turn": 0})
    server, url = serve(handler)
    try:
        write_jsonl(tmp_path / "w.jsonl", tool_prompts(TASKS))
        path = write_config(tmp_path, url, [{"name": "tools", "path": "w.jsonl"}],
                            endpoint='concurrency = 4\nstream = false\ndialect = "openrouter"\n'
                                     "fetch_endpoints = true\n",
                            extra=AUTO)
        out = run_cli(path)
    finally:
        server.shutdown()
    check_excluded_and_finished(out, tmp_path / "run-dir")
    assert handler.ignored == {"bad"}  # routed around by provider.ignore
    first = handler.served.index("Bad")
    assert handler.served[first:].count("Bad") <= 30 + 4
