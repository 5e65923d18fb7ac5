"""The count witness against a provider that looks like the real ones: a small HTTP server
written here (no specgen code in it) renders every request with the *official* Kimi K2.5
template and tokenizer (../shared/models/kimi-k2.5), reports `prompt_tokens` with its own
rendering of the tool declarations (+9 for a two-tool add/multiply block, -21 for a one-tool
block: a constant per request shape) and answers with compact `{"a":2,"b":3}` arguments while
its `completion_tokens` counts the model's spaced form. Every sample must be kept as
`repaired`, its prompt delta recorded, and no verdict left pending."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import model_path
from official_kimi import OfficialKimi
from specgen.engine.status import run_status
from specgen.export import ExportOptions, export_run
from specgen.export.snapshot import read_snapshot
from specgen.report.stats import collect
from specgen.store import Store
from test_engine_sim import go
from test_engine_support import SPECGEN, run_cli, write_config, write_jsonl

ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
MULTIPLY = {"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
# how this provider declares tools: a constant per tools block
RENDERING = {("add", "multiply"): 9, ("add",): -21}


@pytest.fixture(scope="module")
def official():
    path = model_path("kimi-k2.5")
    if not (path / "chat_template.jinja").exists():
        pytest.skip(f"official chat_template.jinja not found in {path}")
    return OfficialKimi(path / "chat_template.jinja", path / "tiktoken.model",
                        path / "tokenizer_config.json", path / "tool_declaration_ts.py")


# Providers as recorded on a two-tool request whose official rendering is 209 tokens
# (../shared/reference/openrouter-api.md, "Usage counts on real traffic"): Moonshot AI 124,
# DeepInfra 171, Groq 201, Fireworks 210, SiliconFlow 216, Together 218 — and other constants
# on a one-tool request. One of them also counts one token more on the completion side (a
# stop token), which only plain answers can teach.
MANY = {"Moonshot AI": (-85, -40), "DeepInfra": (-38, -21), "Groq": (-8, 2),
        "Fireworks": (1, -1), "SiliconFlow": (7, 29), "Together": (9, -21)}
COUNTS_STOP = {"Fireworks": 1}


class Provider(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, official: OfficialKimi, many: bool = False):
        super().__init__(("127.0.0.1", 0), Handler)
        self.official = official
        self.many = many  # the provider answering is chosen by the question's number
        self.prompts: list[tuple[int, int]] = []  # (official prompt ids, reported)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        self._send(404, {"error": {"code": 404, "message": "not here"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self.path.endswith("/chat/completions") or body.get("stream"):
            self._send(400, {"error": {"code": 400, "message": "non-stream chat only"}})
            return
        off: OfficialKimi = self.server.official
        messages, tools = body["messages"], body.get("tools")
        prompt = off.ids(messages, tools, add_generation_prompt=True, thinking=False)
        names = tuple(t["function"]["name"] for t in tools or ())
        provider, rendering, stop = "Together", RENDERING.get(names, 0), 0
        if self.server.many:
            number = int(messages[-1]["content"].rsplit(" ", 1)[1].rstrip(")"))
            provider = sorted(MANY)[number % len(MANY)]
            two, one = MANY[provider]
            rendering = {2: two, 1: one}.get(len(names), 0)
            stop = COUNTS_STOP.get(provider, 0)
        if tools:  # the model's spaced arguments, served compactly
            spaced = {"role": "assistant", "content": "", "tool_calls": [
                {"id": "functions.add:0", "type": "function",
                 "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]}
            served = {"role": "assistant", "content": "", "tool_calls": [
                {"id": "functions.add:0", "type": "function",
                 "function": {"name": "add", "arguments": '{"a":2,"b":3}'}}]}
        else:
            spaced = served = {"role": "assistant", "content": "It is 5."}
        full = off.ids([*messages, spaced], tools, add_generation_prompt=False, thinking=False)
        assert full[:len(prompt)] == prompt
        reported = len(prompt) + rendering
        completion = len(full) - len(prompt) + stop
        self.server.prompts.append((len(prompt), reported))
        self._send(200, {
            "id": f"gen-{len(self.server.prompts)}", "object": "chat.completion",
            "model": body["model"], "provider": provider, "created": 1,
            "choices": [{"index": 0, "finish_reason": "tool_calls" if tools else "stop",
                         "message": {"role": "assistant", **{k: v for k, v in served.items()
                                                             if k != "role"}}}],
            "usage": {"prompt_tokens": reported, "completion_tokens": completion,
                      "total_tokens": reported + completion}})

    def _send(self, status: int, payload: dict):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def kimi_config(tmp_path, server, datasets: list[dict], **kw) -> object:
    """`write_config` for a run against `server` with the real K2.5 tokenizer."""
    path = write_config(tmp_path, f"http://127.0.0.1:{server.server_address[1]}/v1", datasets,
                        **kw)
    path.write_text(path.read_text().replace('tokenizer = "demo"',
                                             f'tokenizer = "{model_path("kimi-k2.5")}"'))
    return path


def rows(n: int) -> list[dict]:
    out = []
    for i in range(n):
        tools = [ADD, MULTIPLY] if i % 3 else [ADD]
        out.append({"id": f"r{i}", "tools": tools, "messages": [
            {"role": "system", "content": "You are a calculator. Use the tools."},
            {"role": "user", "content": f"What is 2 + 3? (question {i})"}]})
    return out


def test_a_real_answer_is_kept_whatever_the_providers_rendering(tmp_path, official):
    server = Provider(official)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        write_jsonl(tmp_path / "calc.jsonl", rows(9))
        path = kimi_config(
            tmp_path, server,
            [{"name": "calc", "path": "calc.jsonl", "format": "openai"}],
            endpoint="stream = false\nfetch_endpoints = false\nreturn_token_ids = false",
            sampling="max_tokens = 512\nreasoning = false")
        cfg, outcome = go(path)
    finally:
        server.shutdown()
        server.server_close()
    assert outcome.state == "finished", outcome
    with Store.open(cfg.run_dir) as s:
        got = list(s.iter_results())
        (quarantined,) = s.conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()
    assert quarantined == 0 and len(got) == 9
    for r in got:
        names = tuple(t["function"]["name"] for t in r.request["tools"])
        assert r.n_prompt in {n for n, _ in server.prompts}  # ours is the official prompt
        assert r.count_check == "repaired", (r.count_check, r.repairs)
        assert "count:arguments_spaced" in r.repairs
        assert r.completion_check == "repaired" and r.completion_delta == 3
        assert (r.prompt_check, r.prompt_delta) == ("rendering", RENDERING[names])
        assert r.prompt_tokens == r.n_prompt + RENDERING[names]
        call = r.message["tool_calls"][0]["function"]["arguments"]
        assert call == '{"a": 2, "b": 3}'  # the model's own form, as the count says
    assert len({r.prompt_shape for r in got}) == 2  # one shape per tools block
    # status shows both sides per provider
    sides = run_status(cfg.run_dir)["providers"]["Together"]["witness_sides"]
    assert sides == {"prompt": {"rendering": 9}, "completion": {"repaired": 9},
                     "prompt_deltas": {"+9": 6, "-21": 3}}
    # and the report, per provider
    with read_snapshot(cfg.run_dir) as store:
        stats = collect(store)
    (together,) = [p for p in stats.providers if p["provider"] == "Together"]
    assert together["witness_sides"] == sides
    # and the exports: each sample's two sides
    out = tmp_path / "t.jsonl"
    export_run(cfg.run_dir, ExportOptions(format="tokens", jsonl=True, out=out))
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(exported) == 9
    assert {(e["prompt_check"], e["completion_check"], e["completion_delta"])
            for e in exported} == {("rendering", "repaired", 3)}
    assert sorted(e["prompt_delta"] for e in exported) == [-21] * 3 + [9] * 6
    # the manifest counts both sides per provider, like status
    manifest = json.loads(out.with_name("t.jsonl.manifest.json").read_text())
    assert manifest["totals"]["witness_sides"] == {"Together": sides}
    # and verify, per provider (JSON and text)
    from specgen.verify import format_report, verify_run

    report = verify_run(cfg.run_dir)
    (pc,) = report.to_json()["providers"]
    assert pc["witness_sides"] == sides
    assert "witness sides: prompt rendering 9 · completion repaired 9 · deltas +9 ×6, -21 ×3" \
        in format_report(report)


def many_rows(n: int) -> list[dict]:
    """Question i goes to provider i % 6: two-tool, one-tool and plain (no tools) requests,
    the plain ones after the first tool ones, so that the tool answers of every provider
    arrive before its counting offset is learnt."""
    out = []
    for i in range(n):
        kind = (i // len(MANY)) % 3
        tools = [[ADD, MULTIPLY], [ADD], None][kind] if i < 4 * len(MANY) else None
        row = {"id": f"r{i}", "messages": [
            {"role": "system", "content": "You are a calculator. Use the tools."},
            {"role": "user", "content": f"What is 2 + 3? (question {i})"}]}
        if tools:
            row["tools"] = tools
        out.append(row)
    return out


def run_many(tmp_path, official, name: str, order: list[dict], concurrency: int) -> tuple:
    server = Provider(official, many=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        write_jsonl(tmp_path / f"{name}.jsonl", order)
        path = kimi_config(
            tmp_path, server,
            [{"name": "calc", "path": f"{name}.jsonl", "format": "openai"}], name=name,
            endpoint="stream = false\nfetch_endpoints = false\nreturn_token_ids = false\n"
                     f"concurrency = {concurrency}",
            sampling="max_tokens = 512\nreasoning = false")
        done = run_cli(path, timeout=300)  # a real `specgen run` process
    finally:
        server.shutdown()
        server.server_close()
    return path, done


def verdicts(run_dir) -> dict[str, tuple]:
    """Per question: the sample's final verdicts and ids."""
    with Store.open(run_dir) as s:
        return {r.request["messages"][-1]["content"]: (
            r.provider, r.count_check, r.prompt_check, r.completion_check, r.prompt_delta,
            r.completion_delta, bytes(r.input_ids) if isinstance(r.input_ids, bytes | bytearray)
            else tuple(r.input_ids)) for r in s.iter_results()}


def test_every_right_answer_is_kept_whatever_each_providers_deltas_and_arrival_order(
        tmp_path, official):
    # six providers, each its own prompt rendering per tools block, one counting the stop
    # token: every tool answer arrives before its provider's offset is learnt (it waits,
    # pending, and is judged again once 5 plain answers taught the offset, or at the end)
    questions = many_rows(4 * len(MANY) + 5 * len(MANY))
    path, done = run_many(tmp_path, official, "forward", questions, concurrency=4)
    assert done.returncode == 0, done.stderr[-3000:]
    first = verdicts(tmp_path / "forward-dir")
    assert len(first) == len(questions)
    for question, (provider, check, p_check, c_check, dp, dc, _) in first.items():
        number = int(question.rsplit(" ", 1)[1].rstrip(")"))
        row = questions[number]
        tools = row.get("tools")
        assert check in ("exact", "repaired"), (question, provider, check, p_check, c_check)
        if tools:  # compact arguments, counted in the model's spaced form
            assert c_check == "repaired" and dc == 3 + COUNTS_STOP.get(provider, 0)
            want = MANY[provider][0 if len(tools) == 2 else 1]
            assert dp == want and p_check == ("exact" if want == 0 else "rendering")
        else:
            assert c_check == "exact" and dc == COUNTS_STOP.get(provider, 0)
            assert dp == 0 and p_check == "exact"
    with Store.open(tmp_path / "forward-dir") as s:
        (quarantined,) = s.conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()
        pending = s.conn.execute("SELECT COUNT(*) FROM results WHERE count_check='pending' "
                                 "OR prompt_check='pending' OR completion_check='pending'"
                                 ).fetchone()[0]
    assert quarantined == 0 and pending == 0
    # status (a separate process) agrees with the store: every sample counted by its final
    # verdict, none pending
    out = subprocess.run([*SPECGEN, "status", str(tmp_path / "forward-dir"), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    st = json.loads(out.stdout)
    checks = {}
    for prov in st["providers"].values():
        for k, n in (prov.get("count_checks") or {}).items():
            checks[k] = checks.get(k, 0) + n
    assert checks == {"exact": sum(v[1] == "exact" for v in first.values()),
                      "repaired": sum(v[1] == "repaired" for v in first.values())}
    # the same answers in the other order, one at a time: the same verdicts, the same ids
    path, done = run_many(tmp_path, official, "backward", questions[::-1], concurrency=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert verdicts(tmp_path / "backward-dir") == first
