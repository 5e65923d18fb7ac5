"""Test helper (no tests here): fill a real run store the way the engine does, via SQL on the
documented schema, with samples rendered by the real renderer. End-to-end tests use
`specgen run` against the simulator instead (tests/test_shard_merge.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from specgen.conversation import AssistantMessage
from specgen.render import get_renderer
from specgen.store import Store, pack_ids, pack_json
from specgen.tokenizer import load_tokenizer

T0 = 1_700_000_000.0


def chat(i: int, turns: int = 1, *, reasoning: bool = True, tools: bool = False) -> dict:
    """A small conversation with `turns` user/assistant exchanges (optionally a tool loop)."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"question {i}.{t}: what is {i} + {t}?"})
        if tools and t == 0:
            call = {"id": f"functions.add:{t}", "type": "function",
                    "function": {"name": "add", "arguments": f'{{"a": {i}, "b": {t}}}'}}
            msgs.append({"role": "assistant", "content": "", "tool_calls": [call],
                         **({"reasoning_content": "use the tool"} if reasoning else {})})
            msgs.append({"role": "tool", "tool_call_id": call["id"], "content": str(i + t)})
        a = {"role": "assistant", "content": f"It is {i + t}. " + "ok " * (i % 7)}
        if reasoning:
            a["reasoning_content"] = f"{i} plus {t} makes {i + t}"
        msgs.append(a)
    conv: dict[str, Any] = {"id": f"c{i:04d}", "messages": msgs}
    if tools:
        conv["tools"] = [{"type": "function", "function": {
            "name": "add", "description": "Add two numbers",
            "parameters": {"type": "object", "properties": {
                "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}]
    return conv


def build_store(run_dir: Path, datasets: dict[str, list[dict]], *, renderer: str = "kimi-k2.5",
                tokenizer: str = "demo", thinking: bool = True, turns: str = "last",
                true_ids: bool = False, config_hash: str = "hash-1", shard: str = "") -> Path:
    """A finished run store holding `datasets` (name -> conversations as `chat()` makes; a
    conversation's `_row` key, if any, is its source row index)."""
    tok = load_tokenizer(tokenizer)
    rnd = get_renderer(renderer, tok, thinking=thinking)
    store = Store.create(run_dir)
    c = store.conn
    c.execute("BEGIN")
    config = {"target": {"model": "moonshotai/kimi-k2.5", "tokenizer": tokenizer,
                         "renderer": renderer}}
    for k, v in {"config_hash": config_hash, "config_json": orjson.dumps(config).decode(),
                 "tokenizer_fingerprint": tok.fingerprint, "renderer": renderer,
                 "model": "moonshotai/kimi-k2.5", "thinking": "1" if thinking else "0",
                 "shard": shard, "prices": "{}"}.items():
        store.set_meta(k, v)
    c.execute("INSERT INTO sessions(id, pid, host, started_at, heartbeat_at, ended_at, state, "
              "stop_reason, argv) VALUES(1, 1, 'h', ?, ?, ?, 'finished', 'done', '[]')",
              (T0, T0 + 100, T0 + 100))
    now = T0
    for pos, (name, convs) in enumerate(datasets.items()):
        c.execute("INSERT INTO datasets(name, position, path, format, rows_read, exhausted, "
                  "state) VALUES(?, ?, ?, 'auto', ?, 1, 'done')",
                  (name, pos, f"/data/{name}.jsonl", len(convs)))
        for row_index, conv in enumerate(convs):
            if "_row" in conv:  # the source row index, when `convs` is a shard's share
                conv = dict(conv)
                row_index = conv.pop("_row")
            cur = c.execute(
                "INSERT INTO conversations(dataset, conv_id, row_index, status, data) "
                "VALUES(?, ?, ?, 'done', ?)", (name, conv["id"], row_index, pack_json(conv)))
            conv_row = cur.lastrowid
            msgs = conv["messages"]
            idx = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
            chosen = {"last": idx[-1:], "first": idx[:1], "all": idx}[turns]
            for turn in chosen:
                now += 1.0
                request = {"messages": msgs[:turn], "tools": conv.get("tools")}
                answer = AssistantMessage.from_openai(msgs[turn]).to_openai()
                prompt = rnd.prompt_ids(request["messages"], request["tools"])
                completion = rnd.completion_ids(answer)
                provider = ["alpha", "beta"][row_index % 2]
                cur = c.execute("INSERT INTO tasks(conversation, dataset, turn, status, attempts)"
                                " VALUES(?, ?, ?, 'done', 1)", (conv_row, name, turn))
                task = cur.lastrowid
                if row_index % 3 == 1:  # one retried attempt before the good one
                    c.execute("INSERT INTO attempts(task, session, base_url, provider, model, "
                              "started_at, ended_at, outcome, http_status, error) VALUES(?, 1, "
                              "'sim', ?, 'm', ?, ?, 'retry:rate_limited', 429, 'slow down')",
                              (task, provider, now - 0.9, now - 0.8))
                cost = (len(prompt) + 2 * len(completion)) * 1e-6
                c.execute("INSERT INTO attempts(task, session, base_url, provider, model, "
                          "started_at, first_byte_at, ended_at, outcome, http_status, "
                          "prompt_tokens, completion_tokens, cost_usd) VALUES(?, 1, 'sim', ?, "
                          "'m', ?, ?, ?, 'ok', 200, ?, ?, ?)",
                          (task, provider, now - 0.5, now - 0.5 + 0.01 * (row_index + 1), now,
                           len(prompt), len(completion), cost))
                c.execute(
                    "INSERT INTO results(task, conversation, dataset, turn, provider, model, "
                    "finish_reason, native_finish_reason, request, message, input_ids, n_prompt,"
                    " true_prompt_ids, true_completion_ids, prompt_tokens, completion_tokens, "
                    "reasoning_tokens, cost_usd, repairs, latency_s, created_at) "
                    "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (task, conv_row, name, turn, provider, "moonshotai/kimi-k2.5",
                     "tool_calls" if answer.get("tool_calls") else "stop", "stop",
                     pack_json(request), orjson.dumps(answer).decode(),
                     pack_ids(prompt + completion), len(prompt),
                     pack_ids(prompt) if true_ids else None,
                     pack_ids(completion) if true_ids else None,
                     len(prompt), len(completion), 3, cost,
                     orjson.dumps(["strip_im_end"] if row_index % 4 == 2 else
                                  ["flag:arguments_compact"] if row_index % 4 == 3 else []).decode(),
                     0.5, now))
    c.execute("INSERT INTO quarantine(task, dataset, provider, reason, response, created_at) "
              "VALUES(NULL, ?, 'beta', 'empty_response', NULL, ?)", (next(iter(datasets)), now))
    c.execute("INSERT INTO events(ts, session, kind, dataset, provider, detail) "
              "VALUES(?, 1, 'retry:rate_limited', NULL, 'alpha', '429')", (T0 + 5,))
    c.execute("INSERT INTO events(ts, session, kind, dataset, provider, detail) "
              "VALUES(?, 1, 'stop', NULL, NULL, 'finished')", (now,))
    c.execute("COMMIT")
    store.close()
    return run_dir
