"""Helpers for the engine tests: a real `specgen sim` process, run configs, store checks.

(No tests here; the module is imported by test_engine_*.py / test_run_*.py.)
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from specgen.store import Store, unpack_ids
from test_sim_support import SimProcess

REPO = Path(__file__).resolve().parents[1]


def hostile_bench():
    """bench/hostile.py as a module (its servers and answer builders), loaded once."""
    return bench_module("hostile")


def bench_module(stem: str):
    """bench/<stem>.py as a module, loaded once."""
    import importlib.util

    name = f"specgen_bench_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{stem}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
def wrong_model_sim(tmp: Path, slug: str, head: str = "") -> SimProcess:
    """A simulator process (named "mixed") whose one provider, Mixed (fp8), answers 40% of the
    requests as model `slug`; `head`: more of its config's top-level lines."""
    return SimProcess(tmp, f"""
wrong_model_slug = "{slug}"
{head}
[[providers]]
name = "Mixed"
tag = "mixed/fp8"
quantization = "fp8"
quirks = {{ wrong_model = 0.4 }}
""", name="mixed")


SPECGEN = [sys.executable, "-m", "specgen"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    """A small independent HTTP server written in a test, on 127.0.0.1 in a daemon thread:
    (the server, to `shutdown()`; its `/v1` base URL)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    with path.open("w") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def prompt_rows(n: int, prefix: str = "p") -> list[dict]:
    return [{"id": f"{prefix}{i}", "messages": [
        {"role": "user", "content": f"Question {i}: explain item {i} in one short paragraph."}]}
        for i in range(n)]


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def tool_rows(n: int) -> list[dict]:
    """Conversations with tools and a recorded tool loop (call, result, final answer)."""
    rows = []
    for i in range(n):
        rows.append({"id": f"t{i}", "tools": [WEATHER_TOOL], "messages": [
            {"role": "user", "content": f"What is the weather in city {i}?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "functions.get_weather:0", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps({"city": f"c{i}"})}}]},
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."}]})
    return rows


def multi_turn_rows(n: int) -> list[dict]:
    return [{"id": f"m{i}", "messages": [
        {"role": "user", "content": f"Hi {i}"}, {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Tell me more."}, {"role": "assistant", "content": "Sure."}]}
        for i in range(n)]


def config_text(run_dir: Path, base_url: str, datasets: list[dict[str, Any]], *,
                endpoint: str = "", extra: str = "", sampling: str = "max_tokens = 4096") -> str:
    defaults = {"concurrency": "16", "retry_base_delay": "0.01", "retry_max_delay": "0.05",
                "max_attempts": "30", "api_key_env": '"SPECGEN_TEST_KEY"'}
    ep_defaults = _defaults(defaults, endpoint)
    eng_defaults = _defaults({"commit_interval": "0.05", "heartbeat_interval": "0.5",
                              "log_interval": "1.0"}, extra)
    ds = ""
    for d in datasets:
        ds += "[[dataset]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in d.items())
    return f"""run_dir = {json.dumps(str(run_dir))}
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
base_url = {json.dumps(base_url)}
{ep_defaults}{endpoint}
[sampling]
{sampling}
[engine]
{eng_defaults}{extra}
{ds}"""


def _defaults(defaults: dict[str, str], given_text: str) -> str:
    """Default `key = value` lines for the keys `given_text` does not set before a table."""
    head = given_text if not given_text.startswith("[") else ""
    head = head.split("\n[", 1)[0]
    given = {line.split("=", 1)[0].strip() for line in head.splitlines() if "=" in line}
    return "".join(f"{k} = {v}\n" for k, v in defaults.items() if k not in given)


def write_config(tmp: Path, base_url: str, datasets: list[dict[str, Any]], name: str = "run",
                 **kw: Any) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(config_text(tmp / f"{name}-dir", base_url, datasets, **kw))
    return path


def run_cli(config: Path, *args: str, timeout: float = 120, env: dict | None = None
            ) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECGEN, "run", str(config), "--no-live", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**ENV, **(env or {})})


def start_cli(config: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*SPECGEN, "run", str(config), "--no-live", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, **(env or {})})


def stop_run(run_dir: Path, proc: subprocess.Popen
             ) -> tuple[subprocess.CompletedProcess, str, str]:
    """`specgen stop run_dir` as its own process, then the run's end: (the stop, the run's
    stdout, the run's stderr)."""
    stop = subprocess.run([*SPECGEN, "stop", str(run_dir)], capture_output=True, text=True,
                          timeout=90)
    out, err = proc.communicate(timeout=60)
    return stop, out, err


def status_json(run_dir: Path) -> dict[str, Any]:
    out = subprocess.run([*SPECGEN, "status", str(run_dir), "--json"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def live_status(run_dir: Path) -> dict[str, Any]:
    """status --json, or {} while the run has not created its store yet."""
    if not (run_dir / "state.sqlite").exists():
        return {}
    return status_json(run_dir)


def wait_for(cond, timeout: float = 60, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def count(run_dir: Path, sql: str, args: tuple = ()) -> int:
    """A read-only count from the store (0 when the store does not exist yet)."""
    path = run_dir / "state.sqlite"
    if not path.exists():
        return 0
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return int(conn.execute(sql, args).fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def results_snapshot(run_dir: Path) -> dict[int, tuple]:
    """{task: (conversation, turn, input_ids bytes, n_prompt)} of the committed results."""
    path = run_dir / "state.sqlite"
    if not path.exists():
        return {}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return {r[0]: r[1:] for r in conn.execute(
            "SELECT task, conversation, turn, input_ids, n_prompt FROM results")}
    except sqlite3.OperationalError:
        return {}
    finally:
        conn.close()


def check_store(run_dir: Path, vocab: int | None = None) -> dict[str, int]:
    """Invariants every run store must hold; returns a few counts.

    * each task has at most one result and a result exactly when it is done;
    * no conversation twice (dataset, conv_id), no task twice (conversation, turn);
    * results' ids are valid: n_prompt within the sample, ids inside the vocabulary;
    * every dataset's rows_read = source rows admitted + invalid + duplicate + other-shard rows.
    """
    with Store.open(run_dir) as store:
        c = store.conn
        assert c.execute("SELECT COUNT(*) FROM (SELECT task FROM results GROUP BY task "
                         "HAVING COUNT(*) > 1)").fetchone()[0] == 0
        done_without = c.execute(
            "SELECT COUNT(*) FROM tasks t WHERE t.status='done' AND NOT EXISTS "
            "(SELECT 1 FROM results r WHERE r.task=t.id)").fetchone()[0]
        result_not_done = c.execute(
            "SELECT COUNT(*) FROM results r JOIN tasks t ON t.id=r.task "
            "WHERE t.status != 'done'").fetchone()[0]
        orphan = c.execute("SELECT COUNT(*) FROM results r WHERE NOT EXISTS "
                           "(SELECT 1 FROM tasks t WHERE t.id=r.task)").fetchone()[0]
        assert (done_without, result_not_done, orphan) == (0, 0, 0)
        for ds, rows_read, inv, dup, other in c.execute(
                "SELECT name, rows_read, rows_invalid, rows_duplicate, rows_other_shard "
                "FROM datasets"):
            # source rows admitted: a dataset's n samples of a prompt share its row
            n = c.execute("SELECT COUNT(DISTINCT row_index) FROM conversations WHERE dataset=?",
                          (ds,)).fetchone()[0]
            assert rows_read == n + inv + dup + other, (ds, rows_read, n, inv, dup, other)
        n_results = 0
        for ids_blob, n_prompt, tp, tc in c.execute(
                "SELECT input_ids, n_prompt, true_prompt_ids, true_completion_ids FROM results"):
            ids = unpack_ids(ids_blob)
            assert 0 < n_prompt < len(ids)
            true_ids = (unpack_ids(tp) or []) + (unpack_ids(tc) or [])
            if vocab is not None:
                assert max(ids) < vocab and all(i < vocab for i in true_ids)
            n_results += 1
        tasks = dict(c.execute("SELECT status, COUNT(*) FROM tasks GROUP BY status"))
    return {"results": n_results, **tasks}
