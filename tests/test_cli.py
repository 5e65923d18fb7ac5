"""The command line as a user meets it, in real processes on a real store: every command that
reads a run takes its dir or its config, --run-dir, --force-new, the end state of a run,
number formatting and --help."""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pytest

from test_engine_support import SPECGEN, prompt_rows, run_cli, write_config, write_jsonl


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECGEN, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run against the in-process simulator: (config path, run dir)."""
    tmp = tmp_path_factory.mktemp("cli")
    write_jsonl(tmp / "a.jsonl", prompt_rows(6))
    config = write_config(tmp, "sim", [{"name": "a", "path": "a.jsonl"}])
    out = run_cli(config)
    assert out.returncode == 0, out.stderr
    return config, tmp / "run-dir"


def test_every_command_that_reads_a_run_takes_its_config(finished, tmp_path):
    config, run_dir = finished
    for args in (["status"], ["status", "--json"], ["verify"], ["report", "--text"],
                 ["export", "--format", "openai", "-o", tmp_path / "o.jsonl"]):
        by_dir = cli(args[0], run_dir, *args[1:])
        by_config = cli(args[0], config, *args[1:])
        assert by_dir.returncode == by_config.returncode == 0, (args, by_config.stderr)
        if args == ["status", "--json"]:
            a, b = json.loads(by_dir.stdout), json.loads(by_config.stdout)
            assert a["datasets"] == b["datasets"] and a["run_dir"] == b["run_dir"]
        elif args[0] in ("status", "report"):
            assert by_dir.stdout == by_config.stdout, args
    assert cli("report", config).returncode == 0
    assert (run_dir / "report.html").exists()  # the default output is in the config's run dir
    merged = cli("merge", config, "-o", tmp_path / "merged")
    assert merged.returncode == 0, merged.stderr
    not_a_run = tmp_path / "notes.txt"
    not_a_run.write_text("hello")
    for cmd in ("status", "export", "report", "verify", "stop"):
        extra = ["--format", "tokens"] if cmd == "export" else []
        out = cli(cmd, not_a_run, *extra)
        assert out.returncode == 2, (cmd, out.stderr)
        assert "neither a run dir nor a run's .toml config" in out.stderr
        assert "Traceback" not in out.stderr


def test_run_dir_option_puts_each_shard_in_its_own_dir(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(8))
    config = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}])
    done = 0
    for i in range(2):
        out = run_cli(config, "--run-dir", tmp_path / f"shard-{i}", "--shard", f"{i}/2")
        assert out.returncode == 0, out.stderr
        st = json.loads(cli("status", tmp_path / f"shard-{i}", "--json").stdout)
        assert st["shard"] == f"{i}/2"
        done += st["datasets"]["a"]["done"]
    assert done == 8 and not (tmp_path / "run-dir").exists()  # the config's run_dir unused
    again = run_cli(config, "--run-dir", tmp_path / "shard-0", "--shard", "0/2")
    assert again.returncode == 0 and "Traceback" not in again.stderr  # resumes: nothing left
    merged = cli("merge", tmp_path / "shard-0", tmp_path / "shard-1", "-o", tmp_path / "m")
    assert merged.returncode == 0, merged.stderr


def test_force_new_moves_the_old_outputs_aside_and_says_so(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(4))
    config = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}])
    run_dir = tmp_path / "run-dir"
    assert run_cli(config).returncode == 0
    assert cli("export", run_dir, "--format", "openai").returncode == 0
    assert cli("report", run_dir).returncode == 0
    old_export = (run_dir / "exports" / "openai.jsonl").read_text()
    out = cli("run", config, "--force-new", "--live")  # the live view: warnings still print
    assert out.returncode == 0, out.stderr
    prev = run_dir / "previous"
    (store,) = prev.glob("state-*.sqlite")
    tag = store.name.removeprefix("state-").removesuffix(".sqlite")
    assert (prev / f"exports-{tag}" / "openai.jsonl").read_text() == old_export
    assert (prev / f"report-{tag}.html").exists()
    assert not (run_dir / "exports").exists() and not (run_dir / "report.html").exists()
    assert "--force-new" in out.stderr and f"exports -> {prev}/exports-{tag}" in out.stderr
    assert f"report.html -> {prev}/report-{tag}.html" in out.stderr


def test_json_outputs_carry_no_float_noise(tmp_path):
    from test_export_support import build_store, chat

    run_dir = build_store(tmp_path / "run", {"d": [chat(0)]})
    with sqlite3.connect(run_dir / "state.sqlite") as conn:
        for cost in (0.1, 0.2):  # summed by SQLite: 0.30000000000000004
            conn.execute("INSERT INTO attempts(task, session, provider, started_at, ended_at, "
                         "outcome, cost_usd, dataset) VALUES(1, 1, 'noisy', 1.0, 2.0, "
                         "'retry:timeout', ?, 'd')", (cost,))
    out = cli("status", run_dir, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["providers"]["noisy"]["cost_usd"] == 0.3
    assert "0000000000" not in out.stdout and "9999999999" not in out.stdout
    exp = cli("export", run_dir, "--format", "openai")
    assert exp.returncode == 0, exp.stderr
    manifest = (run_dir / "exports" / "openai.manifest.json").read_text()
    assert "0000000000" not in manifest and "9999999999" not in manifest


def test_a_finished_run_leaves_no_lock_and_shows_no_dead_pid(finished):
    config, run_dir = finished
    assert not (run_dir / "run.lock").exists()
    st = json.loads(cli("status", run_dir, "--json").stdout)
    assert st["state"] == "finished" and st["pid"] is None and st["session"]["pid"] > 0
    text = cli("status", run_dir).stdout
    assert f"pid {st['session']['pid']}" not in text


def test_help_lists_run_first_and_names_arguments_alike():
    import argparse

    from specgen.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    listed = [a.dest for a in sub._choices_actions]  # the order --help prints them in
    assert listed[:4] == ["run", "preview", "status", "stop"]
    assert set(listed) >= {"export", "verify", "report", "merge", "tokenize", "sim"}
    text = parser.format_help()
    assert text.index("    run ") < text.index("    tokenize ") and "RUN_DIR" in text
    for name, p in sub.choices.items():
        usage = p.format_usage()
        positionals = [a.metavar for a in p._actions if not a.option_strings
                       and a.dest != "help"]
        if name in ("run", "preview"):
            assert positionals == ["CONFIG"], (name, usage)
        elif name in ("status", "stop", "export", "verify", "report", "merge"):
            assert positionals == ["RUN_DIR"], (name, usage)
            assert all(a.help for a in p._actions), name
        assert p.description, f"{name} has no description"
