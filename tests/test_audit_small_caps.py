"""A token budget smaller than one request's worst case is refused with a message (third
reliability audit) instead of a run that ends "finished", exit 0, with nothing sent."""

from __future__ import annotations

from test_engine_support import prompt_rows, run_cli, write_config, write_jsonl


def test_a_token_budget_below_one_requests_worst_case_is_refused(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(3))
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl",
                                           "token_budget": 100}],
                        sampling="max_tokens = 4096")
    res = run_cli(path)
    assert res.returncode == 2, (res.stdout, res.stderr[-2000:])
    assert "token_budget 100 is smaller than one request's worst case (max_tokens 4096)" \
        in res.stderr + res.stdout
    assert not (tmp_path / "run-dir" / "state.sqlite").exists()
