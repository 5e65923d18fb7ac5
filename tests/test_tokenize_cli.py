"""`specgen tokenize`: the command end to end (in-process and as a real process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specgen.cli import main
from specgen.commands.tokenize import tokenize_lines
from specgen.render import get_renderer

CHAT = {"id": "c1", "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris? 你好 😀"},
    {"role": "assistant", "content": "", "reasoning_content": "use the tool",
     "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "\n18C"},
    {"role": "assistant", "content": "18C and sunny.", "reasoning": "answer"},
], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}
PROMPT_ONLY = {"id": 7, "messages": [{"role": "user", "content": "just a prompt"}]}
TWO_TURNS = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                          {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n"
                            for r in rows))
    return path


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_samples_equal_the_renderer_and_ids_are_copied(tmp_path, demo_tokenizer, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [CHAT, "", PROMPT_ONLY, TWO_TURNS])
    out = tmp_path / "out.jsonl"
    assert main(["tokenize", "--tokenizer", "demo", str(src), "-o", str(out)]) == 0
    rows = read_jsonl(out)
    r = get_renderer("kimi-k2.5", demo_tokenizer)
    expected = [r.sample(c["messages"], c.get("tools")) for c in (CHAT, PROMPT_ONLY, TWO_TURNS)]
    assert [row.get("id") for row in rows] == ["c1", 7, None]
    assert "id" not in rows[2]
    assert [list(row) for row in rows][0] == ["id", "input_ids", "loss_mask"]
    for row, s in zip(rows, expected, strict=True):
        assert row["input_ids"] == s.input_ids and row["loss_mask"] == s.loss_mask
    assert set(rows[1]["loss_mask"]) == {0}
    err = capsys.readouterr().err
    assert "3 lines, 3 samples, 0 invalid" in err


def test_real_kimi_tokenizer_and_no_thinking(tmp_path, kimi_tokenizer):
    src = write_jsonl(tmp_path / "in.jsonl", [CHAT])
    for flags, thinking in (([], True), (["--no-thinking"], False)):
        out = tmp_path / f"out{thinking}.jsonl"
        assert main(["tokenize", "--tokenizer", str(kimi_tokenizer.path), str(src), "-o", str(out),
                     *flags]) == 0
        s = get_renderer("kimi-k2.5", kimi_tokenizer, thinking=thinking).sample(CHAT["messages"], CHAT["tools"])
        (row,) = read_jsonl(out)
        assert row["input_ids"] == s.input_ids and row["loss_mask"] == s.loss_mask
        assert (163606 == row["input_ids"][s.n_prompt - 1]) == thinking


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({"messages": "hi"}, "messages: expected a list"),
        ({"messages": []}, "messages: the list is empty"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}, "messages[0].content[0].text"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
         "messages[0].tool_calls[0].function.name"),
        ({"messages": [{"role": "assistant", "tool_calls": "x"}]}, "messages[0].tool_calls"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [3]}, "tools[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "video_url"}]}]}, "video"),
    ],
)
def test_bad_line_names_line_and_field_and_leaves_no_output(tmp_path, capsys, bad, field):
    src = write_jsonl(tmp_path / "in.jsonl", [PROMPT_ONLY, bad])
    out = tmp_path / "out.jsonl"
    assert main(["tokenize", "--tokenizer", "demo", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{src}:2: " in err and field in err
    assert not out.exists() and list(tmp_path.iterdir()) == [src]


def test_skip_invalid_reports_counts_and_goes_on(tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [PROMPT_ONLY, "{oops", {"messages": [{"role": 1}]}, TWO_TURNS])
    out = tmp_path / "out.jsonl"
    assert main(["tokenize", "--tokenizer", "demo", "--skip-invalid", str(src), "-o", str(out)]) == 0
    assert len(read_jsonl(out)) == 2
    err = capsys.readouterr().err
    assert f"skipped {src}:2: not valid JSON" in err and f"skipped {src}:3: messages[0].role" in err
    assert err.strip().splitlines()[-1].startswith("specgen tokenize: 4 lines, 2 samples, 2 invalid (skipped)")


def test_all_turns(tmp_path, demo_tokenizer, capsys):
    r = get_renderer("kimi-k2.5", demo_tokenizer, thinking=False)
    src = write_jsonl(tmp_path / "in.jsonl", [TWO_TURNS])
    out = tmp_path / "out.jsonl"
    assert main(["tokenize", "--tokenizer", "demo", "--all-turns", "--no-thinking", str(src), "-o", str(out)]) == 0
    (row,) = read_jsonl(out)
    s = r.sample_all_turns(TWO_TURNS["messages"])
    assert row == {"input_ids": s.input_ids, "loss_mask": s.loss_mask}
    assert demo_tokenizer.decode([i for i, m in zip(s.input_ids, s.loss_mask, strict=True) if m]) == (
        "b<|im_end|>d<|im_end|>")
    # K2.5 with thinking drops reasoning of finished turns: refused, with the reason
    with_reasoning = {"messages": [TWO_TURNS["messages"][0], {**TWO_TURNS["messages"][1], "reasoning_content": "r"},
                                   *TWO_TURNS["messages"][2:]]}
    write_jsonl(src, [with_reasoning])
    assert main(["tokenize", "--tokenizer", "demo", "--all-turns", str(src), "-o", str(out)]) == 1
    assert "not prefix-extending" in capsys.readouterr().err


def test_setup_errors(tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [PROMPT_ONLY])
    out = str(tmp_path / "o.jsonl")
    assert main(["tokenize", "--tokenizer", "demo", "--renderer", "nope", str(src), "-o", out]) == 2
    assert "unknown renderer 'nope'" in capsys.readouterr().err
    assert main(["tokenize", "--tokenizer", str(tmp_path / "missing"), str(src), "-o", out]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["tokenize", "--tokenizer", "demo", str(tmp_path / "none.jsonl"), "-o", out]) == 2
    assert "none.jsonl" in capsys.readouterr().err
    assert main(["tokenize", "--tokenizer", "demo", "--renderer", "hf", str(src), "-o", out]) == 2
    assert "no chat template" in capsys.readouterr().err


def test_real_process_with_stdin_and_stdout(tmp_path):
    lines = (json.dumps(PROMPT_ONLY) + "\n" + json.dumps(TWO_TURNS) + "\n").encode()
    proc = subprocess.run([sys.executable, "-m", "specgen", "tokenize", "--tokenizer", "demo", "-", "-o", "-"],
                          input=lines, capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    rows = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert len(rows) == 2 and rows[0]["id"] == 7
    assert b"2 lines, 2 samples" in proc.stderr


def test_streaming_writes_each_sample_before_reading_the_next_line(demo_tokenizer):
    r = get_renderer("kimi-k2.5", demo_tokenizer)
    written: list[bytes] = []
    line = (json.dumps(TWO_TURNS) + "\n").encode()

    def lines():
        for k in range(50):
            assert len(written) == k  # nothing is buffered ahead of the input
            yield line

    summary = tokenize_lines(r, lines(), written.append)
    assert summary.samples == 50 and len(written) == 50


def test_hf_renderer_with_a_chat_template_file(tmp_path, demo_tokenizer, capsys):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ '<|im_assistant|>' if m.role == 'assistant' else "
                        "'<|im_user|>' }}{{ m.content }}<|im_end|>{% endfor %}"
                        "{% if add_generation_prompt %}<|im_assistant|>{% endif %}")
    src = write_jsonl(tmp_path / "in.jsonl", [TWO_TURNS])
    out = tmp_path / "out.jsonl"
    assert main(["tokenize", "--tokenizer", "demo", "--renderer", "hf", "--chat-template", str(template),
                 str(src), "-o", str(out)]) == 0
    (row,) = read_jsonl(out)
    assert demo_tokenizer.decode(row["input_ids"]) == (
        "<|im_user|>a<|im_end|><|im_assistant|>b<|im_end|><|im_user|>c<|im_end|><|im_assistant|>d<|im_end|>")
    assert row["loss_mask"].count(1) == 2  # "d", "<|im_end|>"
    assert main(["tokenize", "--tokenizer", "demo", "--chat-template", str(template), str(src),
                 "-o", str(out)]) == 2
    assert "'kimi-k2.5' does not take template" in capsys.readouterr().err
    assert main(["tokenize", "--tokenizer", "demo", "--renderer", "hf", "--chat-template",
                 str(tmp_path / "no.jinja"), str(src), "-o", str(out)]) == 2
    assert "no.jinja" in capsys.readouterr().err
