"""A `Retry-After` that reaches into another day names the day (third reliability audit):
`specgen run` against a server answering 429 with `Retry-After: 86400` stops (exit 5) saying
until which date and time."""

from __future__ import annotations

import re
import time
from http.server import BaseHTTPRequestHandler

from test_engine_support import prompt_rows, run_cli, serve, write_config, write_jsonl


def test_a_day_long_retry_after_names_the_date(tmp_path):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, status, body, extra=()):
            self.send_response(status)
            for k, v in extra:
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802
            self._send(404, b'{"error": {"message": "no"}}')

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(429, b'{"error": {"message": "slow down", "code": 429}}',
                       [("Retry-After", "86400")])

    server, url = serve(H)
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(3))
        path = write_config(tmp_path, url,
                            [{"name": "a", "path": "a.jsonl"}],
                            endpoint="fetch_endpoints = false")
        res = run_cli(path, timeout=120)
    finally:
        server.shutdown()
    out = res.stdout + res.stderr
    assert res.returncode == 5, out[-3000:]
    tomorrow = time.strftime("%Y-%m-%d", time.localtime(time.time() + 86400))
    assert re.search(rf"until {tomorrow} \d\d:\d\d:\d\d", out), out[-3000:]
