"""A sample's text is never rewritten to hide a secret (issue 33): an answer quoting the API
key or a proxy credential is quarantined `secret_in_answer`, stored masked, counted and
alarmed, in live and batch mode alike; a short placeholder key (`x`) is never searched for, so
it rewrites and quarantines nothing.

The servers are small and written here: a chat endpoint and an OpenAI-shaped Batch API whose
answers echo the request's `Authorization` header for some prompts."""

from __future__ import annotations

import json
import secrets
import sqlite3
import subprocess
import threading
import zlib
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from test_engine_support import ENV, SPECGEN, prompt_rows, run_cli, write_config, write_jsonl

KEY = "sk-or-v1-" + secrets.token_hex(32)
ECHO_EVERY = 3  # prompts whose number is a multiple of this get the header echoed


def completion(content: str, model: str = "moonshotai/kimi-k2.5", provider: str = "Echo"
               ) -> dict:
    return {"id": "gen-1", "model": model, "provider": provider, "choices": [{
        "index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": content}}]}


def answer_to(messages: list[dict], auth: str | None) -> str:
    """`translate_text x` keeps an "x" and a tool-like name in every answer (a key `x` must
    leave them alone); prompts numbered by a multiple of ECHO_EVERY quote the header."""
    prompt = messages[-1]["content"]
    number = int(prompt.split()[1].rstrip(":"))
    text = f"Answer to: {prompt} (translate_text x)"
    if number % ECHO_EVERY == 0:
        text += f" -- your request said Authorization: {auth}"
    return text


class EchoApi:
    """Chat completions (non-stream) and an OpenAI-shaped Batch API on 127.0.0.1; `provider`
    names the provider of every answer, `batch_prefix` starts every batch id."""

    def __init__(self, provider: str = "Echo", batch_prefix: str = "job-"):
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict] = {}
        self.chats = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, obj=None, raw=None):
                data = raw if raw is not None else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                auth = self.headers.get("Authorization")
                if self.path == "/v1/chat/completions":
                    outer.chats += 1
                    req = json.loads(body)
                    return self.reply(200, completion(answer_to(req["messages"], auth),
                                                      req["model"], provider))
                if self.path == "/v1/files":
                    msg = BytesParser().parsebytes(
                        b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n"
                        + body)
                    parts = {p.get_param("name", header="content-disposition"):
                             p.get_payload(decode=True) for p in msg.get_payload()}
                    fid = f"in-{len(outer.files)}"
                    outer.files[fid] = parts["file"]
                    return self.reply(200, {"id": fid})
                if self.path == "/v1/batches":
                    req = json.loads(body)
                    bid = f"{batch_prefix}{len(outer.batches)}"
                    lines = [json.loads(x) for x in outer.files[req["input_file_id"]].splitlines()]
                    out = b"".join(json.dumps({
                        "id": f"r-{i['custom_id']}", "custom_id": i["custom_id"], "error": None,
                        "response": {"status_code": 200, "body": completion(
                            answer_to(i["body"]["messages"], auth), i["body"]["model"],
                            provider)}}
                    ).encode() + b"\n" for i in lines)
                    outer.files[f"out-{bid}"] = out
                    outer.batches[bid] = {
                        "id": bid, "status": "completed", "metadata": req.get("metadata"),
                        "output_file_id": f"out-{bid}", "created_at": 1, "in_progress_at": 1,
                        "request_counts": {"total": len(lines), "completed": len(lines),
                                           "failed": 0}}
                    return self.reply(200, outer.batches[bid])
                return self.reply(404, {"error": {"message": "no such path"}})

            def do_GET(self):  # noqa: N802
                parts = [unquote(p) for p in self.path.partition("?")[0].strip("/").split("/")]
                if parts == ["v1", "batches"]:
                    return self.reply(200, {"data": list(outer.batches.values())[::-1],
                                            "has_more": False})
                if parts[:2] == ["v1", "batches"] and len(parts) == 3:
                    return self.reply(200, outer.batches[parts[2]])
                if parts[:2] == ["v1", "files"] and parts[3:] == ["content"]:
                    return self.reply(200, raw=outer.files[parts[2]])
                return self.reply(404, {"error": {"message": "no such path"}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()


@pytest.fixture
def api():
    server = EchoApi()
    yield server
    server.stop()


BATCH = ('mode = "batch"\nbatch_poll_interval = 0.2\nbatch_linger_s = 0.3\n'
         'concurrency = 500\n')


def run(tmp_path: Path, api: EchoApi, key: str, mode: str, n: int = 12,
        on_alarm: str = "warn") -> tuple[subprocess.CompletedProcess, Path]:
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(n))
    endpoint = "fetch_endpoints = false\nstream = false\n" + (BATCH if mode == "batch" else "")
    path = write_config(tmp_path, api.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint=endpoint, extra=f'[quality]\non_alarm = "{on_alarm}"\n')
    out = run_cli(path, timeout=300, env={"SPECGEN_TEST_KEY": key})
    return out, tmp_path / "run-dir"


def store_text(run_dir: Path) -> str:
    """Every value of every table of the store, zlib blobs unpacked: what a sweep reads."""
    db = sqlite3.connect(run_dir / "state.sqlite")
    parts: list[str] = []
    try:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in db.execute(f"SELECT * FROM {table}"):  # noqa: S608 - our own names
                for value in row:
                    if isinstance(value, bytes):
                        try:
                            value = zlib.decompress(value)
                        except zlib.error:
                            pass
                        value = value.decode("utf-8", "replace")
                    parts.append(str(value))
    finally:
        db.close()
    return "\n".join(parts)


def exports(run_dir: Path, tmp_path: Path) -> str:
    texts = []
    for fmt in ("openai", "specforge"):
        out_path = tmp_path / f"export-{fmt}"
        res = subprocess.run([*SPECGEN, "export", str(run_dir), "--format", fmt, "-o",
                              str(out_path)], capture_output=True, text=True, timeout=120,
                             env=ENV)
        assert res.returncode == 0, res.stderr[-2000:]
        texts += [res.stdout, res.stderr]
        files = [out_path] if out_path.is_file() else sorted(out_path.rglob("*"))
        texts += [f.read_text() for f in files if f.is_file()]
    return "\n".join(texts)


@pytest.mark.parametrize("mode", ["live", "batch"])
def test_an_answer_quoting_the_key_is_quarantined_masked_never_a_sample(tmp_path, api, mode):
    out, run_dir = run(tmp_path, api, KEY, mode)
    echoed = [i for i in range(12) if i % ECHO_EVERY == 0]
    assert out.returncode == 0, out.stdout + out.stderr  # the others are samples
    db = sqlite3.connect(run_dir / "state.sqlite")
    reasons = [r for (r,) in db.execute("SELECT reason FROM quarantine")]
    messages = [json.loads(m)["content"] for (m,) in db.execute("SELECT message FROM results")]
    alarms = [d for (d,) in db.execute("SELECT detail FROM events WHERE kind = 'alarm'")]
    noted = db.execute("SELECT COUNT(*) FROM events WHERE kind = 'secret_in_answer'").fetchone()
    stored = [json.loads(zlib.decompress(r)) for (r,) in db.execute(
        "SELECT response FROM quarantine")]
    db.close()
    assert reasons and set(reasons) == {"secret_in_answer"}
    assert len(messages) == 12 - len(echoed)  # every clean answer kept, untouched
    assert all(m.endswith("(translate_text x)") for m in messages)
    assert all("[REDACTED]" in s["content"] for s in stored)  # the stored copy is masked
    assert alarms and "secret_in_answer" in alarms[0]
    assert noted[0] >= 1
    status = subprocess.run([*SPECGEN, "status", str(run_dir), "--json"], capture_output=True,
                            text=True, timeout=120, env=ENV)
    assert "secret_in_answer" in status.stdout
    log = (run_dir / "specgen.log").read_text()
    sweep = {"store": store_text(run_dir), "log": log, "stdout": out.stdout,
             "stderr": out.stderr, "status": status.stdout, "exports": exports(run_dir, tmp_path)}
    leaked = [where for where, text in sweep.items() if KEY in text or KEY[12:40] in text]
    assert not leaked


def test_a_one_character_key_rewrites_and_quarantines_nothing(tmp_path, api):
    out, run_dir = run(tmp_path, api, "x", "live")
    assert out.returncode == 0, out.stdout + out.stderr
    db = sqlite3.connect(run_dir / "state.sqlite")
    messages = [json.loads(m)["content"] for (m,) in db.execute("SELECT message FROM results")]
    quarantined = db.execute("SELECT COUNT(*) FROM quarantine").fetchone()[0]
    db.close()
    assert len(messages) == 12 and quarantined == 0
    assert not any("REDACTED" in m for m in messages)
    assert all("(translate_text x)" in m for m in messages)
    assert sum(m.endswith("Authorization: Bearer x") for m in messages) == 4


def test_the_alarm_stops_a_run_by_default(tmp_path, api):
    out, run_dir = run(tmp_path, api, KEY, "live", on_alarm="stop")
    assert out.returncode != 0
    assert "secret_in_answer" in out.stdout + out.stderr
    assert KEY not in out.stdout + out.stderr


def test_the_client_never_rewrites_an_answers_text_and_masks_its_metadata():
    from specgen.client.errors import Redactor
    from specgen.client.secrets import mask_answer, mask_metadata, quoted
    from specgen.client.types import ChatResponse, RawToolCall

    red = Redactor(KEY, ("user:p4ssw0rd-long",))
    resp = ChatResponse(content=f"quote {KEY}", reasoning="fine", reasoning_field=None,
                        tool_calls=[RawToolCall(0, "call_1", "translate_text",
                                                '{"t": "user:p4ssw0rd-long"}')],
                        finish_reason="stop", native_finish_reason=None,
                        provider=f"P {KEY}", model="m", id="g")
    mask_metadata(resp, red)
    assert resp.provider == "P [REDACTED]" and resp.masked == ["provider"]
    assert resp.content == f"quote {KEY}"  # the sample's text is the stage's to judge
    assert quoted(resp, red) == ["provider", "content", "tool_calls[0].arguments"]
    mask_answer(resp, red)
    assert resp.content == "quote [REDACTED]"
    assert resp.tool_calls[0].arguments == '{"t": "[REDACTED]"}'
    # short secrets: never searched for in answers; under 4 characters never masked
    short = Redactor("x")
    assert short.text("x marks the spot") == "x marks the spot"
    assert not short.quoted_in("x")
    assert Redactor("EMPTY").text("EMPTY") == "[REDACTED]"
    assert not Redactor("EMPTY").quoted_in("EMPTY")


def test_a_batch_result_naming_the_key_as_its_provider_leaks_it_nowhere(tmp_path):
    # the provider field is metadata: masked as the answer arrives, before provider
    # statistics, the log or the store see it (live mode's mask_metadata, one code path)
    leaky = EchoApi(provider=f"Relay {KEY}")
    try:
        out, run_dir = run(tmp_path, leaky, KEY, "batch")
    finally:
        leaky.stop()
    live = run_dir / "live.json"
    assert live.is_file()
    db = sqlite3.connect(run_dir / "state.sqlite")
    providers = {p for (p,) in db.execute("SELECT provider FROM results")}
    reasons = {r for (r,) in db.execute("SELECT reason FROM quarantine")}
    db.close()
    assert reasons == {"secret_in_answer"}  # every answer quotes it: none is a sample
    sweep = {"store": store_text(run_dir), "log": (run_dir / "specgen.log").read_text(),
             "live.json": live.read_text(), "stdout": out.stdout, "stderr": out.stderr}
    leaked = [where for where, text in sweep.items() if KEY in text or KEY[12:40] in text]
    assert not leaked
    assert providers <= {"Relay [REDACTED]"}
    assert "Relay [REDACTED]" in sweep["live.json"]
