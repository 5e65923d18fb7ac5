"""The newcomer's frictions of issue 24, each reproduced with a real `specgen` process."""

from __future__ import annotations

import json
import subprocess

from test_engine_support import ENV, SPECGEN, write_jsonl


def cli(*args: str, cwd, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECGEN, *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd, env={**ENV, **(env or {})})


def config(tmp, dataset: str, endpoint: str = 'base_url = "sim"', extra: str = "") -> str:
    path = tmp / "run.toml"
    path.write_text(f"""run_dir = "run-dir"
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
{endpoint}
{extra}
[[dataset]]
name = "d"
{dataset}
""")
    return str(path)


def rows(n: int) -> list[dict]:
    return [{"id": f"r{i}", "messages": [{"role": "user", "content": f"Explain {i}."}]}
            for i in range(n)]


def test_a_csv_dataset_is_refused_at_validation_listing_the_formats(tmp_path):
    (tmp_path / "data.csv").write_text("prompt,answer\nhi,yo\n")
    cfg = config(tmp_path, 'path = "data.csv"')
    for cmd in ("run", "preview"):
        out = cli(cmd, cfg, cwd=tmp_path)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "None" not in out.stderr and "Traceback" not in out.stderr
        assert "dataset[0] ('d'): path" in out.stderr
        assert ".csv is not a dataset file specgen reads (it reads .jsonl/.ndjson" in out.stderr
    assert not (tmp_path / "run-dir").exists()


def test_a_missing_api_key_leaves_no_run_dir_behind(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", rows(2))
    cfg = config(tmp_path, 'path = "d.jsonl"', endpoint='base_url = "https://example.invalid/v1"\n'
                 'api_key_env = "SPECGEN_NO_SUCH_KEY_VAR"')
    env = dict(ENV)
    env.pop("SPECGEN_NO_SUCH_KEY_VAR", None)
    out = subprocess.run([*SPECGEN, "run", cfg, "--no-live"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == 2
    assert "the API key is not set: export SPECGEN_NO_SUCH_KEY_VAR=..." in out.stderr
    assert not (tmp_path / "run-dir").exists()


def test_a_mistyped_key_gets_a_did_you_mean(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", rows(2))
    cases = [  # (config arguments, the message)
        (('path = "d.jsonl"\nmax_token = 5',),
         "unknown key(s) in [dataset[0]]: max_token (did you mean `max_tokens`?)"),
        (('path = "d.jsonl"', 'base_url = "sim"\nconcurency = 4'),
         "unknown key(s) in [endpoint]: concurency (did you mean `concurrency`?)"),
        (('path = "d.jsonl"', 'base_url = "sim"', '[endpoint.provider]\nignor = ["x"]'),
         "unknown key(s) in [endpoint.provider]: ignor (did you mean `ignore`?)"),
    ]
    for args, want in cases:
        out = cli("run", config(tmp_path, *args), "--no-live", cwd=tmp_path)
        assert out.returncode == 2 and want in out.stderr, out.stderr
    # a key close to nothing gets no guess
    cfg = config(tmp_path, 'path = "d.jsonl"\nzzzzzz = 5')
    out = cli("run", cfg, "--no-live", cwd=tmp_path)
    assert out.returncode == 2 and "zzzzzz (known:" in out.stderr, out.stderr


def test_preview_of_an_unknown_dataset_names_it(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", rows(2))
    out = cli("preview", config(tmp_path, 'path = "d.jsonl"'), "--dataset", "nope",
              cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("specgen preview: no dataset named 'nope'"), out.stderr
    assert "None" not in out.stderr
    json.dumps(out.stderr)  # plain text


def test_an_invalid_json_line_is_named_by_its_file_line(tmp_path):
    good = [json.dumps(r) for r in rows(3)]
    (tmp_path / "d.jsonl").write_text("\n".join(
        [*good, '{"messages": [{"role": "user", "content": "x"},]}']) + "\n")
    out = cli("run", config(tmp_path, 'path = "d.jsonl"'), "--no-live", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    first = out.stdout.splitlines()[0]
    assert "d.jsonl:4 (row 3): invalid JSON at line 4, column 47: trailing comma" in first
    assert "line 1 column" not in first


def test_a_source_error_does_not_repeat_its_prefix(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x.json").write_text("[1, 2]\n")
    out = cli("run", config(tmp_path, 'path = "dir"'), "--no-live", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("run failed: dataset 'd': cannot read "), first
    assert first.count("dataset 'd'") == 1 and first.count("dir") == 1, first


def test_progress_lines_count_quarantined_answers(tmp_path):
    # every answer cut and quarantined (alarms off): the plain progress lines show them and
    # a rate above 0 — the run gets answers, it keeps none
    write_jsonl(tmp_path / "d.jsonl", rows(24))
    (tmp_path / "sim.toml").write_text('[[providers]]\nname = "Slow"\ntag = "slow/bf16"\n'
                                       'quantization = "bf16"\nlatency_s = 0.1\n')
    cfg = config(tmp_path, 'path = "d.jsonl"', endpoint='base_url = "sim"\nconcurrency = 4',
                 extra='[sampling]\nmax_tokens = 5\n[quality]\nalarms = false\n'
                       '[engine]\nlog_interval = 0.2\n[sim]\nconfig = "sim.toml"')
    out = cli("run", cfg, "--no-live", cwd=tmp_path)
    assert out.returncode == 6, out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if "req/s" in line]
    assert lines and "d: tasks 0 done 0 failed 24 quarantined 0 pending" in lines[-1], lines
    assert any(" 0.0 req/s" not in line for line in lines), lines


def test_ended_early_reasons_sit_next_to_the_count_they_explain():
    from specgen.engine.status import conversation_lines

    line = conversation_lines({"conversations": {"ended": 9, "pending": 4},
                               "end_reasons": {"quarantined:length": 8, "stop": 1}})[0]
    assert line == "conversations: ended early 9 (quarantined:length 8, stop 1), pending 4"
