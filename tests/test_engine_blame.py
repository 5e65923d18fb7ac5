"""An alarm one provider causes excludes that provider and the run goes on (issue 37), end to
end: `specgen run` as a process against the simulator and against an independent server
written here, the real store, `status`, `export` and `report` (docs/quality.md, "An alarm one
provider causes")."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler

import pyarrow.parquet as pq

from specgen.engine.outcome import EXIT_OK, EXIT_STOPPED
from test_engine_quality import SIM, provider, specgen, tool_prompts
from test_engine_support import (
    SimProcess,
    count,
    multi_turn_rows,
    run_cli,
    serve,
    start_cli,
    status_json,
    wait_for,
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


# -- the redo of a multi-turn conversation (engine.redo): an independent server alternating
# Good and Bad over two-turn chats, `turns = "all"`; each answer names who made it ----------
CONVS = 12
SERVED_BEFORE_GATE = 10


class ChatRouter(Router):
    """Plain chat answers "<who> answer <n>"; requests past the first SERVED_BEFORE_GATE wait
    for `gate`; `delay` slows every answer. Records (who, the request's messages, answer)."""

    arrived = 0
    gate = threading.Event()
    delay = 0.0

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ignore = {s.split("/")[0].lower() for s in (body.get("provider") or {}).get("ignore", [])}
        cls = type(self)
        with self.lock:
            cls.arrived += 1
            gated = cls.arrived > SERVED_BEFORE_GATE
        if gated:
            cls.gate.wait(60)
        time.sleep(cls.delay)
        with self.lock:
            cls.turn += 1
            who = "Bad" if cls.turn % 2 and "bad" not in ignore else "Good"
            content = f"{who} answer {cls.turn}"
            cls.served.append((who, body["messages"], content))
        self.reply({"id": f"gen-{cls.turn}", "object": "chat.completion",
                    "model": "moonshotai/kimi-k2.5", "provider": who,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": content}}]})


def chat_router() -> type[ChatRouter]:
    return type("C", (ChatRouter,), {"served": [], "ignored": set(), "turn": 0, "arrived": 0,
                                     "gate": threading.Event(), "delay": 0.0})


def chat_config(tmp_path, url: str):
    write_jsonl(tmp_path / "m.jsonl", multi_turn_rows(CONVS))
    return write_config(tmp_path, url, [{"name": "chat", "path": "m.jsonl", "turns": "all"}],
                        endpoint='concurrency = 2\nstream = false\ndialect = "openrouter"\n'
                                 "fetch_endpoints = true\n",
                        extra='[quality]\nredo_excluded = "all"\n')


def exclude_bad_while_gated(tmp_path, handler) -> subprocess.Popen:
    """Start the run; once the gate holds it (Bad has answered first turns), exclude Bad by
    hand (`redo_excluded = "all"` redoes a user's exclusion too)."""
    proc = start_cli(chat_config(tmp_path, handler.url))
    wait_for(lambda: handler.arrived > SERVED_BEFORE_GATE, what="the gate")
    assert sum(1 for who, msgs, _ in handler.served if who == "Bad" and len(msgs) == 1) >= 1
    out = provider([str(tmp_path / "run-dir"), "--exclude", "Bad"])
    assert out.returncode == 0, out.stderr
    return proc


def results_of(run_dir) -> dict[int, dict[int, tuple[str, str]]]:
    """{conversation: {turn: (provider, answer text)}} of the stored samples."""
    from specgen.store import Store

    out: dict[int, dict[int, tuple[str, str]]] = {}
    with Store.open(run_dir) as s:
        for conv, turn, prov, msg in s.conn.execute(
                "SELECT conversation, turn, provider, message FROM results"):
            out.setdefault(conv, {})[turn] = (prov, json.loads(msg)["content"])
    return out


def check_multi_turn_redone(run_dir, handler, sessions: int) -> None:
    """Every turn of every conversation done once, from Good; a conversation whose first turn
    Bad had answered was redone from that turn (its second turn, whoever answered it,
    superseded too), and each final second turn was asked on the final first answer."""
    st = status_json(run_dir)
    assert st["state"] == "finished" and st["sessions"] == sessions
    ds = st["datasets"]["chat"]
    assert ds["done"] == 2 * CONVS and ds["pending"] == ds["failed"] == ds["quarantined"] == 0
    assert count(run_dir, "SELECT COUNT(*) FROM tasks") == 2 * CONVS
    res = results_of(run_dir)
    assert len(res) == CONVS and all(sorted(t) == [1, 3] for t in res.values())
    assert {p for turns in res.values() for p, _ in turns.values()} == {"Good"}
    asked = {content: msgs for _who, msgs, content in handler.served}
    for turns in res.values():  # turn 3 was asked with the final turn-1 answer as history
        history = asked[turns[3][1]]
        assert (history[1]["role"], history[1]["content"]) == ("assistant", turns[1][1])
    from specgen.store import Store

    with Store.open(run_dir) as s:
        redone = s.conn.execute("SELECT conversation, turn FROM redone").fetchall()
        superseded = s.conn.execute(
            "SELECT conversation, turn, provider FROM superseded_results").fetchall()
    assert len({c for c, _ in redone}) == len(redone)  # each conversation redone once
    from_first = {c for c, t in redone if t == 1}
    assert from_first  # a conversation whose first turn was Bad's
    assert {(c, 1, "Bad") for c in from_first} <= set(superseded)
    # every superseded sample is Bad's or sits after a Bad turn of its conversation
    turn_of = dict(redone)
    assert all(t >= turn_of[c] for c, t, _p in superseded)
    assert {c for c, t, p in superseded if p == "Bad"} == set(turn_of)
    ex = specgen("export", str(run_dir), "--format", "tokens")
    assert ex.returncode == 0, ex.stderr
    rows = pq.read_table(run_dir / "exports" / "tokens.parquet").to_pylist()
    assert len(rows) == 2 * CONVS and {r["provider"] for r in rows} == {"Good"}
    ver = specgen("verify", str(run_dir))  # one sample per done task, ids as stored
    assert ver.returncode == 0, ver.stdout[-2000:] + ver.stderr[-2000:]


def test_a_multi_turn_conversation_is_redone_from_the_turn_the_excluded_provider_answered(
        tmp_path):
    handler = chat_router()
    server, handler.url = serve(handler)
    try:
        proc = exclude_bad_while_gated(tmp_path, handler)
        handler.gate.set()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        server.shutdown()
    assert proc.returncode == EXIT_OK, stderr[-3000:]
    run_dir = tmp_path / "run-dir"
    check_multi_turn_redone(run_dir, handler, sessions=1)  # in the same session
    assert "redone: " in stdout


def test_a_kill_before_the_redo_leaves_it_to_the_next_start(tmp_path):
    handler = chat_router()
    server, handler.url = serve(handler)
    try:
        proc = exclude_bad_while_gated(tmp_path, handler)
        proc.send_signal(signal.SIGKILL)  # the work is not done: no redo was made yet
        proc.communicate(timeout=60)
        run_dir = tmp_path / "run-dir"
        assert count(run_dir, "SELECT COUNT(*) FROM results WHERE provider='Bad'") >= 1
        handler.gate.set()
        out = run_cli(chat_config(tmp_path, handler.url))
    finally:
        server.shutdown()
    assert out.returncode == EXIT_OK, out.stderr[-3000:]
    check_multi_turn_redone(run_dir, handler, sessions=2)
    assert count(run_dir, "SELECT COUNT(*) FROM redone WHERE session=2") \
        == count(run_dir, "SELECT COUNT(*) FROM redone")


def test_a_kill_during_the_redo_and_a_rerun_do_every_task_once_from_good(tmp_path):
    handler = chat_router()
    server, handler.url = serve(handler)
    run_dir = tmp_path / "run-dir"
    try:
        proc = exclude_bad_while_gated(tmp_path, handler)
        handler.delay = 0.2  # the redo takes a while: it is killed under way
        handler.gate.set()
        wait_for(lambda: redo_made(run_dir), timeout=120, interval=0.02, what="the redo")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        st = status_json(run_dir)
        assert st["datasets"]["chat"]["pending"] >= 1  # killed with the redo under way
        before = count(run_dir, "SELECT COUNT(*) FROM superseded_results")
        handler.delay = 0.0
        out = run_cli(chat_config(tmp_path, handler.url))
    finally:
        server.shutdown()
    assert out.returncode == EXIT_OK, out.stderr[-3000:]
    check_multi_turn_redone(run_dir, handler, sessions=2)
    # the rerun finished the redo; it made none again
    assert count(run_dir, "SELECT COUNT(*) FROM redone WHERE session=2") == 0
    assert count(run_dir, "SELECT COUNT(*) FROM superseded_results") == before


def redo_made(run_dir) -> bool:
    try:
        return count(run_dir, "SELECT COUNT(*) FROM redone") > 0
    except Exception:  # noqa: BLE001 - the table comes with the store
        return False
