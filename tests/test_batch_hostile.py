"""Batch mode under a hostile provider and hostile proxies (docs/batch.md, "When the provider
misbehaves"), each against an adversarial Batch API written here (both shapes: OpenAI-style
files, OpenRouter's inline lines and cursor pages) and a real CONNECT proxy that records
what it receives and can refuse (tests/proxy_server.py), in real `specgen run` processes:

* the API key never reaches a proxy, a refused tunnel is an outage (exit 5, key masked);
* a paid answer beats an error line for the same custom_id; a transient 404 poll is not a
  lost batch; malformed poll fields are errors of that poll, never of the watcher;
* every wait is bounded: unreadable results, a results cursor that never advances, polls
  that fail, an outage, a restart while the API (or its batch list) is down;
* and a sweep: no run dir, log, export or command output holds the key or a proxy credential.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sqlite3
import ssl
import subprocess
import threading
import uuid
from email.parser import BytesParser
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from proxy_server import ProxyServer
from test_client_streams import tls_files  # noqa: F401  (a fixture)
from test_engine_support import (
    SPECGEN,
    check_store,
    count,
    prompt_rows,
    run_cli,
    start_cli,
    wait_for,
    write_config,
    write_jsonl,
)

KEY = "sk-or-v1-hostile" + uuid.uuid4().hex  # the API key: must appear nowhere
PROXY_USER, PROXY_PASSWORD = "alice", "proxy-pass-" + uuid.uuid4().hex[:12]
SECRETS = (KEY, PROXY_PASSWORD, "YWxpY2U6cHJveHktcGFzcy")  # the last: base64 of "alice:proxy-pass-"
ENV = {"SPECGEN_TEST_KEY": KEY}
CLEAN = {k: "" for k in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY",
                         "http_proxy", "HTTPS_PROXY", "https_proxy")}
BATCH = ('mode = "batch"\nbatch_poll_interval = 0.1\nbatch_linger_s = 0.3\n'
         'fetch_endpoints = false\nmax_attempts = 3\n')


class HostileBatchServer:
    """A Batch API under /v1 that misbehaves on request. `api`: "openai" (upload, create,
    poll, output/error files) or "openrouter" (inline lines, cursor pages). Faults, applied
    to the first `faulty` batches: `error_first` (an error line before each paid answer),
    `poll_404` (the first N polls answer 404), `bad_counts` (request_counts a string),
    `output_404` / `page_400` (the results cannot be read), `poll_status` (every poll
    answers it), `stuck_cursor` (the results cursor never advances), `usage` (each answer's
    usage), `batch_id` (a hostile id prefix), `hold` (never finish). Whole-server:
    `list_status` (the batch list answers it), `hide` (the list is empty), `hold_create`
    (the create answer never comes)."""

    def __init__(self, api: str = "openai", *, tls: tuple[Path, Path] | None = None,
                 faulty: int = 1, **faults):
        self.api, self.faults, self.faulty = api, faults, faulty
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict] = {}
        self.outputs: dict[str, list[bytes]] = {}
        self.polls: dict[str, int] = {}
        self.lines_submitted = 0
        self.heads: list[str] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, status, obj=None, raw=None):
                data = raw if raw is not None else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if (self.headers.get("Connection") or "").lower() == "close":
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            def handle_one(self, method):
                with outer.lock:
                    outer.heads.append(f"{method} {self.path}\n{self.headers}")
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    return self.reply(401, {"error": {"message": "no key"}})
                try:
                    status, obj, raw = outer.route(method, self.path, self.headers, body)
                except Exception as exc:  # noqa: BLE001 - a test server bug: say it
                    status, obj, raw = 599, {"error": {"message": repr(exc)}}, None
                if status == 0:  # hold: the answer never comes
                    outer.release.wait(60)
                    self.close_connection = True
                    return
                self.reply(status, obj, raw)

            def do_GET(self):
                self.handle_one("GET")

            def do_POST(self):
                self.handle_one("POST")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        scheme = "http"
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(tls[0]), str(tls[1]))
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- the API ---------------------------------------------------------------------------
    def fault(self, bid: str, name: str):
        b = self.batches.get(bid)
        if b is None or b["_n"] >= self.faulty:
            return None
        return self.faults.get(name)

    def route(self, method: str, target: str, headers, body: bytes):
        url = urlsplit(target)
        path = unquote(url.path)
        query = parse_qs(url.query)
        if method == "POST" and path == "/v1/files":
            msg = BytesParser().parsebytes(b"Content-Type: " + headers["Content-Type"].encode()
                                           + b"\r\n\r\n" + body)
            parts = {p.get_param("name", header="content-disposition"):
                     p.get_payload(decode=True) for p in msg.get_payload()}
            fid = f"file-{len(self.files)}"
            self.files[fid] = parts["file"]
            return 200, {"id": fid}, None
        if method == "POST" and path == "/v1/batches":
            if self.faults.get("hold_create"):
                req = json.loads(body)
                self.create(req, [json.loads(x) for x in self.files[req["input_file_id"]]
                                  .splitlines()] if self.api == "openai" else req["requests"])
                return 0, None, None
            req = json.loads(body)
            lines = (req["requests"] if self.api == "openrouter" else
                     [json.loads(x) for x in self.files[req["input_file_id"]].splitlines()])
            return 200, self.public(self.create(req, lines)), None
        if method == "GET" and path == "/v1/batches":
            if self.faults.get("list_status"):
                return self.faults["list_status"], {"error": {"message": "no list"}}, None
            shown = [] if self.faults.get("hide") else [
                self.public(b) for b in reversed(self.batches.values())]
            return 200, {"data": shown, "has_more": False}, None
        if path.startswith("/v1/batches/"):
            rest = path[len("/v1/batches/"):]
            if rest.endswith("/results") and self.api == "openrouter":
                return self.page(rest[:-len("/results")], query)
            return self.poll(rest)
        if method == "GET" and path.startswith("/v1/files/") and path.endswith("/content"):
            fid = path[len("/v1/files/"):-len("/content")]
            bid = fid[len("out-"):]
            if self.fault(bid, "output_404"):
                return 404, {"error": {"message": "no such file"}}, None
            return 200, None, b"".join(x + b"\n" for x in self.outputs[bid])
        return 404, {"error": {"message": f"no route {method} {path}"}}, None

    def create(self, req: dict, lines: list[dict]) -> dict:
        with self.lock:
            n = len(self.batches)
            bid = f"{self.faults.get('batch_id', 'batch_')}{n}" if n < self.faulty else f"b{n}"
            self.lines_submitted += len(lines)
            b = self.batches[bid] = {"id": bid, "_n": n, "status": "validating",
                                     "metadata": req.get("metadata"), "output_file_id": None,
                                     "request_counts": {"total": len(lines), "completed": 0,
                                                        "failed": 0}}
        out = []
        for item in lines:
            cid = item["custom_id"]
            if self.fault(bid, "error_first"):
                out.append(json.dumps({"custom_id": cid, "response": None, "error": {
                    "code": "server_error", "message": "transient"}}).encode())
            text = "Answer to: " + item["body"]["messages"][-1]["content"]
            answer = {"id": "gen-" + cid, "model": item["body"]["model"], "choices": [{
                "index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": text}}]}
            if self.faults.get("usage"):
                answer["usage"] = self.faults["usage"]
            out.append(json.dumps({"custom_id": cid, "response": {
                "status_code": 200, "body": answer}}).encode())
        self.outputs[bid] = out
        return b

    def public(self, b: dict) -> dict:
        return {k: v for k, v in b.items() if not k.startswith("_")}

    def poll(self, bid: str):
        b = self.batches.get(bid)
        if b is None:
            return 404, {"error": {"message": "no such batch"}}, None
        with self.lock:
            self.polls[bid] = self.polls.get(bid, 0) + 1
            polls = self.polls[bid]
        if polls <= (self.fault(bid, "poll_404") or 0):
            return 404, {"error": {"message": "no such batch (yet)"}}, None
        if self.fault(bid, "poll_status"):
            return self.fault(bid, "poll_status"), {"error": {"message": "nope"}}, None
        if not self.fault(bid, "hold") and polls >= 2 + (self.fault(bid, "poll_404") or 0):
            n = len(self.outputs[bid])
            b.update(status="completed", request_counts={"total": n, "completed": n,
                                                         "failed": 0})
            if self.api == "openai":
                b["output_file_id"] = f"out-{bid}"
        out = self.public(b)
        if self.fault(bid, "bad_counts"):
            out["request_counts"] = "many"
            out["in_progress_at"] = "yesterday"
        return 200, out, None

    def page(self, bid: str, query: dict):
        if bid not in self.batches:
            return 404, {"error": {"message": "no such batch"}}, None
        if self.fault(bid, "page_400"):
            return 400, {"error": {"message": "bad cursor"}}, None
        items = [json.loads(x) for x in self.outputs[bid]]
        if self.fault(bid, "stuck_cursor"):
            return 200, {"data": items[:2], "has_more": True, "next_cursor": "c-same"}, None
        start = int((query.get("cursor") or ["0"])[0])
        chunk = items[start:start + 3]
        more = start + 3 < len(items)
        return 200, {"data": chunk, "has_more": more,
                     "next_cursor": str(start + 3) if more else None}, None


# -- helpers -------------------------------------------------------------------------------
def config(tmp_path, server: HostileBatchServer, n: int, endpoint: str = "",
           engine: str = "", name: str = "run") -> Path:
    write_jsonl(tmp_path / f"{name}.jsonl", prompt_rows(n, name))
    api = f'batch_api = "{server.api}"\n'
    return write_config(tmp_path, server.url, [{"name": "a", "path": f"{name}.jsonl"}],
                        name=name, endpoint=BATCH + api + endpoint, extra=engine)


def run(path: Path, *args: str, env: dict | None = None, timeout: float = 180):
    out = run_cli(path, *args, timeout=timeout, env={**CLEAN, **ENV, **(env or {})})
    OUTPUTS.append(out.stdout + out.stderr)
    return out


OUTPUTS: list[str] = []


def sweep(tmp_path: Path, *texts: str) -> None:
    """No key and no proxy credential in any file under tmp_path (run dirs, logs, exports)
    nor in any command output."""
    for text in (*texts, *OUTPUTS):
        for secret in SECRETS:
            assert secret not in text, secret
    for f in tmp_path.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            for secret in SECRETS:
                assert secret.encode() not in data, (f, secret)


def done(run_dir: Path) -> int:
    return count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status='done'")


def cli(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([*SPECGEN, *args], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **CLEAN, **ENV})
    OUTPUTS.append(out.stdout + out.stderr)
    return out


@pytest.fixture(autouse=True)
def _outputs():
    OUTPUTS.clear()
    yield
    OUTPUTS.clear()


APIS = ["openai", "openrouter"]


# -- leaks ---------------------------------------------------------------------------------
@pytest.mark.parametrize("api", APIS)
def test_connect_carries_the_proxy_credentials_and_never_the_key(tmp_path, api, tls_files):  # noqa: F811
    cert, key = tls_files
    server = HostileBatchServer(api, tls=(cert, key), faulty=0)
    try:
        with ProxyServer(PROXY_USER, PROXY_PASSWORD) as proxy:
            path = config(tmp_path, server, 6)
            out = run(path, env={"HTTPS_PROXY": proxy.url(PROXY_USER, PROXY_PASSWORD),
                                 "SSL_CERT_FILE": str(cert)})
            assert out.returncode == 0, out.stdout + out.stderr
            connects = [h for h in proxy.heads if h.startswith("CONNECT ")]
            assert connects and proxy.refused == 0
            for head in connects:
                assert "Proxy-Authorization: Basic " in head
                assert KEY not in head and "Bearer" not in head and "Authorization: B" not in \
                    head.replace("Proxy-Authorization", "")
        assert done(tmp_path / "run-dir") == 6
        assert not any("Proxy-Authorization" in h for h in server.heads)
        sweep(tmp_path)
    finally:
        server.stop()


@pytest.mark.parametrize("refusal", ["407", "502"])
@pytest.mark.parametrize("api", APIS)
def test_a_refused_tunnel_is_an_outage_with_the_key_masked(tmp_path, api, refusal):
    server = HostileBatchServer(api, faulty=0)  # never reached
    try:
        if refusal == "407":
            proxy = ProxyServer(PROXY_USER, PROXY_PASSWORD)
            proxy_url = proxy.url(PROXY_USER, "wrong-" + PROXY_PASSWORD)
        else:
            proxy = ProxyServer(refuse=502)
            proxy_url = proxy.url(PROXY_USER, PROXY_PASSWORD)
        with proxy:
            base = server.url.replace("http://", "https://")  # through a CONNECT tunnel
            path = config(tmp_path, server, 4, engine="outage_timeout = 1\n")
            path.write_text(path.read_text().replace(server.url, base))
            out = run(path, env={"HTTPS_PROXY": proxy_url})
            assert proxy.refused >= 1
            heads = "\n".join(proxy.heads)
            assert KEY not in heads and "Bearer" not in heads
        assert out.returncode == 5, out.stdout + out.stderr
        log = (tmp_path / "run-dir" / "specgen.log").read_text()
        for text in (out.stderr, log):
            assert "internal error" not in text and "Traceback" not in text
        assert "refused CONNECT" in log
        assert count(tmp_path / "run-dir", "SELECT COUNT(*) FROM tasks WHERE "
                                           "status='pending'") == 4
        sweep(tmp_path)
    finally:
        server.stop()


# -- lost paid answers ---------------------------------------------------------------------
@pytest.mark.parametrize("fault", [{"error_first": True}, {"poll_404": 2}],
                         ids=["error_line_first", "transient_404_polls"])
@pytest.mark.parametrize("api", APIS)
def test_no_paid_answer_is_lost(tmp_path, api, fault):
    """An error line before each paid answer (the same custom_id twice): the answer wins.
    404 on a batch's first polls: not lost, collected, nothing bought twice."""
    server = HostileBatchServer(api, **fault)
    try:
        out = run(config(tmp_path, server, 12))
        assert out.returncode == 0, out.stdout + out.stderr
        run_dir = tmp_path / "run-dir"
        assert done(run_dir) == 12 and len(server.batches) == 1
        assert server.lines_submitted == 12  # nothing bought twice
        assert count(run_dir, "SELECT COUNT(*) FROM batch_lines WHERE outcome='ok'") == 12
        assert count(run_dir, "SELECT COUNT(*) FROM batches WHERE state='lost'") == 0
        check_store(run_dir)
        sweep(tmp_path)
    finally:
        server.stop()


@pytest.mark.parametrize("api", APIS)
def test_malformed_poll_fields_are_errors_of_the_poll_not_the_watcher(tmp_path, api):
    server = HostileBatchServer(api, bad_counts=True)
    try:
        out = run(config(tmp_path, server, 10))
        assert out.returncode == 0, out.stdout + out.stderr
        run_dir = tmp_path / "run-dir"
        assert done(run_dir) == 10 and server.lines_submitted == 10
        log = (run_dir / "specgen.log").read_text()
        assert "internal error" not in log and "Traceback" not in out.stderr
        # a store holding a provider's junk (written by an older version): status still works
        db = sqlite3.connect(run_dir / "state.sqlite")
        db.execute("UPDATE batches SET state='in_progress', completed='many', failed='x', "
                   "in_progress_at='yesterday', lines='?'")
        db.commit()
        db.close()
        for args in (["status", str(run_dir)], ["status", str(run_dir), "--json"],
                     ["report", str(run_dir), "--text"]):
            res = cli(*args)
            assert res.returncode == 0, res.stderr
            assert "Traceback" not in res.stderr
        sweep(tmp_path)
    finally:
        server.stop()


# -- stuck or wrong: every wait bounded ----------------------------------------------------
@pytest.mark.parametrize("api,fault", [("openai", {"output_404": True}),
                                       ("openrouter", {"page_400": True}),
                                       ("openrouter", {"stuck_cursor": True}),
                                       ("openai", {"poll_status": 400}),
                                       ("openrouter", {"poll_status": 400})])
def test_a_batch_that_cannot_be_read_is_given_up_bounded(tmp_path, api, fault):
    server = HostileBatchServer(api, **fault)
    try:
        out = run(config(tmp_path, server, 8))
        assert out.returncode == 0, out.stdout + out.stderr
        run_dir = tmp_path / "run-dir"
        assert done(run_dir) == 8
        first = next(iter(server.batches))
        if "stuck_cursor" in fault:  # two lines were read before the cursor stuck
            assert server.lines_submitted == 8 + 6
        else:
            assert server.lines_submitted == 16  # the lines, once more in a later batch
        (state, detail), = sqlite3.connect(run_dir / "state.sqlite").execute(
            "SELECT state, detail FROM batches WHERE provider_id = ?", (first,)).fetchall()
        assert state == "unreadable" and "giving up" in detail, detail
        again = run(config(tmp_path, server, 8))  # a rerun does not wait on it again
        assert again.returncode == 0 and len(server.batches) == 2
        sweep(tmp_path)
    finally:
        server.stop()


@pytest.mark.parametrize("api", APIS)
def test_polling_honours_outage_timeout(tmp_path, api):
    server = HostileBatchServer(api, poll_status=503)
    try:
        out = run(config(tmp_path, server, 5, engine="outage_timeout = 1\n"))
        assert out.returncode == 5, out.stdout + out.stderr
        run_dir = tmp_path / "run-dir"
        assert "outage_timeout" in (run_dir / "specgen.log").read_text()
        assert count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status='pending'") == 5
        assert count(run_dir, "SELECT COUNT(*) FROM batches WHERE state='lost'") == 0
        server.faults.pop("poll_status")  # the API is back: the rerun collects, buys nothing
        again = run(config(tmp_path, server, 5))
        assert again.returncode == 0, again.stdout + again.stderr
        assert done(run_dir) == 5 and server.lines_submitted == 5
        sweep(tmp_path)
    finally:
        server.stop()


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("listing", ["down", "404", "hidden"])
def test_restart_with_an_unconfirmed_batch(tmp_path, api, listing):
    """kill -9 while the provider holds the create call (the batch exists, its id was never
    stored); the rerun meets a list that is down, answers 404 or hides the batch: a clean
    stop (exit 5, no traceback, session not failed), nothing sent again; once the list
    shows it, it is collected."""
    server = HostileBatchServer(api, hold_create=True, faulty=0)
    try:
        path = config(tmp_path, server, 6, engine="outage_timeout = 1\n")
        run_dir = tmp_path / "run-dir"
        proc = start_cli(path, env={**CLEAN, **ENV})
        try:
            wait_for(lambda: len(server.batches) == 1, timeout=120, what="the held create")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        server.release.set()
        server.faults.pop("hold_create")
        if listing == "down":
            server.faults["list_status"] = 503
        elif listing == "404":
            server.faults["list_status"] = 404
        else:
            server.faults["hide"] = True
        out = run(path)
        assert out.returncode == 5, out.stdout + out.stderr
        assert "Traceback" not in out.stderr
        assert server.lines_submitted == 6 and len(server.batches) == 1
        (state,) = sqlite3.connect(run_dir / "state.sqlite").execute(
            "SELECT state FROM sessions ORDER BY id DESC LIMIT 1").fetchone()
        assert state == "stopped"
        server.faults.pop("list_status", None)
        server.faults.pop("hide", None)
        again = run(path)
        assert again.returncode == 0, again.stdout + again.stderr
        assert done(run_dir) == 6 and server.lines_submitted == 6
        sweep(tmp_path)
    finally:
        server.stop()


# -- minor ---------------------------------------------------------------------------------
@pytest.mark.parametrize("api", APIS)
def test_hostile_batch_ids_are_quoted_and_never_printed_raw(tmp_path, api):
    server = HostileBatchServer(api, batch_id="evil/../\x1b[2Jid?x=1#")
    try:
        out = run(config(tmp_path, server, 5))
        assert out.returncode == 0, out.stdout + out.stderr
        assert done(tmp_path / "run-dir") == 5 and server.lines_submitted == 5
        log = (tmp_path / "run-dir" / "specgen.log").read_text()
        assert "\x1b" not in out.stderr and "\x1b" not in log
        sweep(tmp_path)
    finally:
        server.stop()


def test_absurd_usage_is_never_spend(tmp_path):
    server = HostileBatchServer("openai", usage={"prompt_tokens": 10**15,
                                                 "completion_tokens": 10**15, "cost": 1e9})
    try:
        out = run(config(tmp_path, server, 4))
        run_dir = tmp_path / "run-dir"
        (cost,) = sqlite3.connect(run_dir / "state.sqlite").execute(
            "SELECT COALESCE(SUM(cost_usd), 0) FROM totals").fetchone()
        assert cost < 1.0, cost
        assert out.returncode != 0 or done(run_dir) == 4, out.stdout + out.stderr
        sweep(tmp_path)
    finally:
        server.stop()


def test_force_new_with_a_batch_still_running_says_so(tmp_path):
    server = HostileBatchServer("openai", hold=True)
    try:
        path = config(tmp_path, server, 4)
        run_dir = tmp_path / "run-dir"
        proc = start_cli(path, env={**CLEAN, **ENV})
        try:
            wait_for(lambda: count(run_dir, "SELECT COUNT(*) FROM batches WHERE provider_id "
                                            "IS NOT NULL") == 1, timeout=120,
                     what="a submitted batch")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        server.faults.pop("hold")
        out = run(path, "--force-new")
        assert "still running at the provider" in out.stderr, out.stderr
        assert "batch_0" in out.stderr
        sweep(tmp_path)
    finally:
        server.stop()


def test_batch_price_factor_is_checked_in_every_mode(tmp_path):
    from specgen.config import ConfigError, load_config

    for mode in ("", BATCH):
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(1))
        path = write_config(tmp_path, "http://127.0.0.1:9/v1", [{"name": "a", "path": "a.jsonl"}],
                            endpoint=mode + "[budget]\nbatch_price_factor = 0.001\n")
        with pytest.raises(ConfigError, match="budget.batch_price_factor"):
            load_config(path)


def test_live_fallback_is_reserved_and_charged_at_the_live_price():
    from specgen.engine.budget import Budget, Prices

    budget = Budget(0.01, Prices(0.5e-6, 1e-6, "x0.5 batch"), live_factor=2.0)
    budget.add_dataset("a", None)
    assert budget.worst_cost(1000, 1000, live=True) == pytest.approx(2 * 1.5e-3)
    r = budget.reserve("a", 1000, 1000, live=True)
    assert r.cost == pytest.approx(3e-3)
    charged = budget.charge_usage("a", {"prompt_tokens": 1000, "completion_tokens": 1000},
                                  live=True)
    assert charged.cost_usd == pytest.approx(3e-3)
    # a cap a batch line fits under but its live retry does not
    budget2 = Budget(0.002, Prices(0.5e-6, 1e-6, "x0.5 batch"), live_factor=2.0)
    budget2.add_dataset("a", None)
    assert budget2.check("a", 1000, 1000) == "ok"
    assert budget2.check("a", 1000, 1000, live=True) == "cost_exhausted"


def test_sweep_of_a_batch_run_through_a_proxy_and_everything_made_from_it(tmp_path):
    """A batch run through an authenticating proxy (plain http: absolute-form), then every
    command that reads the run: no key and no proxy credential anywhere."""
    server = HostileBatchServer("openai", error_first=True)
    try:
        with ProxyServer(PROXY_USER, PROXY_PASSWORD) as proxy:
            path = config(tmp_path, server, 6)
            out = run(path, env={"HTTP_PROXY": proxy.url(PROXY_USER, PROXY_PASSWORD)})
            assert out.returncode == 0, out.stdout + out.stderr
            assert proxy.forwarded >= 3
        run_dir = tmp_path / "run-dir"
        for fmt in ("openai", "specforge"):
            res = cli("export", str(run_dir), "--format", fmt, "-o",
                      str(tmp_path / f"export-{fmt}.jsonl"))
            assert res.returncode == 0, res.stderr
        for args in (["status", str(run_dir)], ["status", str(run_dir), "--json"],
                     ["report", str(run_dir), "--text"], ["stats", str(run_dir)]):
            cli(*args)
        sweep(tmp_path)
    finally:
        server.stop()


# -- one code path, in process: live mode's aiohttp path and the batch client ---------------
@pytest.mark.parametrize("client", ["live", "batch"])
def test_one_path_sends_only_the_proxy_credentials_in_process(client, tls_files, monkeypatch):  # noqa: F811
    """Live mode's aiohttp requests (non-stream, GET) and the batch client both go through
    `transport.request_args`: the CONNECT head holds the proxy's credentials only; a refused
    tunnel is the same masked `unreachable` error in both."""
    import asyncio

    import aiohttp.connector

    from specgen.client import ApiError, ChatClient
    from specgen.client.batch import BatchHttp

    cert, key = tls_files
    monkeypatch.setattr(aiohttp.connector, "_SSL_CONTEXT_VERIFIED",
                        ssl.create_default_context(cafile=str(cert)))
    server = HostileBatchServer("openai", tls=(cert, key), faulty=0)

    async def call(proxy_url: str):
        if client == "live":
            async with ChatClient(server.url, api_key=KEY, stream_tick=0,
                                  env={"HTTPS_PROXY": proxy_url}) as c:
                return await c.get_json("batches")
        async with BatchHttp(server.url, api_key=KEY, proxy=proxy_url) as api:
            return [b async for b in api.list()]

    try:
        with ProxyServer(PROXY_USER, PROXY_PASSWORD) as proxy:
            asyncio.run(call(proxy.url(PROXY_USER, PROXY_PASSWORD)))
            connects = [h for h in proxy.heads if h.startswith("CONNECT ")]
            assert connects and all("Proxy-Authorization: Basic" in h and KEY not in h
                                    and "Bearer" not in h for h in connects)
            with pytest.raises(ApiError) as err:
                asyncio.run(call(proxy.url(PROXY_USER, "wrong-" + PROXY_PASSWORD)))
        assert err.value.kind == "unreachable" and "refused CONNECT: HTTP 407" in str(err.value)
        text = f"{err.value} {err.value!r} {err.value.body} {err.value.__context__!r}"
        for secret in SECRETS:
            assert secret not in text
        assert server.heads and all(f"Bearer {KEY}" in h for h in server.heads)
    finally:
        server.stop()


JUNK_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        n = int(self.path.rsplit("f-", 1)[1].split("/")[0])
        self.send_response(200)
        self.send_header("Content-Length", str(n + 3))
        self.end_headers()
        block = b"x" * 65536
        for _ in range(n // 65536):
            self.wfile.write(block)
        self.wfile.write(b"\\n{}")
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""


def test_a_huge_junk_line_is_read_in_linear_time():
    """A result file whose first line is tens of MB of junk: the line buffer is appended to,
    never copied once per chunk. Shown as a ratio inside this test, of the reading
    process's CPU time (the server is another process): for 16x the bytes a linear read
    takes ~16x, a copy per chunk ~256x; the bound is 64x."""
    import asyncio
    import sys
    import time

    from specgen.client.batch import BatchHttp

    server = subprocess.Popen([sys.executable, "-c", JUNK_SERVER], stdout=subprocess.PIPE,
                              text=True)
    port = int(server.stdout.readline())

    async def read(n: int) -> float:
        async with BatchHttp(f"http://127.0.0.1:{port}", proxy=False) as api:
            t0 = time.process_time()
            lines = [len(x) async for x in api.lines(f"f-{n}")]
            took = time.process_time() - t0
        assert lines == [n, 2]
        return took

    try:
        small = min(asyncio.run(read(4 << 20)) for _ in range(3))
        large = min(asyncio.run(read(64 << 20)) for _ in range(2))
    finally:
        server.kill()
        server.wait(30)
    print(f"CPU: 4 MB line {small:.3f}s, 64 MB line {large:.3f}s: ratio {large / small:.1f}")
    assert large / small < 64, (small, large)  # linear: ~16; a copy per chunk: ~256


@pytest.mark.parametrize("api", APIS)
def test_a_lost_batch_that_shows_up_later_is_collected_not_bought_again(tmp_path, api):
    """Polls answer 404 until the batch is taken as lost (LOST_POLLS in a row); its lines
    fail (max_attempts = 1). The provider shows the batch again: the rerun (--retry-failed)
    follows the lost batch once more and collects it; no line is submitted twice."""
    server = HostileBatchServer(api, poll_404=10**6)
    try:
        path = config(tmp_path, server, 6)
        path.write_text(path.read_text().replace("max_attempts = 3", "max_attempts = 1"))
        out = run(path)
        run_dir = tmp_path / "run-dir"
        assert out.returncode == 4, out.stdout + out.stderr
        assert count(run_dir, "SELECT COUNT(*) FROM batches WHERE state='lost'") == 1
        assert "5 polls in a row answered 404" in (run_dir / "specgen.log").read_text()
        server.faults.pop("poll_404")
        again = run(path, "--retry-failed")
        assert again.returncode == 0, again.stdout + again.stderr
        assert done(run_dir) == 6 and server.lines_submitted == 6 and len(server.batches) == 1
        sweep(tmp_path)
    finally:
        server.stop()
