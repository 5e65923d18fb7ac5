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


def test_a_dollar_cap_below_one_requests_worst_case_is_refused_before_anything_is_written(
        tmp_path):
    # prices from the config: known before the run dir is touched
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(3))
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}],
                        sampling="max_tokens = 4096\n[budget]\nmax_cost_usd = 0.001\n"
                                 "prompt_price_per_m = 1.0\ncompletion_price_per_m = 2.0")
    res = run_cli(path)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out[-2000:]
    assert ("[budget] max_cost_usd $0.001 is smaller than one request's worst case "
            "($0.008192: max_tokens 4,096 of dataset 'a'") in out
    assert "Traceback" not in out and "finished" not in out
    assert not (tmp_path / "run-dir").exists()


def test_a_dollar_cap_below_one_request_at_the_endpoint_lists_prices_is_refused(tmp_path):
    # prices from the (simulator's) endpoint list: refused once they are known, nothing sent
    write_jsonl(tmp_path / "a.jsonl", prompt_rows(3))
    path = write_config(tmp_path, "sim", [{"name": "a", "path": "a.jsonl"}],
                        sampling="max_tokens = 4096\n[budget]\nmax_cost_usd = 0.000001")
    res = run_cli(path)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out[-2000:]
    assert "[budget] max_cost_usd $1e-06 is smaller than one request's worst case" in out
    assert "prices from endpoints" in out
    assert "Traceback" not in out and "finished" not in out
