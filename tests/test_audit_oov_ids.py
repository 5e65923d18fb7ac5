"""Out-of-vocabulary ids in token-in mode are a quarantine reason with a message, not a
traceback per answer (third reliability audit): a real `specgen run` in `mode = "tokens"`
against a small vLLM-like server whose sampled ids are outside the tokenizer's vocabulary."""

from __future__ import annotations

import json
import sqlite3
from http.server import BaseHTTPRequestHandler

from specgen.render import get_renderer
from specgen.tokenizer import load_tokenizer
from test_engine_support import prompt_rows, run_cli, serve, write_config, write_jsonl


def test_out_of_vocabulary_ids_are_quarantined_without_a_traceback(tmp_path):
    stop = min(get_renderer("kimi-k2.5", load_tokenizer("demo"), thinking=True).stop_token_ids)

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            n = len(body.get("prompt") or [])
            out = json.dumps({"id": "cmpl-1", "model": "moonshotai/kimi-k2.5", "choices": [
                {"index": 0, "token_ids": [17, 4_000_000_000, stop], "finish_reason": "stop",
                 "text": ""}], "usage": {"prompt_tokens": n, "completion_tokens": 3}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server, url = serve(H)
    try:
        write_jsonl(tmp_path / "a.jsonl", prompt_rows(4))
        path = write_config(tmp_path, url,
                            [{"name": "a", "path": "a.jsonl"}],
                            endpoint='mode = "tokens"\ntoken_api = "vllm"\nstream = false\n'
                                     "fetch_endpoints = false")
        res = run_cli(path)
    finally:
        server.shutdown()
    out = res.stdout + res.stderr
    # every answer quarantined: the run is unproductive (exit 6), not a crash
    assert res.returncode == 6, out[-3000:]
    assert "Traceback" not in out
    assert "ids_out_of_vocab" in out
    db = sqlite3.connect(tmp_path / "run-dir" / "state.sqlite")
    reasons = {r for (r,) in db.execute("SELECT reason FROM quarantine")}
    assert reasons == {"ids_out_of_vocab"}, reasons
