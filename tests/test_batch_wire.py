"""`mode = "batch"` beyond the OpenAI shape (docs/batch.md), in real processes:

* `batch_api = "openrouter"` (the lines inline in one JSON submission, the results in
  cursor pages): a batch run's samples equal a live run's, id for id; the simulator serves
  the shape;
* `kill -9` while the results are being downloaded and stored (both shapes): a small
  independent server here sends half the results, holds the rest and says so, the test kills
  the run, and a rerun collects the rest with no second submission, every line stored once;
* the ETA of each running batch (and overall) from the provider's `request_counts`, in
  `status --json`, the live figures, the progress line and the report's timeline.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from email.parser import BytesParser

import pytest

from specgen.batch_queries import batch_eta
from test_batch import BATCH, live_batches, samples, sim_stats, sim_text
from test_engine_support import (
    SPECGEN,
    check_store,
    count,
    live_status,
    multi_turn_rows,
    prompt_rows,
    run_cli,
    start_cli,
    status_json,
    wait_for,
    write_config,
    write_jsonl,
)
from test_sim_support import SimProcess

OPENROUTER = BATCH + 'batch_api = "openrouter"\n'


def test_openrouter_batch_run_equals_live_run_id_for_id(tmp_path):
    (tmp_path / "sim.toml").write_text(sim_text())
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(20))
    write_jsonl(tmp_path / "m.jsonl", multi_turn_rows(8))
    datasets = [{"name": "a", "path": "a.jsonl"},
                {"name": "m", "path": "m.jsonl", "turns": "all"}]
    extra = '[sim]\nconfig = "sim.toml"\nseed = 11\n'
    live = write_config(tmp_path, "sim", datasets, name="live", endpoint="stream = false\n",
                        sampling="max_tokens = 4096\n" + extra)
    batch = write_config(tmp_path, "sim", datasets, name="batch", endpoint=OPENROUTER,
                         sampling="max_tokens = 4096\n" + extra)
    for path in (live, batch):
        out = run_cli(path, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
    a, b = samples(tmp_path / "live-dir"), samples(tmp_path / "batch-dir")
    assert len(a) == 20 + 8 * 2
    assert a == b  # the same samples, id for id
    run_dir = tmp_path / "batch-dir"
    assert count(run_dir, "SELECT COUNT(*) FROM batches") >= 2  # a batch per round
    assert count(run_dir, "SELECT COUNT(*) FROM batches WHERE state != 'completed' "
                          "OR input_file_id IS NOT NULL") == 0  # inline: no file uploaded
    check_store(run_dir)


def test_preview_shows_the_openrouter_request_item(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(2))
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}], endpoint=OPENROUTER)
    out = subprocess.run([*SPECGEN, "preview", str(path), "--json", "-n", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    item = json.loads(out.stdout)["datasets"][0]["samples"][0]["body"]
    assert set(item) == {"custom_id", "body"}  # no method/url: an item of `requests`
    assert item["body"]["stream"] is False and item["body"]["model"] == "moonshotai/kimi-k2.5"


def test_sim_serves_the_openrouter_batch_shape(tmp_path):
    sim = SimProcess(tmp_path, sim_text(processing=0.5))
    try:
        body = {"model": "moonshotai/kimi-k2.5", "max_tokens": 200, "stream": False,
                "messages": [{"role": "user", "content": "hello"}]}
        submit = {"endpoint": "/v1/chat/completions", "model": "moonshotai/kimi-k2.5",
                  "completion_window": "24h", "metadata": {"specgen_batch": "tag-or"},
                  "provider": {"only": ["moonshotai"]},
                  "requests": [{"custom_id": f"c{i}", "body": body} for i in range(5)]}
        status, _, raw = sim.request("POST", "/api/v1/batches", submit)
        assert status == 202, raw
        b = json.loads(raw)
        assert b["status"] == "validating" and b["request_counts"]["total"] == 5
        assert b["model"] == "moonshotai/kimi-k2.5" and b["input_file_id"] is None
        listed = json.loads(sim.request("GET", "/api/v1/batches?limit=10")[2])
        assert [x["metadata"] for x in listed["data"]] == [{"specgen_batch": "tag-or"}]

        def get():
            return json.loads(sim.request("GET", f"/api/v1/batches/{b['id']}")[2])
        wait_for(lambda: get()["status"] == "completed", timeout=30)
        got, cursor = [], None
        while True:  # pages of 2: 2, 2, 1
            q = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
            page = json.loads(sim.request("GET", f"/api/v1/batches/{b['id']}/results{q}")[2])
            got += page["data"]
            if not page["has_more"]:
                assert page["next_cursor"] is None
                break
            cursor = page["next_cursor"]
        assert sorted(x["custom_id"] for x in got) == [f"c{i}" for i in range(5)]
        assert all(x["response"]["status_code"] == 200 for x in got)
        # one model per batch; a cancel ends it `cancelled`
        wrong = {**submit, "requests": [{"custom_id": "x", "body": {**body, "model": "m2"}}]}
        assert sim.request("POST", "/api/v1/batches", wrong)[0] == 400
        status, _, raw = sim.request("POST", "/api/v1/batches", submit)
        second = json.loads(raw)["id"]
        assert sim.request("POST", f"/api/v1/batches/{second}/cancel", {})[0] == 200
        wait_for(lambda: json.loads(sim.request("GET", f"/api/v1/batches/{second}")[2])[
            "status"] == "cancelled", timeout=30)
        stats = sim_stats(sim)["batches"]
        assert stats["submitted"] == 2 and stats["cancelled"] == 1 and stats["files"] == 1
    finally:
        sim.stop()


# -- an independent batch server: both shapes, a held download, a known progress rate ---------
class SlowBatchServer:
    """Both batch shapes under /v1 on 127.0.0.1, every line answered with a canned completion.

    `hold`: the first download of a batch's results sends half of them (openai: the first
    half of the output file's bytes; openrouter: the first page), sets `half_sent`, and holds
    the rest until `release` is set. `rate`: a batch answers this many lines a second (its
    `request_counts` grow with the time since it was created) until `release` is set, then
    it is done; None: done when first read.
    It counts submissions and downloads and keeps each submission's top-level keys."""

    def __init__(self, *, hold: bool = False, rate: float | None = None):
        import http.server

        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict] = {}
        self.results: dict[str, list[bytes]] = {}
        self.submissions = 0
        self.downloads = 0
        self.heads: list[list[str]] = []
        self.hold, self.rate = hold, rate
        self.half_sent, self.release = threading.Event(), threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, obj=None, raw=None):
                data = raw if raw is not None else json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/files":
                    msg = BytesParser().parsebytes(
                        b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n"
                        + body)
                    parts = {p.get_param("name", header="content-disposition"): p.get_payload(
                        decode=True) for p in msg.get_payload()}
                    fid = f"in-{len(outer.files)}"
                    outer.files[fid] = parts["file"]
                    return self.reply(200, {"id": fid})
                if self.path == "/v1/batches":
                    return outer.create(self, json.loads(body))
                if self.path.endswith("/cancel"):
                    b = outer.batches[self.path.split("/")[3]]
                    b["status"] = "cancelled"
                    return self.reply(200, b)
                return self.reply(404, {"error": {"message": "no such path"}})

            def do_GET(self):
                path, _, query = self.path.partition("?")
                parts = path.strip("/").split("/")
                if path == "/v1/batches":
                    return self.reply(200, {"data": list(outer.batches.values())[::-1],
                                            "has_more": False})
                if parts[:2] == ["v1", "batches"] and len(parts) == 3:
                    return self.reply(200, outer.progress(outer.batches[parts[2]]))
                if parts[:2] == ["v1", "batches"] and parts[3:] == ["results"]:
                    return outer.page(self, parts[2], "cursor=" in query)
                if parts[:2] == ["v1", "files"] and parts[3:] == ["content"]:
                    return outer.content(self, parts[2])
                return self.reply(404, {"error": {"message": "no such path"}})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def create(self, h, req: dict) -> None:
        self.submissions += 1
        inline = "requests" in req
        if inline:
            self.heads.append(list(req))
            items = req["requests"]
        else:
            items = [json.loads(x) for x in self.files[req["input_file_id"]].splitlines()]
        bid = f"job-{len(self.batches)}"
        self.results[bid] = [json.dumps({"id": f"r-{i['custom_id']}", "custom_id": i[
            "custom_id"], "error": None, "response": {"status_code": 200, "body": {
                "id": "x", "model": i["body"]["model"], "choices": [{
                    "index": 0, "finish_reason": "stop", "message": {
                        "role": "assistant",
                        "content": "Answer to: " + i["body"]["messages"][-1]["content"]}}]}}}
        ).encode() for i in items]
        now = time.time()
        self.batches[bid] = {"id": bid, "status": "validating", "metadata": req.get("metadata"),
                             "created_at": now, "in_progress_at": now, "output_file_id": None,
                             "request_counts": {"total": len(items), "completed": 0,
                                                "failed": 0}}
        h.reply(202 if inline else 200, self.batches[bid])

    def progress(self, b: dict) -> dict:
        total = b["request_counts"]["total"]
        if b["status"] in ("validating", "in_progress"):
            done = total if self.rate is None or self.release.is_set() else min(
                total - 1, int((time.time() - b["created_at"]) * self.rate))
            b["request_counts"]["completed"] = done
            b["status"] = "in_progress" if done < total else "completed"
            if done == total:
                b["output_file_id"] = f"out-{b['id']}"
        return b

    def content(self, h, fid: str) -> None:
        rows = self.results[fid.removeprefix("out-")]
        data = b"".join(line + b"\n" for line in rows)
        self.downloads += 1
        held = self.hold and self.downloads == 1
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        cut = sum(len(line) + 1 for line in rows[:len(rows) // 2]) if held else len(data)
        h.wfile.write(data[:cut])
        h.wfile.flush()
        if held:
            self.half_sent.set()
            self.release.wait(120)
            try:
                h.wfile.write(data[cut:])
            except OSError:  # the client was killed meanwhile
                pass

    def page(self, h, bid: str, later: bool) -> None:
        rows = self.results[bid]
        half = len(rows) // 2
        if not later:  # the first page
            self.downloads += 1
            return h.reply(200, raw=b'{"object":"list","data":[' + b",".join(rows[:half])
                           + b'],"has_more":true,"next_cursor":"p2"}')
        if self.hold and self.downloads == 1:
            self.half_sent.set()
            self.release.wait(120)
        try:
            h.reply(200, raw=b'{"object":"list","data":[' + b",".join(rows[half:])
                    + b'],"has_more":false,"next_cursor":null}')
        except OSError:  # the client was killed meanwhile
            pass

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()


def server_config(tmp_path, server: SlowBatchServer, api: str, n: int, endpoint: str = ""):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(n))
    path = write_config(tmp_path, server.url, [{"name": "a", "path": "a.jsonl"}],
                        endpoint=BATCH + f'batch_api = "{api}"\nfetch_endpoints = false\n'
                        'api_key_env = ""\n' + endpoint)
    path.write_text(path.read_text().replace('api_key_env = "SPECGEN_TEST_KEY"\n', ""))
    return path


@pytest.mark.parametrize("api", ["openai", "openrouter"])
def test_kill_9_while_storing_results_then_rerun_collects_the_rest(tmp_path, api):
    server = SlowBatchServer(hold=True)
    try:
        path = server_config(tmp_path, server, api, 40, 'dialect = "openrouter"\n'
                             'provider = { only = ["moonshotai"] }\n')
        run_dir = tmp_path / "run-dir"
        proc = start_cli(path)
        try:
            assert server.half_sent.wait(120), "the run never read half the results"
            wait_for(lambda: count(run_dir, "SELECT COUNT(*) FROM results"), timeout=60,
                     what="a result of the first half stored")
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
        stored = count(run_dir, "SELECT COUNT(*) FROM results")
        assert 1 <= stored <= 20  # killed while storing: only the half sent can be in
        server.release.set()
        out = run_cli(path, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert server.submissions == 1  # never submitted again
        assert server.downloads == 2  # the rerun read the results again
        assert count(run_dir, "SELECT COUNT(*) FROM results") == 40
        assert count(run_dir, "SELECT COUNT(DISTINCT conversation || ':' || turn) "
                              "FROM results") == 40  # every line stored exactly once
        assert count(run_dir, "SELECT COUNT(*) FROM tasks WHERE status='done'") == 40
        assert count(run_dir, "SELECT COUNT(*) FROM batch_lines") == 40
        check_store(run_dir)
        if api == "openrouter":  # endpoint and model before the requests, one provider
            assert server.heads[0][:2] == ["endpoint", "model"]
            assert server.heads[0][-1] == "requests" and "provider" in server.heads[0]
    finally:
        server.stop()


def test_batch_eta_arithmetic():
    # 25 of 100 lines in 10 s: 75 more take 30 s, 4 s of which have passed since the poll
    assert batch_eta(100, 25, since=1000.0, polled=1010.0, now=1014.0) == 26.0
    assert batch_eta(100, 0, since=1000.0, polled=1010.0, now=1010.0) is None
    assert batch_eta(100, 25, since=None, polled=1010.0, now=1010.0) is None
    assert batch_eta(100, 25, since=1000.0, polled=1010.0, now=2000.0) == 0.0


@pytest.mark.parametrize("api", ["openai", "openrouter"])
@pytest.mark.timing
def test_eta_of_each_running_batch_from_the_providers_progress(tmp_path, api):
    server = SlowBatchServer(rate=1.0)  # 40 lines: 40 s, unless released
    try:
        path = server_config(tmp_path, server, api, 40)
        run_dir = tmp_path / "run-dir"
        proc = start_cli(path)
        try:
            def running():
                figures = live_status(run_dir).get("batches") or {}
                shown = [b for b in figures.get("running", []) if b["eta_s"] is not None
                         and 3 <= b["completed"] < 30]
                return shown and (figures, shown)
            figures, shown = wait_for(running, timeout=120, what="a batch with an ETA")
            b = shown[0]
            assert b["state"] == "in_progress" and b["provider_id"] == "job-0"
            # the lines left at the provider's rate (a poll seen late on a loaded machine makes
            # the measured rate lower, the ETA longer: a ratio up to 3 allows it)
            assert 0 < b["eta_s"] * server.rate <= 3 * (40 - b["completed"]), b
            assert figures["eta_s"] == max(x["eta_s"] for x in figures["running"]
                                           if x["eta_s"] is not None)
            live = wait_for(lambda: live_batches(run_dir).get("eta_by_batch"), timeout=60,
                            what="the live figures' ETA per batch")
            assert list(live) == [b["id"]]
            report = subprocess.run([*SPECGEN, "report", str(run_dir), "--text"],
                                    capture_output=True, text=True, timeout=120)
            assert report.returncode == 0, report.stderr
            row = next(line for line in report.stdout.splitlines() if b["id"] in line)
            assert re.search(r"in_progress.*\d+s\s*\|?\s*$", row), row
            server.release.set()
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        assert proc.returncode == 0, out + err
        assert re.search(r"batch ETA \d+s \(sg-\w+ \d+s\)", out + err)  # the progress line
        done = status_json(run_dir)["batches"]
        assert done["running"] == [] and done["eta_s"] is None
        assert server.submissions == 1
    finally:
        server.stop()
