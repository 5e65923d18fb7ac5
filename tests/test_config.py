"""Run config validation: every bad input gets a clear error naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from specgen.config import ConfigError, load_config

BASE = """
run_dir = "runs/x"
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
base_url = "sim"
[[dataset]]
name = "a"
path = "data.jsonl"
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "data.jsonl").write_text('{"prompt": "hi"}\n')
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def cfg_of(tmp_path: Path, text: str = BASE):
    return load_config(write(tmp_path, text))


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        cfg_of(tmp_path, text)
    return str(exc.value)


def test_minimal_config_defaults_and_paths(tmp_path):
    cfg = cfg_of(tmp_path)
    assert cfg.run_dir == tmp_path / "runs/x"
    assert cfg.datasets[0].path == tmp_path / "data.jsonl"
    assert cfg.endpoint.base_url == ["sim"] and cfg.endpoint.is_sim
    assert cfg.target.renderer == "kimi-k2.5"
    assert cfg.engine.drain_timeout == 60.0 and cfg.engine.commit_interval == 0.2
    assert cfg.endpoint.fetch_endpoints == "auto"
    assert cfg.endpoint.stream_tick_ms == 200.0 and cfg.engine.event_loop == "auto"
    assert cfg.max_tokens_for(cfg.datasets[0]) == cfg.sampling.max_tokens


def test_full_issue_example_parses(tmp_path):
    text = BASE.replace('base_url = "sim"', '''base_url = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
api_key_env = "OPENROUTER_API_KEY"
concurrency = 2000
stream = true
[endpoint.provider]
ignore = ["deepinfra/fp4"]
quantizations = ["int4", "fp8", "bf16"]''') + '''format = "auto"
max_tokens = 4096
token_budget = 10_000_000
limit = 50000
[sampling]
temperature = 1.0
max_tokens = 16384
reasoning = true
[budget]
max_cost_usd = 200
[engine]
drain_timeout = 5
'''
    cfg = cfg_of(tmp_path, text)
    assert cfg.endpoint.concurrency == 2000
    assert cfg.budget.max_cost_usd == 200.0 and isinstance(cfg.budget.max_cost_usd, float)
    assert cfg.datasets[0].token_budget == 10_000_000
    assert cfg.max_tokens_for(cfg.datasets[0]) == 4096
    assert cfg.engine.drain_timeout == 5.0


@pytest.mark.parametrize("edit, needle", [
    (("", "colour = 1\n"), "unknown top-level key(s): colour"),
    (("[endpoint]\n", "[endpoint]\nconcurency = 5\n"), "unknown key(s) in [endpoint]: concurency"),
    (("[endpoint]\n", "[endpoint]\nconcurrency = \"10\"\n"), "'endpoint.concurrency' must be int"),
    (("[endpoint]\n", "[endpoint]\nconcurrency = true\n"), "must be int, got bool"),
    (("[endpoint]\n", "[endpoint]\nconcurrency = 0\n"), "endpoint.concurrency must be >= 1"),
    (("[endpoint]\n", "[endpoint]\nstream = \"yes\"\n"), "'endpoint.stream' must be bool"),
    (("[endpoint]\n", "[endpoint]\nfetch_endpoints = \"sometimes\"\n"), "fetch_endpoints"),
    (("model = \"moonshotai/kimi-k2.5\"\n", ""), "missing required key 'target.model'"),
    (("path = \"data.jsonl\"", "path = \"nope.jsonl\""), "path"),
    (("tokenizer = \"demo\"", "tokenizer = \"./no/such/dir\""), "target.tokenizer"),
    (("base_url = \"sim\"", "base_url = \"ftp://x\""), "must start with http:// or https://"),
    (("base_url = \"sim\"", "base_url = [\"sim\", \"http://a/v1\"]"), "cannot be combined"),
    (("base_url = \"sim\"", "base_url = []"), "must not be empty"),
    (("[endpoint]\n", "[endpoint]\nheaders = {Authorization = \"Bearer sk\"}\n"),
     "secrets do not belong in the config file"),
    (("[endpoint]\n", "[endpoint]\nprovider = {ignorre = [\"a\"]}\n"),
     "unknown key(s) in [endpoint.provider]: ignorre"),
    (("[endpoint]\n", "[endpoint]\nprovider = {quantizations = [\"fp5\"]}\n"), "fp5"),
    (("[endpoint]\n", "[endpoint]\nprovider = {only = \"a\"}\n"), "must be a list of strings"),
    (("[[dataset]]", "[budget]\nmax_cost_usd = -1\n[[dataset]]"), "budget.max_cost_usd must be >= 0"),
    (("[[dataset]]", "[engine]\ncommit_interval = 0\n[[dataset]]"), "engine.commit_interval"),
    (("[endpoint]\n", "[endpoint]\nstream_tick_ms = -1\n"), "endpoint.stream_tick_ms must be >= 0"),
    (("[[dataset]]", "[engine]\nevent_loop = \"trio\"\n[[dataset]]"), "engine.event_loop"),
    (("model = ", "renderer = \"nope\"\nmodel = "), "target.renderer 'nope' is unknown"),
    (("name = \"a\"", "name = \"a\"\nturns = \"every\""), "'dataset[0].turns' must be one of"),
    (("name = \"a\"", "name = \"a\"\nweight = 0.0"), "weight must be > 0"),
    (("name = \"a\"", "name = \"a\"\nlimit = -3"), "limit must be positive"),
    (("name = \"a\"", "name = \"a\"\non_length = \"trim\""), "on_length"),
    (("name = \"a\"", "name = \"a\"\nformat = \"csv\""), "format 'csv' is unknown"),
])
def test_bad_configs_are_named(tmp_path, edit, needle):
    old, new = edit
    text = (new + BASE) if old == "" else BASE.replace(old, new, 1)
    assert old == "" or old in BASE
    msg = error_of(tmp_path, text)
    assert needle in msg
    assert str(tmp_path / "run.toml") in msg


def test_duplicate_dataset_and_no_dataset(tmp_path):
    dup = BASE + '[[dataset]]\nname = "a"\npath = "data.jsonl"\n'
    assert "duplicate dataset name" in error_of(tmp_path, dup)
    assert "no [[dataset]] tables" in error_of(tmp_path, BASE.split("[[dataset]]")[0])


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")
    assert "invalid TOML" in error_of(tmp_path, BASE + "\n[[[")


def test_result_hashes_ignore_what_does_not_change_results(tmp_path):
    a = cfg_of(tmp_path)
    more = BASE.replace('base_url = "sim"', 'base_url = "sim"\nconcurrency = 7\n'
                        'provider = {ignore = ["x"]}') + "limit = 3\ntoken_budget = 9_000_000\n" \
        "[budget]\nmax_cost_usd = 1.0\n[engine]\ndrain_timeout = 1\n"
    b = cfg_of(tmp_path, more)
    assert a.result_hash() == b.result_hash()
    assert a.global_result_hash() == b.global_result_hash()

    hot = cfg_of(tmp_path, BASE + "[sampling]\ntemperature = 0.5\n")
    assert hot.global_result_hash() != a.global_result_hash()
    longer = cfg_of(tmp_path, BASE + "max_tokens = 99\n")
    assert longer.global_result_hash() == a.global_result_hash()
    assert longer.dataset_result_hash(longer.datasets[0]) != a.dataset_result_hash(a.datasets[0])
    # sampling.max_tokens only matters through the datasets that use it
    smax = cfg_of(tmp_path, BASE.replace('name = "a"', 'name = "a"\nmax_tokens = 50')
                  + "[sampling]\nmax_tokens = 77\n")
    same = cfg_of(tmp_path, BASE.replace('name = "a"', 'name = "a"\nmax_tokens = 50'))
    assert smax.result_hash() == same.result_hash()
    # adding a dataset leaves the global and existing datasets' hashes alone
    (tmp_path / "b.jsonl").write_text('{"prompt": "x"}\n')
    two = cfg_of(tmp_path, BASE + '[[dataset]]\nname = "b"\npath = "b.jsonl"\n')
    assert two.global_result_hash() == a.global_result_hash()
    assert two.dataset_result_hash(two.datasets[0]) == a.dataset_result_hash(a.datasets[0])
    assert two.result_hash() != a.result_hash()


def test_to_json_has_no_secret_and_is_plain(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-secret-123")
    cfg = cfg_of(tmp_path)
    import orjson

    blob = orjson.dumps(cfg.to_json())
    assert b"sk-or-secret-123" not in blob
    assert b"OPENROUTER_API_KEY" in blob  # the variable's name, not its value


def test_result_hash_uses_dataset_paths_as_written(tmp_path):
    """Shards of one config run from different directories (or machines) must hash alike,
    or `specgen merge` would refuse them; a different path as written is a different source."""
    here, there = tmp_path / "machine-a", tmp_path / "elsewhere" / "machine-b"
    here.mkdir()
    there.mkdir(parents=True)
    a, b = cfg_of(here), cfg_of(there)
    assert a.datasets[0].path != b.datasets[0].path  # resolved to different absolute paths
    assert a.result_hash() == b.result_hash()
    (there / "sub").mkdir()
    other = cfg_of(there, BASE.replace('path = "data.jsonl"', 'path = "./sub/../data.jsonl"'))
    assert other.result_hash() != a.result_hash()


def test_path_as_written_is_not_a_config_key(tmp_path):
    msg = error_of(tmp_path, BASE + 'path_as_written = "x"\n')
    assert "unknown key(s) in [dataset[0]]: path_as_written" in msg


def test_native_tool_ids_is_a_result_key(tmp_path):
    a = cfg_of(tmp_path)
    off = cfg_of(tmp_path, BASE + "native_tool_ids = false\n")
    assert a.datasets[0].native_tool_ids is None and off.datasets[0].native_tool_ids is False
    assert off.dataset_result_hash(off.datasets[0]) != a.dataset_result_hash(a.datasets[0])
    assert "native_tool_ids" in error_of(tmp_path, BASE + 'native_tool_ids = "yes"\n')


def test_tool_results_is_a_result_key_whose_default_keeps_old_runs(tmp_path):
    from specgen.planner import DEFAULT_TOOL_RESULTS

    a = cfg_of(tmp_path)
    assert a.datasets[0].tool_results == DEFAULT_TOOL_RESULTS == "name"
    named = cfg_of(tmp_path, BASE + 'tool_results = "name"\n')
    assert named.dataset_result_hash(named.datasets[0]) == a.dataset_result_hash(a.datasets[0])
    # the hash of a run made before the key (no tool_results in it) is the default's
    import orjson

    from specgen.config import RESULT_DATASET_KEYS, _hash

    d = orjson.loads(orjson.dumps(a.to_json()))["datasets"][0]
    legacy = {k: d[k] for k in RESULT_DATASET_KEYS if k != "tool_results"}
    legacy["path"], legacy["max_tokens"] = "data.jsonl", a.max_tokens_for(a.datasets[0])
    assert _hash(legacy) == a.dataset_result_hash(a.datasets[0])
    hashes = {a.dataset_result_hash(a.datasets[0])}
    for policy in ("strict", "position"):
        c = cfg_of(tmp_path, BASE + f'tool_results = "{policy}"\n')
        hashes.add(c.dataset_result_hash(c.datasets[0]))
    assert len(hashes) == 3


def test_bad_tool_results_names_the_dataset_and_key(tmp_path):
    msg = error_of(tmp_path, BASE + 'tool_results = "names"\n')
    assert "dataset[0] ('a')" in msg and "tool_results must be one of 'strict', 'name', " \
        "'position', not 'names'" in msg
    assert "'dataset[0].tool_results' must be str" in error_of(tmp_path, BASE + "tool_results = 1\n")
