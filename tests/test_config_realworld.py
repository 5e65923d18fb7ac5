"""Configs people really write wrong: NaN/inf, keys in URLs, cache headers, request fields that
swap the model or compress the prompt. Each is refused by a real `specgen run` process with
exit 2, one message naming the file and the key, no traceback, no run dir, and never the secret.
Plus the operational keys the engine reads (defaults, ranges, not in the result hash) and
`empty_datasets`."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from specgen.config import ConfigError, empty_datasets, load_config, parse_config, redact_url

BASE = """run_dir = "runs/x"
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
base_url = {base_url}
{endpoint}
[sampling]
max_tokens = 64
{sampling}
[budget]
{budget}
[engine]
{engine}
[[dataset]]
name = "a"
path = "data.jsonl"
{dataset}
"""


def config_text(*, base_url: str = '"sim"', endpoint: str = "", sampling: str = "",
                budget: str = "", engine: str = "", dataset: str = "", tail: str = "") -> str:
    if "api_key_env" not in endpoint:
        endpoint = 'api_key_env = "SPECGEN_TEST_KEY"\n' + endpoint
    return BASE.format(base_url=base_url, endpoint=endpoint, sampling=sampling, budget=budget,
                       engine=engine, dataset=dataset) + tail


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "data.jsonl").write_text('{"prompt": "hi"}\n')
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


# (id, config keyword arguments, text the message must hold, secrets it must not hold)
BAD = [
    ("nan-budget", dict(budget="max_cost_usd = nan"),
     "budget.max_cost_usd must be a finite number, got nan", []),
    ("inf-provider-max-price", dict(endpoint="[endpoint.provider]\nmax_price = {prompt = inf}"),
     "endpoint.provider.max_price.prompt must be a finite number, got inf", []),
    ("neg-inf-sampling-extra", dict(sampling="extra = {logit_bias = {x = [1.0, -inf]}}"),
     "sampling.extra.logit_bias.x[1] must be a finite number, got -inf", []),
    ("nan-temperature", dict(sampling="temperature = nan"),
     "sampling.temperature must be a finite number", []),
    ("nan-dataset-weight", dict(dataset="weight = nan"),
     "dataset[0].weight must be a finite number, got nan", []),
    ("inf-engine", dict(engine="commit_interval = inf"),
     "engine.commit_interval must be a finite number, got inf", []),
    ("nan-new-key", dict(engine="outage_timeout = nan"),
     "engine.outage_timeout must be a finite number", []),
    ("bool-for-number", dict(endpoint="concurrency = true"),
     "endpoint.concurrency' must be int, got bool", []),
    ("bool-for-float", dict(budget="max_cost_usd = true"),
     "'budget.max_cost_usd' must be float, got bool", []),
    ("url-user-password", dict(base_url='"https://alice:S3cretPass99@openrouter.ai/api/v1"'),
     "endpoint.base_url 'https://***@openrouter.ai/api/v1' carries credentials",
     ["S3cretPass99", "alice"]),
    ("url-user-only", dict(base_url='"https://sk-or-v1-deadbeefcafe@openrouter.ai/api/v1"'),
     "https://***@openrouter.ai/api/v1", ["sk-or-v1-deadbeefcafe", "deadbeef"]),
    ("url-query-api-key", dict(base_url='"https://llm.example.com/v1?api_key=sk-QQQ111&x=1"'),
     "'https://llm.example.com/v1?api_key=***&x=1'", ["sk-QQQ111"]),
    ("url-query-key-upper", dict(base_url='"https://llm.example.com/v1?KEY=ZZZ222"'),
     "KEY=***", ["ZZZ222"]),
    ("url-query-token", dict(base_url='"https://llm.example.com/v1?token=TTT333"'),
     "endpoint.base_url", ["TTT333"]),
    ("url-query-access-token", dict(base_url='"http://10.0.0.5:8000/v1?Access_Token=AAA444"'),
     "endpoint.base_url", ["AAA444"]),
    ("url-list-second", dict(base_url='["http://127.0.0.1:8000/v1", "http://bob:PW555@h:9/v1"]'),
     "endpoint.base_url[1] 'http://***@h:9/v1'", ["PW555", "bob"]),
    ("url-bad-scheme-with-creds", dict(base_url='"ftp://u:PW666@host/x"'),
     "endpoint.base_url", ["PW666"]),
    ("key-pasted-into-api-key-env",
     dict(endpoint='api_key_env = "sk-or-v1-0123abcd-PASTED"'),
     "endpoint.api_key_env must be the NAME of an environment variable", ["PASTED"]),
    ("cache-header", dict(endpoint='headers = {"X-OpenRouter-Cache" = "true"}'),
     "endpoint.headers.X-OpenRouter-Cache turns on OpenRouter's response cache", []),
    ("cache-header-lowercase-suffix", dict(endpoint='headers = {"x-openrouter-cache-ttl" = "60"}'),
     "endpoint.headers.x-openrouter-cache-ttl", []),
    ("extra-models", dict(sampling='extra = {models = ["openai/gpt-4o"]}'),
     "sampling.extra.models turns on OpenRouter's fallback to other models", []),
    ("extra-transforms", dict(sampling='extra = {transforms = ["middle-out"]}'),
     "sampling.extra.transforms", []),
    ("extra-plugin-compression",
     dict(sampling='extra = {plugins = [{id = "web"}, {id = "context-compression"}]}'),
     "sampling.extra.plugins[1] is OpenRouter's \"context-compression\" plugin", []),
    ("extra-model", dict(sampling='extra = {model = "other/model"}'),
     "sampling.extra.model cannot be set", []),
    ("extra-messages", dict(sampling='extra = {messages = []}'),
     "sampling.extra.messages cannot be set", []),
    ("extra-tools", dict(sampling='extra = {tools = []}'), "sampling.extra.tools cannot be set", []),
    ("outage-timeout-zero", dict(engine="outage_timeout = 0"), "engine.outage_timeout must be > 0", []),
    ("retry-after-cap-negative", dict(engine="retry_after_cap = -1"),
     "engine.retry_after_cap must be > 0", []),
    ("store-error-timeout-zero", dict(engine="store_error_timeout = 0"),
     "engine.store_error_timeout must be > 0", []),
    ("ballast-negative", dict(engine="ballast_mb = -1"), "engine.ballast_mb must be >= 0", []),
    ("outage-probe-max-zero", dict(endpoint="outage_probe_max = 0"),
     "endpoint.outage_probe_max must be > 0", []),
    ("accept-models-empty", dict(endpoint='accept_models = ["moonshotai/kimi-k2.5-x", " "]'),
     "endpoint.accept_models[1] must not be empty", []),
    ("accept-models-not-list", dict(endpoint='accept_models = "a/b"'),
     "'endpoint.accept_models' must be a list", []),
    ("shrink-max-tokens-not-bool", dict(budget='shrink_max_tokens = "yes"'),
     "'budget.shrink_max_tokens' must be bool", []),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Every bad config run by a real `specgen run` process (a few at a time, for speed)."""
    env = {**os.environ, "SPECGEN_TEST_KEY": "k", "PYTHONUNBUFFERED": "1"}

    def one(name: str, kw: dict) -> tuple[Path, subprocess.CompletedProcess]:
        d = tmp_path_factory.mktemp(name)
        cfg = write(d, config_text(**kw))
        return d, subprocess.run([sys.executable, "-m", "specgen", "run", str(cfg), "--no-live"],
                                 cwd=d, env=env, capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(one, name, kw) for name, kw, _, _ in BAD}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize(("name", "kw", "needle", "secrets"), BAD, ids=[b[0] for b in BAD])
def test_bad_config_is_refused_by_specgen_run(refused, name, kw, needle, secrets):
    d, proc = refused[name]
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr
    assert err.startswith(f"specgen run: {d / 'run.toml'}: "), err
    assert needle in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for secret in secrets:
        assert secret not in err and secret not in proc.stdout
    assert sorted(p.name for p in d.iterdir()) == ["data.jsonl", "run.toml"]  # no run dir
    assert not (d / "runs").exists()


def test_credentials_message_points_at_api_key_env(refused):
    err = refused["url-user-password"][1].stderr
    assert "environment variable named by endpoint.api_key_env (SPECGEN_TEST_KEY)" in err


def test_cache_and_plugin_messages_say_why(refused):
    assert "replayed" in refused["cache-header"][1].stderr
    assert "other model" in refused["extra-models"][1].stderr
    assert "compress" in refused["extra-transforms"][1].stderr


# -- in-process: what is accepted, defaults, hashes ----------------------------------------

def cfg_of(tmp_path: Path, **kw):
    return load_config(write(tmp_path, config_text(**kw)))


def test_new_operational_keys_have_defaults(tmp_path):
    cfg = cfg_of(tmp_path)
    e = cfg.engine
    assert (e.outage_timeout, e.retry_after_cap, e.store_error_timeout, e.ballast_mb) == (
        1800.0, 300.0, 600.0, 64.0)
    assert cfg.budget.shrink_max_tokens is False
    assert cfg.endpoint.accept_models == [] and cfg.endpoint.outage_probe_max == 30.0


def test_new_keys_accept_valid_values(tmp_path):
    cfg = cfg_of(tmp_path, engine="outage_timeout = 60\nretry_after_cap = 5.5\n"
                                   "store_error_timeout = 1\nballast_mb = 0",
                 endpoint='accept_models = ["moonshotai/kimi-k2.5-turbo"]\noutage_probe_max = 2',
                 budget="shrink_max_tokens = true")
    assert cfg.engine.outage_timeout == 60.0 and isinstance(cfg.engine.outage_timeout, float)
    assert cfg.engine.ballast_mb == 0.0 and cfg.engine.retry_after_cap == 5.5
    assert cfg.endpoint.accept_models == ["moonshotai/kimi-k2.5-turbo"]
    assert cfg.endpoint.outage_probe_max == 2.0 and cfg.budget.shrink_max_tokens is True


def test_operational_keys_do_not_change_the_result_hash(tmp_path):
    base = cfg_of(tmp_path)
    changed = cfg_of(tmp_path, engine="outage_timeout = 5\nretry_after_cap = 7\n"
                                       "store_error_timeout = 9\nballast_mb = 0",
                     endpoint='accept_models = ["x/y"]\noutage_probe_max = 1',
                     budget="shrink_max_tokens = true")
    assert changed.engine.outage_timeout == 5.0  # really changed
    assert changed.result_hash() == base.result_hash()
    assert changed.global_result_hash() == base.global_result_hash()
    assert [changed.dataset_result_hash(d) for d in changed.datasets] == [
        base.dataset_result_hash(d) for d in base.datasets]


def test_harmless_extras_and_urls_are_accepted(tmp_path):
    cfg = cfg_of(tmp_path, base_url='"https://llm.example.com/v1?monkey=1&max_tokens=3"',
                 sampling='extra = {transforms = [], plugins = [{id = "web"}], '
                          'repetition_penalty = 1.05, provider = {allow_fallbacks = true}}',
                 endpoint='headers = {"HTTP-Referer" = "https://example.com", '
                          '"X-OpenRouter-Title" = "specgen"}')
    assert cfg.sampling.extra["transforms"] == []
    assert cfg.endpoint.base_url == ["https://llm.example.com/v1?monkey=1&max_tokens=3"]


def test_redact_url():
    assert redact_url("https://u:p@h.example/v1") == ("https://***@h.example/v1", True)
    assert redact_url("https://h/v1?a=1&Api_Key=s&b=2#access_token=t") == (
        "https://h/v1?a=1&Api_Key=***&b=2#access_token=***", True)
    assert redact_url("https://h:8/v1?page=2") == ("https://h:8/v1?page=2", False)
    shown, secret = redact_url("http://[::1:u:p@bad/x")  # unparsable: hidden entirely
    assert secret and "u:p" not in shown


def test_finite_check_covers_raw_dicts(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"prompt": "x"}\n')
    raw = {"run_dir": "r", "target": {"model": "m/k", "tokenizer": "demo"},
           "endpoint": {"base_url": "sim"}, "sampling": {"top_p": float("nan")},
           "dataset": [{"name": "a", "path": str(tmp_path / "d.jsonl")}]}
    with pytest.raises(ConfigError, match=r"run.toml: sampling.top_p must be a finite number"):
        parse_config(raw, tmp_path / "run.toml")


def test_parse_config_creates_nothing(tmp_path):
    cfg = cfg_of(tmp_path, tail="")
    assert not cfg.run_dir.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "run.toml"]


# -- empty datasets ------------------------------------------------------------------------

def test_empty_datasets_are_accepted_and_listed(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = {
        "zero.jsonl": b"",
        "blank.jsonl": b"\n  \n\t\n",
        "bom.ndjson": b"\xef\xbb\xbf\n\n",
        "zero.json": b"",
        "full.jsonl": b'\n{"prompt": "hi"}\n',
        "blank.jsonl.gz": gzip.compress(b"\n\n\n"),
        "full.jsonl.gz": gzip.compress(b'{"prompt": "hi"}\n'),
        "long-blank.jsonl": b"\n" * (70 * 1024),  # past the cheap probe: not reported
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    pq.write_table(pa.table({"prompt": ["a"]}), tmp_path / "p.parquet")
    (tmp_path / "folder").mkdir()
    names = [*files, "p.parquet", "folder"]
    tables = "".join(f'[[dataset]]\nname = "{n}"\npath = "{n}"\n' for n in names)
    text = config_text().split("[[dataset]]")[0] + tables
    path = tmp_path / "run.toml"
    path.write_text(text)
    cfg = load_config(path)  # empty files are no error
    assert [d.name for d in empty_datasets(cfg)] == [
        "zero.jsonl", "blank.jsonl", "bom.ndjson", "zero.json", "blank.jsonl.gz"]
