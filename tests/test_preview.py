"""`specgen preview`: offline, exact request bodies and token views, counts, cost, redaction."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from specgen.cli import main
from specgen.config import load_config
from specgen.planner import next_request
from specgen.render import get_renderer
from specgen.request import build_request
from specgen.sources import iter_rows
from specgen.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "datasets"
EXAMPLES = REPO / "examples" / "data"
SECRET = "sk-or-v1-THIS-MUST-NOT-APPEAR"


def write_config(tmp_path, datasets, *, endpoint='base_url = "https://openrouter.ai/api/v1"',
                 extra=""):
    tables = "\n".join(
        "[[dataset]]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in d.items())
        for d in datasets)
    text = f"""run_dir = "runs/x"
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
{endpoint}
[sampling]
max_tokens = 1000
{extra}
{tables}
"""
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def run_json(capsys, *argv):
    code = main(["preview", *map(str, argv), "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", SECRET)


def test_json_preview_of_the_glaive_example(tmp_path, capsys):
    cfg_path = write_config(tmp_path, [{"name": "tools", "path": str(EXAMPLES / "glaive_tools.jsonl"),
                                        "turns": "last"}])
    code, out = run_json(capsys, cfg_path, "-n", "2")
    assert code == 0
    assert not (tmp_path / "runs").exists()  # nothing written, not even the run dir
    (d,) = out["datasets"]
    assert d["format"] == "glaive (detected)" and d["rows_invalid"] == 0
    assert d["tools_found"] and d["dataset_tool_calls"] > 0
    assert d["complete"] and d["estimated_requests"] == d["requests_scanned"] > d["rows_readable"]
    # the sample is exactly what the run would send and render
    cfg = load_config(cfg_path)
    conv = next(iter_rows(cfg.datasets[0])).conversation
    req = next_request(conv, {}, "last")
    s = d["samples"][0]
    assert s["body"] == build_request(cfg, cfg.datasets[0], req)
    system = s["body"]["messages"][0]["content"]
    assert s["body"]["tools"] and "{" not in system and "get_weather" not in system
    renderer = get_renderer("kimi-k2.5", load_tokenizer("demo"))
    prompt = renderer.prompt_ids(req.messages, req.tools)
    answer = renderer.completion_ids(conv.messages[req.turn])
    assert s["input_ids"] == prompt + answer
    assert s["loss_mask"] == [0] * len(prompt) + [1] * len(answer)
    assert s["answer"] == "dataset"
    assert s["headers"]["Authorization"] == "Bearer <redacted: $OPENROUTER_API_KEY, set>"
    assert SECRET not in json.dumps(out)
    # no prices offline and none configured: cost unknown
    assert out["worst_case_cost_usd"] is None and d["worst_case_cost_usd"] is None


def test_broken_rows_are_counted_with_reasons(tmp_path, capsys):
    cfg_path = write_config(tmp_path, [{"name": "oa", "path": str(FIX / "openai.jsonl")}])
    code, out = run_json(capsys, cfg_path)
    (d,) = out["datasets"]
    assert code == 0 and (d["rows_readable"], d["rows_invalid"]) == (3, 3)
    assert sum(d["invalid_reasons"].values()) == 3
    assert any("openai.jsonl:4: invalid JSON" in e for e in d["invalid_examples"])
    assert any("skip_invalid" in w for w in d["warnings"])


def test_prompt_only_samples_and_budget_prices(tmp_path, capsys):
    cfg_path = write_config(tmp_path, [{"name": "p", "path": str(FIX / "prompt.json"),
                                        "max_tokens": 500}],
                            extra="[budget]\nprompt_price_per_m = 1.0\ncompletion_price_per_m = 4.0")
    code, out = run_json(capsys, cfg_path, "-n", "5")
    (d,) = out["datasets"]
    assert len(d["samples"]) == 3 and all(s["answer"] == "model" for s in d["samples"])
    assert all(set(s["loss_mask"]) == {0} for s in d["samples"])
    expected = d["estimated_prompt_tokens"] * 1e-6 + d["estimated_requests"] * 500 * 4e-6
    assert d["worst_case_cost_usd"] == pytest.approx(expected)
    assert out["prices"]["origin"] == "[budget]"


def test_big_datasets_are_extrapolated(tmp_path, capsys):
    p = tmp_path / "big.jsonl"
    with open(p, "w") as f:
        for i in range(3000):
            f.write(json.dumps({"id": i, "prompt": f"question {i}"}) + "\n")
            if i % 10 == 0:
                f.write("\n")  # blank lines are row slots, not rows
    cfg_path = write_config(tmp_path, [{"name": "big", "path": str(p), "limit": 2000}])
    code, out = run_json(capsys, cfg_path, "--scan", "100", "-n", "0")
    (d,) = out["datasets"]
    assert not d["complete"] and d["rows_scanned"] == 100
    assert abs(d["total_rows"] - 3000) <= 10
    assert d["estimated_requests"] == 2000  # the dataset's limit caps it
    code, out = run_json(capsys, cfg_path, "--scan", "0", "-n", "0")
    assert out["datasets"][0]["complete"] and out["datasets"][0]["rows_scanned"] == 3000


def test_sim_prices_and_a_single_dataset(tmp_path, capsys):
    cfg_path = write_config(tmp_path, [
        {"name": "a", "path": str(EXAMPLES / "reasoning.jsonl")},
        {"name": "b", "path": str(FIX / "sharegpt.json")}], endpoint='base_url = "sim"')
    code, out = run_json(capsys, cfg_path, "--dataset", "b")
    assert [d["name"] for d in out["datasets"]] == ["b"]
    assert out["prices"]["completion_per_m"] == 3.0  # the default simulator's dearest provider
    assert out["worst_case_cost_usd"] > 0
    assert "Authorization" not in out["datasets"][0]["samples"][0]["headers"]


def test_plain_text_output_shows_token_boundaries_and_mask(tmp_path, capsys):
    cfg_path = write_config(tmp_path, [{"name": "r", "path": str(EXAMPLES / "reasoning.jsonl")}],
                            endpoint='base_url = "https://openrouter.ai/api/v1"\n'
                                     'headers = { "X-Title" = "specgen" }')
    assert main(["preview", str(cfg_path), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "│<think>│" in out and "⟦mask 1⟧" in out and "⟦/mask 1⟧" in out
    assert "Authorization: Bearer <redacted: $OPENROUTER_API_KEY, set>" in out
    assert "X-Title: specgen" in out and SECRET not in out
    assert "\x1b[" not in out  # no colour when not a terminal
    assert "format   reasoning (detected)" in out


def test_colour_output_on_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    cfg_path = write_config(tmp_path, [{"name": "t", "path": str(EXAMPLES / "glaive_tools.jsonl")}])
    assert main(["preview", str(cfg_path), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" in out and "⟦mask 1⟧" not in out and "legend" in out
    assert main(["preview", str(cfg_path), "-n", "1", "--no-color"]) == 0
    assert "\x1b[" not in capsys.readouterr().out


def test_system_text_holding_tool_definitions_is_warned_about(tmp_path, capsys):
    row = {"messages": [
        {"role": "system", "content": 'Functions: {"name": "get_weather", "parameters": {}}'},
        {"role": "user", "content": "weather?"}]}
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps(row) + "\n")
    code, out = run_json(capsys, write_config(tmp_path, [{"name": "d", "path": str(p)}]))
    assert any("looks like it holds tool definitions" in w for w in out["datasets"][0]["warnings"])


def test_errors(tmp_path, capsys):
    cfg_path = write_config(tmp_path, [{"name": "a", "path": str(FIX / "prompt.json")}])
    assert main(["preview", str(cfg_path), "--dataset", "nope"]) == 2
    assert "no dataset named 'nope'" in capsys.readouterr().err
    assert main(["preview", str(tmp_path / "missing.toml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out = run_json(capsys, write_config(tmp_path, [{"name": "e", "path": str(empty)}]))
    assert code == 1 and "no dataset files" in out["datasets"][0]["error"]


def test_endpoint_prices_only_when_asked(tmp_path, capsys):
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append((self.path, self.headers.get("Authorization")))
            body = json.dumps({"data": {"endpoints": [
                {"provider_name": "Cheap", "tag": "cheap/fp8", "quantization": "fp8",
                 "pricing": {"prompt": "0.0000004", "completion": "0.000002"}},
                {"provider_name": "Dear", "tag": "dear/int4", "quantization": "int4",
                 "pricing": {"prompt": "0.000001", "completion": "0.000005"}}]}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/api/v1"
        cfg_path = write_config(
            tmp_path, [{"name": "p", "path": str(FIX / "prompt.json")}],
            endpoint=f'base_url = "{url}"\nprovider = {{ quantizations = ["fp8"] }}')
        code, out = run_json(capsys, cfg_path)
        assert hits == [] and out["prices"]["source"] == "unknown"
        code, out = run_json(capsys, cfg_path, "--fetch-prices")
        assert hits == [("/api/v1/models/moonshotai/kimi-k2.5/endpoints", None)]  # no key sent
        # the policy allows only fp8: the cheap endpoint's prices
        assert out["prices"]["prompt_per_m"] == pytest.approx(0.4)
        assert out["prices"]["completion_per_m"] == pytest.approx(2.0)
    finally:
        server.shutdown()
        server.server_close()


def test_request_headers_redact_anything_secret_looking(tmp_path):
    from specgen.preview import request_headers

    cfg = load_config(write_config(tmp_path, [{"name": "a", "path": str(FIX / "prompt.json")}],
                                   endpoint='base_url = "http://127.0.0.1:1/v1"\n'
                                            'return_token_ids = true'))
    cfg.endpoint.headers = {"X-Api-Key": "v1", "Cookie": "v2", "X-Title": "ok"}
    h = request_headers(cfg)
    assert h["X-Api-Key"] == h["Cookie"] == "<redacted>" and h["X-Title"] == "ok"
    assert h["X-Specgen-Return-Token-Ids"] == "1"
    cfg.endpoint.api_key_env = "SPECGEN_TEST_UNSET_KEY"
    assert request_headers(cfg)["Authorization"] == "Bearer <redacted: $SPECGEN_TEST_UNSET_KEY, NOT SET>"


def test_token_budget_and_dollar_cap_bound_the_worst_case(tmp_path, capsys):
    cfg_path = write_config(tmp_path, [{"name": "r", "path": str(EXAMPLES / "reasoning.jsonl"),
                                        "token_budget": 5000}], endpoint='base_url = "sim"',
                            extra="[budget]\nmax_cost_usd = 0.01")
    code, out = run_json(capsys, cfg_path, "-n", "0")
    (d,) = out["datasets"]
    assert d["worst_case_completion_tokens"] == 5000 < d["estimated_requests"] * 1000
    assert out["max_cost_usd"] == 0.01
    assert main(["preview", str(cfg_path), "-n", "0"]) == 0
    text = capsys.readouterr().out
    assert "capped by token_budget = 5,000" in text
    assert "but the run stops at [budget] max_cost_usd = $0.01" in text


def test_a_bad_row_says_what_the_run_will_do_with_it(tmp_path, capsys):
    datasets = [{"name": "r", "path": str(EXAMPLES / "reasoning.jsonl")},
                {"name": "oa", "path": str(FIX / "openai.jsonl")}]
    code, out = run_json(capsys, write_config(tmp_path, datasets))
    r, oa = out["datasets"]
    assert r["stops_at"] is None and oa["invalid_rows"] == "stop"
    # rows 0 (a last turn with a tool loop: 2 requests) and 1 (a prompt: 1) come before it
    assert oa["stops_at"] == {"row": f"row 3 ({FIX / 'openai.jsonl'}:4)", "requests_before": 3,
                              "requests_of_earlier_datasets": r["estimated_requests"]}
    (warning,) = [w for w in oa["warnings"] if "skip_invalid" in w]
    assert "stops with an error" in warning and "up to ~28 of the datasets before it" in warning
    assert main(["preview", str(write_config(tmp_path, datasets)), "-n", "0"]) == 0
    text = capsys.readouterr().out
    assert "  invalid  1 x invalid JSON" in text and "skipped" not in text
    assert "the run stops with an error at the first invalid row of oa" in text
    datasets[1]["skip_invalid"] = True
    code, out = run_json(capsys, write_config(tmp_path, datasets))
    oa = out["datasets"][1]
    assert oa["invalid_rows"] == "skip" and oa["stops_at"] is None
    assert not any("skip_invalid" in w for w in oa["warnings"])
    assert main(["preview", str(write_config(tmp_path, datasets)), "-n", "0"]) == 0
    text = capsys.readouterr().out
    assert "  skipped  1 x invalid JSON" in text and "stops" not in text


def test_planned_requests_are_a_range_where_tool_calls_decide(tmp_path, capsys):
    loop = {"id": "t", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {}}}}], "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}]}
    chat = {"id": "c", "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(loop) + "\n" + json.dumps(chat) + "\n")
    cfg = write_config(tmp_path, [{"name": "d", "path": str(path), "turns": "all"}])
    code, out = run_json(capsys, cfg, "-n", "0")
    (d,) = out["datasets"]
    # the tool loop: 3 requests if the model calls as the dataset did, 1 if its first answer
    # differs; the plain chat: always 2
    assert (d["estimated_requests_min"], d["estimated_requests"]) == (3, 5)
    assert main(["preview", str(cfg), "-n", "0"]) == 0
    assert "requests 3–5 planned (tool calls decide" in capsys.readouterr().out
    last = write_config(tmp_path, [{"name": "d", "path": str(path), "turns": "last"}])
    code, out = run_json(capsys, last, "-n", "0")
    assert (out["datasets"][0]["estimated_requests_min"],
            out["datasets"][0]["estimated_requests"]) == (2, 2)


def test_where_prices_come_from(tmp_path, capsys):
    from specgen.store import Store

    cfg = write_config(tmp_path, [{"name": "p", "path": str(FIX / "prompt.json")}])
    code, out = run_json(capsys, cfg)
    assert out["prices"]["origin"].startswith("unknown: run with --fetch-prices")
    assert out["worst_case_cost_usd"] is None
    run_dir = tmp_path / "runs" / "x"  # the endpoint prices an earlier run recorded
    with Store.create(run_dir) as s:
        s.set_meta("prices", json.dumps({"prompt_per_m": 0.6, "completion_per_m": 3.0,
                                         "source": "endpoints"}))
    code, out = run_json(capsys, cfg)
    assert out["prices"]["completion_per_m"] == pytest.approx(3.0)
    assert out["prices"]["origin"].startswith(f"the endpoint list cached in {run_dir}")
    assert out["worst_case_cost_usd"] > 0
    budget = write_config(tmp_path, [{"name": "p", "path": str(FIX / "prompt.json")}],
                          extra="[budget]\nprompt_price_per_m = 1.0\ncompletion_price_per_m = 2.0")
    code, out = run_json(capsys, budget)
    assert out["prices"]["origin"] == "[budget]" and out["prices"]["completion_per_m"] == 2.0


def test_every_row_invalid_exits_non_zero_with_what_to_check(tmp_path, capsys):
    """Issue 35: `rows 10 read, 0 readable, 10 invalid` exited 0."""
    rows = tmp_path / "bad.jsonl"
    rows.write_text("".join(json.dumps({"question": f"q{i}", "oops": i}) + "\n"
                            for i in range(10)))
    cfg_path = write_config(tmp_path, [{"name": "bad", "path": str(rows), "format": "openai",
                                        "skip_invalid": True}])
    assert main(["preview", str(cfg_path), "-n", "0", "--no-color"]) == 6
    captured = capsys.readouterr()
    assert "10 read, 0 readable, 10 invalid" in captured.out
    assert "dataset 'bad': none of the 10 row(s) read is readable" in captured.err
    assert "format" in captured.err
    code, out = run_json(capsys, cfg_path)
    assert code == 6 and out["datasets"][0]["rows_readable"] == 0
