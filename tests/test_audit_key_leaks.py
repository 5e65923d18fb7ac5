"""The API key never leaks from an error, however a server echoes it (third reliability
audit): masked before any cut, in every field, header and message — the key split at every
position by the cuts (message, error_type, raw, a redirect's Location, the body cap) — in the
client's error building and in a real `specgen run` (attempts.error, status --json,
report.html)."""

from __future__ import annotations

import json
import secrets
import sqlite3
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from specgen.client.errors import Redactor, error_from_response
from specgen.client.parse import StreamParser
from test_engine_support import ENV, SPECGEN, config_text, write_jsonl

KEY = "sk-or-v1-" + secrets.token_hex(32)  # 73 characters, like OpenRouter's


def leaks(text: str, key: str = KEY, window: int = 8) -> list[str]:
    """Every piece of the key at least `window` long found in `text`."""
    return [key[i:i + window] for i in range(len(key) - window + 1)
            if key[i:i + window] in text]


def error_body(pad: int) -> bytes:
    return json.dumps({"error": {
        "message": "x" * pad + KEY + " was refused",
        "code": 400,
        "metadata": {"provider_name": "P", "error_type": "e" * (pad % 70) + KEY,
                     "raw": {"detail": "r" * pad + KEY}}}}).encode()


def test_every_cut_position_is_masked_in_the_built_error():
    red = Redactor(KEY)
    for pad in range(0, 420):
        err = red.error(error_from_response(400, {}, error_body(pad), redact=red))
        seen = " ".join([err.message, json.dumps(err.body), str(err.args)])
        assert not leaks(seen), (pad, seen)
        # a body cut at the cap mid-key (not JSON any more: its snippet is the message)
        cut = error_body(pad)[: 300 + pad % 80]
        err = red.error(error_from_response(400, {}, cut, truncated=True, redact=red))
        assert not leaks(err.message + json.dumps(err.body)), (pad, err.message)
        # a redirect whose Location carries the key
        loc = {"Location": "https://h.example/" + "p" * pad + "?k=" + KEY}
        err = red.error(error_from_response(302, loc, b"", redact=red))
        assert not leaks(err.message), (pad, err.message)


def test_a_stream_error_chunk_echoing_the_key_is_masked_at_every_cut():
    red = Redactor(KEY)
    for pad in range(0, 420, 3):
        p = StreamParser()
        chunk = {"error": {"message": "m" * pad + KEY,
                           "metadata": {"error_type": "t" * (pad % 70) + KEY}}}
        p.feed(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        assert p.failed
        err = red.error(p.failure())
        assert not leaks(err.message + json.dumps(err.body)), (pad, err.message)


class EchoServer:
    """Answers every chat request with an error echoing the key, the key further along each
    time (so the cuts split it at every position); every 5th request a 302 to a URL with it."""

    def __init__(self):
        self.n = 0
        lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                self._send(404, b'{"error": {"message": "no"}}')

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    outer.n += 1
                    n = outer.n
                if n % 5 == 0:
                    self._send(302, b"", {"Location": "https://evil.example/" + "q" * n
                                          + "/" + KEY})
                else:
                    self._send(400, error_body(230 + n))

            def _send(self, status, body, headers=None):
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


def test_a_real_run_against_a_server_echoing_the_key_leaks_none_of_it(tmp_path):
    srv = EchoServer()
    try:
        write_jsonl(tmp_path / "a.jsonl", [{"id": f"r{i}", "messages": [
            {"role": "user", "content": f"q {i}"}]} for i in range(90)])
        cfg = tmp_path / "run.toml"
        cfg.write_text(config_text(tmp_path / "run-dir", srv.url,
                                   [{"name": "a", "path": str(tmp_path / "a.jsonl")}],
                                   endpoint="concurrency = 4\nfetch_endpoints = false"))
        env = {**ENV, "SPECGEN_TEST_KEY": KEY}
        res = subprocess.run([*SPECGEN, "run", str(cfg), "--no-live"], capture_output=True,
                             text=True, timeout=300, env=env)
        assert res.returncode in (4, 0), res.stderr[-3000:]
        assert srv.n >= 90
    finally:
        srv.server.shutdown()
    run_dir = tmp_path / "run-dir"
    status = subprocess.run([*SPECGEN, "status", str(run_dir), "--json"], capture_output=True,
                            text=True, timeout=120, env=env)
    report = subprocess.run([*SPECGEN, "report", str(run_dir)], capture_output=True,
                            text=True, timeout=120, env=env)
    assert report.returncode == 0, report.stderr[-2000:]
    db = sqlite3.connect(run_dir / "state.sqlite")
    errors = " ".join(str(e) for (e,) in db.execute("SELECT error FROM attempts"))
    assert "REDACTED" in errors
    events = " ".join(str(d) for (d,) in db.execute("SELECT detail FROM events"))
    tasks = " ".join(str(e) for (e,) in db.execute("SELECT error FROM tasks"))
    html = (run_dir / "report.html").read_text()
    log = (run_dir / "specgen.log").read_text() if (run_dir / "specgen.log").exists() else ""
    for where, text in (("attempts.error", errors), ("events", events), ("tasks", tasks),
                        ("status --json", status.stdout), ("report.html", html),
                        ("stdout", res.stdout), ("stderr", res.stderr), ("log", log)):
        assert not leaks(text), (where, leaks(text)[:3])
