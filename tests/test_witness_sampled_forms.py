"""The count witness chooses the form the model sampled (docs/quality.md, "Sampled forms").

A small HTTP server written here (no specgen code in it) renders every request with the
*official* Kimi K2.5 template and tokenizer and answers with a tool call:

* `omits`: the model leaves out `<|tool_calls_section_end|>` on four answers of five (what
  kimi-k2-0905 does on ~80% of its tool-call answers, /work/i34/FINDING-32-1.md) and the
  provider counts honestly what was sampled. The witness must adopt offset 0 for tool-call
  answers and store exactly the ids the server says it sampled.
* `azure`: the model samples the canonical form; the provider counts reasoning answers one
  fewer and reasoning + tool-call answers two fewer (Azure K2.5's counts). Kept, never a
  silent mismatch.
"""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from conftest import model_path
from official_kimi import OfficialKimi
from specgen.store import Store
from specgen.verify import verify_run
from test_engine_sim import go
from test_engine_support import write_jsonl
from test_witness_agents import Handler as AgentHandler
from test_witness_providers import (
    kimi_config,
    official,  # noqa: F401 - the fixture
)

SECTION_END = "<|tool_calls_section_end|>"
LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "Look an item up in the catalogue.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                    "limit": {"type": "integer"}},
                   "required": ["query"]}}}


@pytest.fixture(scope="module")
def kimi(official):  # noqa: F811 - the imported fixture, by name
    return official


class Provider(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, kimi: OfficialKimi, mode: str):
        super().__init__(("127.0.0.1", 0), Handler)
        self.official = kimi
        self.mode = mode
        self.errors: list[str] = []
        self.sampled: dict[int, list[int]] = {}  # question -> completion ids sampled
        self.lock = threading.Lock()


class Handler(AgentHandler):  # its POST handling; the answers are this test's
    def _answer(self, body: dict) -> dict:
        srv: Provider = self.server
        off = srv.official
        thinking = bool((body.get("reasoning") or {}).get("enabled")
                        or (body.get("chat_template_kwargs") or {}).get("thinking"))
        messages, tools = body["messages"], body.get("tools")
        n = int(messages[-1]["content"].rsplit(" ", 1)[1])
        model = {"role": "assistant", "content": f"Looking item {n} up."}
        if srv.mode == "omits" or n % 2:
            args = {"query": f"item {n}", "limit": n % 5 + 1,
                    "fields": ["name", "price", "stock"]}
            model["tool_calls"] = [{"id": "functions.lookup:0", "type": "function",
                                    "function": {"name": "lookup",
                                                 "arguments": json.dumps(args)}}]
        if thinking:
            model["reasoning_content"] = f"Item {n} is in the catalogue, I think."
        prompt_text = off.render(messages, tools, add_generation_prompt=True,
                                 thinking=thinking)
        full_text = off.render([*messages, model], tools, add_generation_prompt=False,
                               thinking=thinking)
        assert full_text.startswith(prompt_text), "the answer does not extend the prompt"
        completion = full_text[len(prompt_text):]
        assert off.encode_sampled(completion) == off.ids(
            [*messages, model], tools, add_generation_prompt=False,
            thinking=thinking)[len(off.encode(prompt_text)):]
        if thinking and not model.get("tool_calls"):
            # the template renders the last answer without tool calls as history (its
            # reasoning dropped); what the model sampled is the template's suffix branch
            # `<think>{{rc}}</think>{{content}}` after the prompt's `<think>`
            completion = (f"{model['reasoning_content']}</think>{model['content']}"
                          "<|im_end|>")
        offset = 0
        if srv.mode == "omits" and n % 5:  # the model closed the call and ended the turn
            assert completion.endswith(SECTION_END + "<|im_end|>")
            completion = completion.replace(SECTION_END, "")
        elif srv.mode == "azure":
            offset = -2 if model.get("tool_calls") else -1
        sampled = off.encode_sampled(completion)
        with srv.lock:
            srv.sampled[n] = sampled
        prompt = len(off.encode(prompt_text))
        message = {k: v for k, v in model.items() if k not in ("role", "reasoning_content")}
        if thinking:
            message["reasoning"] = model["reasoning_content"]
        return {"id": f"gen-{n}", "object": "chat.completion", "model": body["model"],
                "provider": "FormHost", "created": 1,
                "choices": [{"index": 0, "message": {"role": "assistant", **message},
                             "finish_reason": "tool_calls" if model.get("tool_calls")
                             else "stop"}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": len(sampled) + offset,
                          "total_tokens": prompt + len(sampled) + offset}}


def rows(n: int) -> list[dict]:
    return [{"id": f"q{i}", "tools": [LOOKUP], "messages": [
        {"role": "system", "content": "You are a catalogue agent."},
        {"role": "user", "content": f"Find question {i}"}]} for i in range(n)]


def run(tmp_path, kimi, mode: str, n: int, reasoning: bool):
    server = Provider(kimi, mode)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        write_jsonl(tmp_path / "d.jsonl", rows(n))
        path = kimi_config(
            tmp_path, server,
            [{"name": "d", "path": "d.jsonl", "format": "openai"}],
            endpoint="stream = false\nfetch_endpoints = false\nreturn_token_ids = false\n"
                     "concurrency = 4\nmax_attempts = 2",
            sampling=f"max_tokens = 512\nreasoning = {str(reasoning).lower()}")
        cfg, outcome = go(path)
    finally:
        server.shutdown()
        server.server_close()
    assert not server.errors, server.errors[:3]
    with Store.open(cfg.run_dir) as s:
        got = list(s.iter_results())
    return cfg, outcome, server, got


def question(r) -> int:
    return int(r.request["messages"][-1]["content"].rsplit(" ", 1)[1])


def test_answers_without_the_section_end_are_stored_as_sampled(tmp_path, kimi):
    cfg, outcome, server, got = run(tmp_path, kimi, "omits", 40, reasoning=False)
    assert outcome.state == "finished" and outcome.exit_code == 0, outcome
    assert len(got) == 40
    kept = [r for r in got if r.count_check in ("exact", "repaired")]
    assert len(kept) >= 0.95 * len(got), sorted((r.count_check, r.completion_delta)
                                                for r in got)
    for r in kept:
        n = question(r)
        # exactly the ids the server sampled, the section end only where it was sampled
        assert r.input_ids[r.n_prompt:] == server.sampled[n], (n, r.repairs)
        omitted = bool(n % 5)
        assert ("count:sampled_form:no_section_end" in r.repairs) == omitted, r.repairs
        assert r.count_check == ("repaired" if omitted else "exact")
    # offset 0 adopted for tool-call answers, with the sampled forms
    witness = json.loads((cfg.run_dir / "live.json").read_text()).get("count_witness") \
        if (cfg.run_dir / "live.json").exists() else None
    if witness:
        form = witness["FormHost"]["completion"]["forms"]["tools"]
        assert form["offset"] == 0 and form["sampled_forms"], form
    # verify re-renders each sample in its stored form: no difference flagged
    report = verify_run(cfg.run_dir)
    assert report.ok and report.exit_code == 0 and not report.problems, report.problems[:3]


def test_azure_counts_keep_reasoning_and_tool_call_answers(tmp_path, kimi):
    cfg, outcome, server, got = run(tmp_path, kimi, "azure", 40, reasoning=True)
    assert outcome.state == "finished", outcome
    assert len(got) == 40
    kept = [r for r in got if r.count_check in ("exact", "repaired")]
    assert len(kept) >= 0.9 * len(got), sorted((r.count_check, r.completion_delta)
                                               for r in got)
    with Store.open(cfg.run_dir) as s:
        (quarantined,) = s.conn.execute("SELECT COUNT(*) FROM quarantine").fetchone()
    assert quarantined == 0
    for r in kept:  # never a silent mismatch: the ids kept are the ones sampled
        assert r.input_ids[r.n_prompt:] == server.sampled[question(r)], r.repairs


def test_token_in_ids_without_the_section_end_are_a_sampled_form_not_a_difference():
    from types import SimpleNamespace

    from specgen.conversation import AssistantMessage, ToolCall
    from specgen.engine.answer.witness import _token_in
    from specgen.render import get_renderer
    from specgen.tokenizer import load_tokenizer

    renderer = get_renderer("kimi-k2.5", load_tokenizer(str(model_path("kimi-k2.5"))),
                            thinking=False)
    messages = [{"role": "user", "content": "Find question 1"}]
    msg = AssistantMessage(content="", tool_calls=(
        ToolCall("functions.lookup:0", "lookup", '{"query": "item 1"}'),))
    forms = renderer.completion_variant_ids(msg, context=messages, tools=[LOOKUP])

    def judged(ids):
        a = SimpleNamespace(
            job=SimpleNamespace(prompt_ids=[1, 2], renderer=renderer, messages=messages,
                                tools=[LOOKUP]),
            resp=SimpleNamespace(prompt_token_ids=None, completion_token_ids=None),
            message=msg, completion=ids, truncated=False, repairs=[], verdict=None,
            count_check=None)
        _token_in(a)
        return a.repairs

    assert judged(forms["canonical"]) == []
    assert judged(forms["no_section_end"]) == ["sampled_form:no_section_end"]
    assert judged(forms["canonical"][1:]) == ["flag:rerender_differs"]


def test_a_resumed_run_keeps_the_sampled_forms(tmp_path, kimi):
    # the first session adopts offset 0 with the sampled forms; the second seeds its
    # evidence from the stored samples (those in a sampled form as such) and keeps judging so
    _, _, first, got = run(tmp_path, kimi, "omits", 20, reasoning=False)
    assert len(got) == 20
    cfg, outcome, second, got = run(tmp_path, kimi, "omits", 40, reasoning=False)
    assert outcome.state == "finished" and outcome.exit_code == 0, outcome
    sampled = {**first.sampled, **second.sampled}
    assert len(got) == 40 and len(second.sampled) == 20
    kept = [r for r in got if r.count_check in ("exact", "repaired")]
    assert len(kept) >= 0.95 * len(got), sorted((r.count_check, r.completion_delta)
                                                for r in got)
    assert all(r.input_ids[r.n_prompt:] == sampled[question(r)] for r in kept)
