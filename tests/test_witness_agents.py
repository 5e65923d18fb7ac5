"""The count witness on agent traffic as real providers count it (../shared/reference/
openrouter-api.md, "A larger sample: 316 recorded answers"). A small HTTP server written here
(no specgen code in it) renders every request with the *official* Kimi K2.5 template and
tokenizer, answers every request with a tool call (with reasoning on even questions, empty
reasoning on odd ones), and counts as the recorded providers do:

* completion: one fewer for tool-call answers, two fewer with reasoning too (a counting offset
  per answer form: plain 0, tools −1, reasoning −1, both −2); a third of the calls served with
  compact arguments while the count is of the model's spaced form;
* prompt: its own rendering of the tools block (−40), and of each earlier turn of the
  conversation (−6 per assistant or tool message: the delta moves with the history), and no
  default system prompt when the request has none.

And two relays that corrupt: one adds a token to 60% of the answers' text and passes the honest
counts; one reports counts alternately one over and one under.
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from official_kimi import OfficialKimi
from specgen.engine.status import run_status
from specgen.export import ExportOptions, export_run
from specgen.store import Store
from test_engine_sim import go
from test_engine_support import write_jsonl
from test_witness_providers import Handler as JsonHandler
from test_witness_providers import (
    kimi_config,
    official,  # noqa: F401 - the fixture
)


@pytest.fixture(scope="module")
def kimi(official):  # noqa: F811 - the imported fixture, by name
    """The official K2.5 template and tokenizer (test_witness_providers' fixture)."""
    return official


LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look an item up in the catalogue.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                    "limit": {"type": "integer"}},
                   "required": ["query"]}}}
FORM_OFFSET = {"plain": 0, "tools": -1, "reasoning": -1, "reasoning+tools": -2}
TOOLS_RENDERING, PER_TURN = -40, -6


class Provider(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, kimi: OfficialKimi, mode: str):
        super().__init__(("127.0.0.1", 0), Handler)
        self.official = kimi
        self.mode = mode  # "agent" | "relay" (60% one token added) | "alternate" (±1)
        self.errors: list[str] = []
        self.corrupted: set[int] = set()  # question numbers whose text the relay changed
        self.lock = threading.Lock()


def number(messages: list[dict]) -> int:
    first = next(m for m in messages if m["role"] == "user")
    return int(first["content"].rsplit(" ", 1)[1])


class Handler(JsonHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        try:
            self._send(200, self._answer(body))
        except Exception as exc:  # noqa: BLE001 - the test reads it
            self.server.errors.append(repr(exc))
            self._send(400, {"error": {"code": 400, "message": repr(exc)}})

    def _answer(self, body: dict) -> dict:
        srv: Provider = self.server
        off = srv.official
        # thinking as OpenRouter asks for it, or as a vLLM/SGLang server is told
        thinking = bool((body.get("reasoning") or {}).get("enabled")
                        or (body.get("chat_template_kwargs") or {}).get("thinking"))
        messages, tools = body["messages"], body.get("tools")
        n = number(messages)
        prompt = off.ids(messages, tools, add_generation_prompt=True, thinking=thinking)
        if srv.mode == "agent":
            args = {"query": f"item {n}", "limit": n % 5 + 1,
                    "fields": ["name", "price", "stock"]}
            reasoning = (f"I should look item {n} up." if n % 2 == 0 else "") \
                if thinking else None
            model = {"role": "assistant", "content": "", "tool_calls": [
                {"id": "functions.lookup:0", "type": "function",
                 "function": {"name": "lookup", "arguments": json.dumps(args)}}]}
            if reasoning is not None:
                model["reasoning_content"] = reasoning
            served = json.loads(json.dumps(model))
            if n % 3 == 0:  # served compactly, counted in the model's spaced form
                served["tool_calls"][0]["function"]["arguments"] = json.dumps(
                    args, separators=(",", ":"))
            form = ("reasoning+tools" if reasoning else "tools")
        else:
            model = {"role": "assistant", "content": f"The answer to question {n} is {n * 7}."}
            served = dict(model)
            form = "plain"
        full = off.ids([*messages, model], tools, add_generation_prompt=False,
                       thinking=thinking)
        assert full[:len(prompt)] == prompt, "the answer does not extend the prompt"
        completion = len(full) - len(prompt)
        if srv.mode == "agent":
            completion += FORM_OFFSET[form]
            history = sum(m["role"] in ("assistant", "tool") for m in messages)
            system = any(m["role"] == "system" for m in messages)
            reported = len(prompt) + TOOLS_RENDERING + PER_TURN * history + (
                0 if system else -off_default_system(off, messages, tools, thinking))
        else:
            reported = len(prompt)
            if srv.mode == "relay" and n % 5 < 3:  # the relay adds a token to the text
                served["content"] = model["content"] + " Indeed"
                more = off.ids([*messages, served], tools, add_generation_prompt=False,
                               thinking=thinking)
                assert len(more) == len(full) + 1, "the relay's addition is not one token"
                with srv.lock:
                    srv.corrupted.add(n)
            elif srv.mode == "alternate":
                completion += 1 if n % 2 else -1
        message = {k: v for k, v in served.items() if k != "role"}
        if "reasoning_content" in message:
            message["reasoning"] = message.pop("reasoning_content")
        return {"id": f"gen-{n}", "object": "chat.completion", "model": body["model"],
                "provider": "AgentHost", "created": 1,
                "choices": [{"index": 0, "message": {"role": "assistant", **message},
                             "finish_reason": "tool_calls" if model.get("tool_calls")
                             else "stop"}],
                "usage": {"prompt_tokens": reported, "completion_tokens": completion,
                          "total_tokens": reported + completion}}


def off_default_system(off: OfficialKimi, messages, tools, thinking) -> int:
    """How many ids the official template's default system prompt adds (this provider
    leaves it out, as Moonshot's platform does)."""
    with_empty = [{"role": "system", "content": ""}, *messages]
    return len(off.ids(messages, tools, add_generation_prompt=True, thinking=thinking)) - len(
        off.ids(with_empty, tools, add_generation_prompt=True, thinking=thinking))


def agent_rows(n: int) -> list[dict]:
    """Multi-turn agent conversations: 1 to 3 earlier tool calls and results (with their
    reasoning), the last assistant turn the one asked for; every fourth without a system
    prompt."""
    out = []
    for i in range(n):
        messages = [] if i % 4 == 3 else [
            {"role": "system", "content": "You are a catalogue agent. Use the tools."}]
        messages.append({"role": "user", "content": f"Find what I need for task {i}"})
        for k in range(i % 3 + 1):
            args = json.dumps({"query": f"step {k} of {i}"})
            messages.append({"role": "assistant", "content": "", "reasoning_content":
                             f"Step {k}: search.", "tool_calls": [
                                 {"id": f"functions.lookup:{k}", "type": "function",
                                  "function": {"name": "lookup", "arguments": args}}]})
            messages.append({"role": "tool", "tool_call_id": f"functions.lookup:{k}",
                             "content": f"result {k} for task {i}: " + "found. " * (k + i % 5)})
        messages.append({"role": "assistant", "content": "Done."})
        out.append({"id": f"a{i}", "tools": [LOOKUP], "messages": messages})
    return out


def plain_rows(n: int) -> list[dict]:
    return [{"id": f"p{i}", "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": f"What is seven times {i}"}]} for i in range(n)]


def run(tmp_path, kimi, mode: str, rows: list[dict], reasoning: bool,
        quality: str = "") -> tuple:
    server = Provider(kimi, mode)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        write_jsonl(tmp_path / "d.jsonl", rows)
        path = kimi_config(
            tmp_path, server,
            [{"name": "d", "path": "d.jsonl", "format": "openai"}],
            endpoint="stream = false\nfetch_endpoints = false\nreturn_token_ids = false\n"
                     "concurrency = 4\nmax_attempts = 2",
            sampling=f"max_tokens = 512\nreasoning = {str(reasoning).lower()}", extra=quality)
        cfg, outcome = go(path)
    finally:
        server.shutdown()
        server.server_close()
    assert not server.errors, server.errors[:3]
    return cfg, outcome, server


def test_an_agent_dataset_learns_each_forms_offset_and_keeps_its_right_answers(
        tmp_path, kimi):
    rows = agent_rows(32)
    cfg, outcome, _ = run(tmp_path, kimi, "agent", rows, reasoning=True)
    assert outcome.state == "finished" and outcome.exit_code == 0, outcome
    with Store.open(cfg.run_dir) as s:
        got = list(s.iter_results())
        (quarantined,) = s.conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()
    assert quarantined == 0  # every answer is right: none quarantined
    # every assistant turn of every conversation is asked for (its history the row's)
    assert len(got) == sum(m["role"] == "assistant" for r in rows for m in r["messages"])
    kept = [r for r in got if r.count_check in ("exact", "repaired")]
    assert len(kept) >= 0.95 * len(got), sorted((r.count_check, r.completion_check,
                                                  r.completion_delta) for r in got)
    offsets: dict[str, set[int]] = {}
    for r in got:
        n = int(r.request["messages"][1 if r.request["messages"][0]["role"] == "system"
                                       else 0]["content"].rsplit(" ", 1)[1])
        form = "reasoning+tools" if n % 2 == 0 else "tools"
        if n % 3 == 0:  # compact arguments: repaired to the model's spaced form
            assert r.count_check == "repaired" and "count:arguments_spaced" in r.repairs
            assert r.message["tool_calls"][0]["function"]["arguments"] == json.dumps(
                {"query": f"item {n}", "limit": n % 5 + 1,
                 "fields": ["name", "price", "stock"]})
        else:  # the delta is the form's counting offset
            assert r.count_check == "exact", (n, r.count_check, r.completion_delta)
            offsets.setdefault(form, set()).add(r.completion_delta)
        assert r.completion_check in ("exact", "repaired")
        # the prompt side is recorded: the history moves the delta, it decides nothing
        assert r.prompt_check in ("history", "default_system", "rendering"), r.prompt_check
    # each form's counting offset is the server's: these counts are one (two) fewer on every
    # answer, which a counting offset and the forms without the section end explain alike;
    # the sampled forms explain no more answers, so the counting offset stands
    assert offsets == {f: {FORM_OFFSET[f]} for f in ("tools", "reasoning+tools")}, offsets
    deltas = {r.prompt_delta for r in got}
    assert len(deltas) > 3  # the delta moves with the conversation
    witness = run_status(cfg.run_dir).get("count_witness") or {}
    forms = (witness.get("AgentHost") or {}).get("completion", {}).get("forms", {})
    if forms:  # the live figures of the finished session
        assert {f: {v["offset"]} for f, v in forms.items()} == offsets
    # exports: everything, and a prompt-side filter
    out = tmp_path / "all.jsonl"
    export_run(cfg.run_dir, ExportOptions(format="tokens", jsonl=True, out=out))
    assert len(out.read_text().splitlines()) == len(kept)
    manifest = json.loads(out.with_name("all.jsonl.manifest.json").read_text())
    assert sum(manifest["totals"]["prompt_checks"].values()) == len(kept)
    only = tmp_path / "history.jsonl"
    export_run(cfg.run_dir, ExportOptions(format="tokens", jsonl=True, out=only,
                                          prompt_checks=("history",)))
    exported = [json.loads(line) for line in only.read_text().splitlines()]
    assert exported and {e["prompt_check"] for e in exported} == {"history"}
    assert len(exported) == sum(r.prompt_check == "history" for r in kept)


def test_a_relay_corrupting_most_answers_is_never_learnt(tmp_path, kimi):
    rows = plain_rows(60)
    cfg, outcome, server = run(tmp_path, kimi, "relay", rows, reasoning=False)
    assert outcome.exit_code != 0, outcome  # most answers unvouched: not a success
    assert server.corrupted
    with Store.open(cfg.run_dir) as s:
        got = list(s.iter_results())
        events = [d for (d,) in s.conn.execute(
            "SELECT detail FROM events WHERE kind IN ('form_unverified', 'alarm')")]
    exact = [r for r in got if r.count_check in ("exact", "repaired")]
    corrupted = [r for r in exact
                 if int(r.request["messages"][1]["content"].rsplit(" ", 1)[1])
                 in server.corrupted]
    assert not corrupted, [(r.count_check, r.completion_delta) for r in corrupted]
    assert any("AgentHost" in (d or "") and "split" in (d or "") for d in events), events
    out = tmp_path / "t.jsonl"
    export_run(cfg.run_dir, ExportOptions(format="tokens", jsonl=True, out=out))
    rows_out = [json.loads(line) for line in out.read_text().splitlines()] \
        if out.exists() else []
    assert not any(e.get("count_check") == "exact" for e in rows_out)


def test_alternating_counts_let_nothing_through_as_exact(tmp_path, kimi):
    rows = plain_rows(50)  # more than the unverifiable alarm's 40: it stops the run
    cfg, outcome, _ = run(tmp_path, kimi, "alternate", rows, reasoning=False)
    with Store.open(cfg.run_dir) as s:
        checks = dict(s.conn.execute("SELECT count_check, COUNT(*) FROM results GROUP BY 1"))
    assert "exact" not in checks and "repaired" not in checks, checks
    assert outcome.exit_code != 0, outcome
