"""A store that is not one gives a message, not a traceback (third reliability audit): `run`
on a zero-byte or corrupt `state.sqlite`, and every reader on a `state.sqlite` that is a
directory — real `specgen` processes, exit 2, the file left as it was."""

from __future__ import annotations

import subprocess

import pytest

from test_engine_support import ENV, SPECGEN, prompt_rows, write_config, write_jsonl


@pytest.mark.parametrize("content,words", [(b"", "is empty (0 bytes)"),
                                           (b"garbage, not sqlite" * 50, "not a specgen store")])
def test_run_on_an_empty_or_corrupt_store_says_so(tmp_path, content, words):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(2))
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}])
    (tmp_path / "run-dir").mkdir()
    store = tmp_path / "run-dir" / "state.sqlite"
    store.write_bytes(content)
    res = subprocess.run([*SPECGEN, "run", str(path), "--no-live"], capture_output=True,
                         text=True, timeout=120, env=ENV)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and words in res.stderr
    assert store.read_bytes() == content  # never overwritten


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["report"], ["verify"],
                                     ["provider"], ["stop"], ["export", "--format", "tokens"]])
def test_readers_on_a_store_that_is_a_directory_say_so(tmp_path, command):
    run_dir = tmp_path / "rd"
    (run_dir / "state.sqlite").mkdir(parents=True)
    res = subprocess.run([*SPECGEN, command[0], str(run_dir), *command[1:]],
                         capture_output=True, text=True, timeout=120, env=ENV)
    assert res.returncode == 2, (res.stdout, res.stderr[-2000:])
    assert "Traceback" not in res.stderr
    assert "is a directory, not a specgen store" in res.stderr
