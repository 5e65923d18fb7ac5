"""A source changed before the resume cursor is noticed and said (third reliability audit):
real `specgen run` processes resume a run whose dataset file was edited, or only appended to."""

from __future__ import annotations

import json

from test_engine_support import prompt_rows, run_cli, write_config, write_jsonl


def test_an_edited_source_is_said_and_an_appended_one_resumes_quietly(tmp_path):
    rows = prompt_rows(6)
    write_jsonl(tmp_path / "a.jsonl", rows)
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}])
    res = run_cli(path)
    assert res.returncode == 0, res.stderr[-2000:]
    # rows appended: read as usual, nothing to say
    with open(tmp_path / "a.jsonl", "a") as f:
        f.write(json.dumps(prompt_rows(8)[6]) + "\n")
    res = run_cli(path)
    assert res.returncode == 0 and "changed since the last session" not in res.stderr
    # a row before the cursor edited: said, with what the run does
    rows = prompt_rows(8)[:7]
    rows[1]["messages"][0]["content"] = "an edited question"
    write_jsonl(tmp_path / "a.jsonl", rows)
    res = run_cli(path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "dataset 'a': the source" in res.stderr
    assert "changed since the last session" in res.stderr
    assert "resumes by position at row 7" in res.stderr and "--force-new" in res.stderr
    res = run_cli(path)  # said once: the new content is the one recorded now
    assert "changed since the last session" not in res.stderr
