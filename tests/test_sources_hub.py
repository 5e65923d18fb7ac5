"""`path = "hf://datasets/OWNER/NAME"`: runs against a Hub written in the test
(tests/hub_server.py, on 127.0.0.1; HF_ENDPOINT points at it, HF_HOME at tmp_path): a subset
and split read and pinned to a commit, a moved branch that changes nothing, kill -9 mid-download
and mid-run, offline from the cache, a gated repo, the Parquet-conversion branch, preview."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hub_server import FakeHub
from specgen.store import Store
from test_engine_support import (
    ENV,
    SPECGEN,
    check_store,
    count,
    run_cli,
    start_cli,
    wait_for,
    write_config,
)

CONFIGS_README = b"""---
license: mit
configs:
- config_name: chat
  data_files:
  - split: train
    path: chat/train-*.parquet
  - split: test
    path: chat/test-*.parquet
- config_name: other
  data_files: other/*.jsonl
---
# A dataset card
"""


def parquet(rows: list[dict]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def chat_rows(n: int, prefix: str) -> list[dict]:
    return [{"prompt_id": f"{prefix}{i}", "messages": [
        {"role": "user", "content": f"{prefix} question {i}: say something short."},
        {"role": "assistant", "content": "Something short."}]} for i in range(n)]


@pytest.fixture
def hub():
    h = FakeHub()
    h.url = h.start()
    yield h
    h.stop()


def hf_env(tmp_path, hub, **more) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_ETAG_TIMEOUT": "5", **more}


def hub_config(tmp_path, dataset: dict, name: str = "run", sim: str = "") -> object:
    sim_cfg = tmp_path / f"{name}-sim.toml"
    sim_cfg.write_text(sim or "[length]\ndistribution = \"fixed\"\ntokens = 12\n"
                       "[[providers]]\nname = \"P\"\ntag = \"p/bf16\"\nquantization = \"bf16\"\n"
                       "latency_s = 0.0\n")
    return write_config(tmp_path, "sim", [{"name": "d", **dataset}], name=name,
                        extra=f'\n[sim]\nconfig = "{sim_cfg}"\n')


def data_gets(hub, suffix: str) -> list[tuple]:
    return [r for r in hub.requests if r[0] == "GET" and r[1].endswith(suffix)]


def pin(run_dir) -> dict:
    with Store.open(run_dir) as s:
        return json.loads(s.get_meta("hub:d"))


def test_run_reads_the_subset_split_pins_the_commit_and_keeps_it_when_the_branch_moves(
        tmp_path, hub):
    first = hub.commit("org/mix", {
        "README.md": CONFIGS_README,
        "chat/train-00000-of-00001.parquet": parquet(chat_rows(7, "tr")),
        "chat/test-00000-of-00001.parquet": parquet(chat_rows(3, "te")),
        "other/a.jsonl": b'{"messages": []}\n'})
    cfg = hub_config(tmp_path, {"path": "hf://datasets/org/mix", "subset": "chat",
                                "split": "test", "format": "openai"})
    env = hf_env(tmp_path, hub)
    r = run_cli(cfg, env=env)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "run-dir"
    assert count(run_dir, "SELECT COUNT(*) FROM results") == 3  # the test split only
    p = pin(run_dir)
    assert (p["commit"], p["subset"], p["split"]) == (first, "chat", "test")
    assert [f["path"] for f in p["files"]] == ["chat/test-00000-of-00001.parquet"]
    assert not data_gets(hub, "train-00000-of-00001.parquet")  # only what the split needs
    assert not data_gets(hub, "a.jsonl")
    assert f"at commit {first[:12]}" in r.stdout
    # upstream moves: more rows on main; the run keeps reading its pinned commit
    moved = hub.commit("org/mix", {"chat/test-00000-of-00001.parquet": parquet(
        chat_rows(9, "new"))})
    hub.requests.clear()
    r2 = run_cli(cfg, env=env)
    assert r2.returncode == 0, r2.stderr
    assert f"now points at {moved[:12]}" in r2.stderr
    assert "keeps reading its pinned commit" in r2.stderr
    assert f"moved to {moved[:12]}" in r2.stdout  # the summary says so too
    assert count(run_dir, "SELECT COUNT(*) FROM results") == 3
    assert not any(moved in r[1] for r in hub.requests if "/resolve/" in r[1])
    assert pin(run_dir)["commit"] == first
    # the export manifest and the report name dataset, subset, split and commit
    ex = subprocess.run([*SPECGEN, "export", str(run_dir), "--format", "openai",
                         "-o", str(tmp_path / "out.jsonl")],
                        capture_output=True, text=True, timeout=120)
    assert ex.returncode == 0, ex.stderr
    manifest = json.loads((tmp_path / "out.manifest.json").read_text())
    src = manifest["sources"]["d"]
    assert (src["source"], src["subset"], src["split"], src["commit"]) == (
        "hf://datasets/org/mix", "chat", "test", first)
    rep = subprocess.run([*SPECGEN, "report", str(run_dir), "--text"], capture_output=True,
                         text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr
    report = rep.stdout
    assert "hf://datasets/org/mix subset chat split test" in report
    assert first[:12] in report
    # offline: the pinned commit comes from the cache, the Hub is never asked
    hub.requests.clear()
    r3 = run_cli(cfg, env={**env, "HF_HUB_OFFLINE": "1"})
    assert r3.returncode == 0, r3.stderr
    assert hub.requests == []


def test_offline_uses_a_cached_commit_and_names_what_is_missing(tmp_path, hub):
    first = hub.commit("org/plain", {
        "data/train-00000-of-00001.parquet": parquet(chat_rows(4, "a")),
        "data/test-00000-of-00001.parquet": parquet(chat_rows(2, "b"))})
    env = hf_env(tmp_path, hub)
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    cfg = hub_config(tmp_path, {"path": "hf://datasets/org/plain", "split": "train"})
    r = run_cli(cfg, env=offline)  # nothing cached yet
    assert r.returncode == 2
    assert "HF_HUB_OFFLINE" in r.stderr and "org/plain" in r.stderr
    assert "download it first" in r.stderr and "Traceback" not in r.stderr
    assert hub.requests == []
    assert run_cli(cfg, env=env).returncode == 0  # online: downloads train
    # a new run, offline, same revision: the cached commit of `main`, no request at all
    hub.requests.clear()
    cfg2 = hub_config(tmp_path, {"path": "hf://datasets/org/plain", "split": "train"},
                      name="again")
    r2 = run_cli(cfg2, env=offline)
    assert r2.returncode == 0, r2.stderr
    assert hub.requests == []
    assert pin(tmp_path / "again-dir")["commit"] == first
    assert count(tmp_path / "again-dir", "SELECT COUNT(*) FROM results") == 4
    # offline, a split never downloaded: a clear error naming the file to download
    cfg3 = hub_config(tmp_path, {"path": "hf://datasets/org/plain", "split": "test"},
                      name="other")
    r3 = run_cli(cfg3, env=offline)
    assert r3.returncode == 2
    assert "org/plain" in r3.stderr
    # the Hub down (no HF_HUB_OFFLINE): the pinned run still resumes from the cache
    hub.stop()
    r4 = run_cli(cfg2, env=env)
    assert r4.returncode == 0, r4.stderr


def test_gated_dataset_without_token_says_so_and_the_token_never_shows(tmp_path, hub):
    hub.commit("org/gated", {"train.jsonl": b'{"id": "g0", "messages": [{"role": "user", '
                                            b'"content": "hello there"}]}\n'})
    hub.gated.add("org/gated")
    cfg = hub_config(tmp_path, {"path": "hf://datasets/org/gated"})
    env = hf_env(tmp_path, hub)
    r = run_cli(cfg, env=env)
    assert r.returncode == 2
    assert "gated" in r.stderr and "HF_TOKEN" in r.stderr and "Traceback" not in r.stderr
    token = "hf_SeCrEtToKeN1234567890"
    r2 = run_cli(cfg, env={**env, "HF_TOKEN": token})
    assert r2.returncode == 0, r2.stderr
    assert all(r[3] for r in hub.requests[-3:])  # the token was sent
    run_dir = tmp_path / "run-dir"
    seen = r2.stdout + r2.stderr + "".join(
        p.read_bytes().decode("latin-1") for p in run_dir.rglob("*") if p.is_file())
    assert token not in seen


def test_loading_script_repo_reads_its_parquet_conversion(tmp_path, hub):
    main = hub.commit("org/scripted", {"scripted.py": b"# a loading script\n",
                                       "dataset_infos.json": b"{}",
                                       "README.md": b"# card without configs\n"})
    conv = hub.commit("org/scripted", {
        "default/train/0000.parquet": parquet(chat_rows(3, "c")),
        "default/validation/0000.parquet": parquet(chat_rows(1, "v"))},
        branch="refs/convert/parquet", parent="")
    cfg = hub_config(tmp_path, {"path": "hf://datasets/org/scripted", "split": "train"})
    r = run_cli(cfg, env=hf_env(tmp_path, hub))
    assert r.returncode == 0, r.stderr
    p = pin(tmp_path / "run-dir")
    assert (p["commit"], p["data_revision"], p["layout"]) == (main, conv, "refs/convert/parquet")
    assert count(tmp_path / "run-dir", "SELECT COUNT(*) FROM results") == 3
    assert not data_gets(hub, "validation/0000.parquet")


def test_kill9_mid_download_resumes_the_file_then_kill9_mid_run_resumes_the_run(
        tmp_path, hub):
    rows = [{"prompt_id": f"k{i}", "messages": [{"role": "user", "content": f"k{i} " + "x" * 300}]}
            for i in range(40)]
    blob = "".join(json.dumps(r) + "\n" for r in rows).encode()
    hub.commit("org/big", {"data/train.jsonl": blob})
    hub.slow["data/train.jsonl"] = 0.01  # 1 KiB per 10 ms: about a second and a half
    slow_sim = ("[length]\ndistribution = \"fixed\"\ntokens = 12\n[[providers]]\nname = \"P\"\n"
                "tag = \"p/bf16\"\nquantization = \"bf16\"\nlatency_s = 0.4\n")
    cfg = hub_config(tmp_path, {"path": "hf://datasets/org/big"}, sim=slow_sim)
    env = hf_env(tmp_path, hub)
    blobs = tmp_path / "hf" / "hub" / "datasets--org--big" / "blobs"

    def partial() -> int:
        parts = list(blobs.glob("*.incomplete")) if blobs.is_dir() else []
        return parts[0].stat().st_size if parts else 0

    proc = start_cli(cfg, env=env)
    wait_for(lambda: partial() > 4096, timeout=60, what="a partial download")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    had = partial()
    assert 0 < had < len(blob)
    hub.slow.clear()
    run_dir = tmp_path / "run-dir"
    proc = start_cli(cfg, env=env)  # resumes the download, then starts sending
    wait_for(lambda: count(run_dir, "SELECT COUNT(*) FROM results") >= 3, timeout=60,
             what="some results")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    ranges = [r[2] for r in data_gets(hub, "data/train.jsonl") if r[2]]
    assert ranges and int(ranges[0].split("=")[1].split("-")[0]) >= had  # continued, not redone
    gets_before = len(data_gets(hub, "data/train.jsonl"))
    r = run_cli(cfg, env=env)
    assert r.returncode == 0, r.stderr
    assert len(data_gets(hub, "data/train.jsonl")) == gets_before  # no download in session 3
    assert count(run_dir, "SELECT COUNT(*) FROM results") == 40
    check_store(run_dir)
    cached = next((tmp_path / "hf" / "hub" / "datasets--org--big" / "snapshots").rglob(
        "train.jsonl"))
    assert cached.read_bytes() == blob


def test_preview_lists_files_and_sizes_before_downloading_anything(tmp_path, hub):
    data = parquet(chat_rows(5, "p"))
    hub.commit("org/mix", {"README.md": CONFIGS_README,
                           "chat/train-00000-of-00001.parquet": data,
                           "chat/test-00000-of-00001.parquet": parquet(chat_rows(2, "q"))})
    cfg = hub_config(tmp_path, {"path": "hf://datasets/org/mix", "subset": "chat"})
    env = hf_env(tmp_path, hub)
    r = subprocess.run([*SPECGEN, "preview", str(cfg), "--no-color"], capture_output=True,
                       text=True, timeout=120, env={**ENV, **env})
    assert r.returncode == 0, r.stderr
    assert "chat/train-00000-of-00001.parquet" in r.stdout
    assert f"{len(data):,} bytes" in r.stdout and "to download" in r.stdout
    assert not data_gets(hub, ".parquet")  # nothing downloaded
    r2 = subprocess.run([*SPECGEN, "preview", str(cfg), "--download", "--json"],
                        capture_output=True, text=True, timeout=120, env={**ENV, **env})
    assert r2.returncode == 0, r2.stderr
    d = json.loads(r2.stdout)["datasets"][0]
    assert d["hub"]["files"][0]["cached"] is False  # listed as it was before the download
    assert d["rows_readable"] == 5 and d["samples"]
    assert d["samples"][0]["body"]["messages"][0]["content"].startswith("p question")


def test_config_rejects_a_malformed_hub_path(tmp_path):
    cfg = hub_config(tmp_path, {"path": "hf://datasets/justname"})
    r = run_cli(cfg)
    assert r.returncode == 2
    assert "hf://datasets/OWNER/NAME" in r.stderr


# -- the recipe: examples/hub-mix.toml against small copies shaped like each dataset ---------

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def recipe_copies(hub: FakeHub) -> None:
    """Each recipe dataset at its real repo name, layout and field names (a few rows)."""
    glaive = [json.loads(line) for line in
              (EXAMPLES / "data" / "glaive_tools.jsonl").read_text().splitlines() if line]
    hub.commit("glaiveai/glaive-function-calling-v2", {
        "README.md": b"---\nlicense: apache-2.0\ntask_categories:\n- text-generation\n---\n",
        "glaive-function-calling-v2.json": json.dumps(glaive, indent=2).encode()})
    mot = [json.loads(line) for line in
           (EXAMPLES / "data" / "reasoning.jsonl").read_text().splitlines() if line]
    configs = "".join(f"- config_name: {c}\n  data_files:\n  - split: train\n    path: {c}/train-*\n"
                      for c in ("all", "code", "math", "science"))
    hub.commit("open-r1/Mixture-of-Thoughts", {
        "README.md": f"---\nconfigs:\n{configs}---\n# Mixture-of-Thoughts\n".encode(),
        "all/train-00000-of-00002.parquet": parquet(mot[:2]),
        "all/train-00001-of-00002.parquet": parquet(mot[2:]),
        "math/train-00000-of-00001.parquet": parquet(mot[:1])})
    chat = [{"prompt": f"Tell me about topic {i}.", "prompt_id": f"uc{i:04d}", "messages": [
        {"role": "user", "content": f"Tell me about topic {i}."},
        {"role": "assistant", "content": f"Topic {i} is interesting."},
        {"role": "user", "content": "Give one more detail."},
        {"role": "assistant", "content": "Here is one more."}]} for i in range(4)]
    splits = "".join(f"  - split: {s}\n    path: data/{s}-*\n"
                     for s in ("train_sft", "test_sft", "train_gen", "test_gen"))
    hub.commit("HuggingFaceH4/ultrachat_200k", {
        "README.md": f"---\nlicense: mit\nconfigs:\n- config_name: default\n  data_files:\n"
                     f"{splits}---\n".encode(),
        "data/train_sft-00000-of-00001-0a1b2c3d.parquet": parquet(chat),
        "data/test_sft-00000-of-00001-4e5f6a7b.parquet": parquet(chat[:1]),
        "data/train_gen-00000-of-00001-8c9d0e1f.parquet": parquet(chat[:2])})


def recipe_for_sim(tmp_path) -> object:
    """examples/hub-mix.toml as it ships, pointed at the simulator and kept small."""
    text = (EXAMPLES / "hub-mix.toml").read_text()
    subs = [(r'run_dir = ".*"', f'run_dir = "{tmp_path / "mix-dir"}"'),
            (r'base_url = ".*"', 'base_url = "sim"\nreturn_token_ids = true'),
            (r'tokenizer = ".*?"', 'tokenizer = "demo"'),
            (r"limit = [\d_]+", "limit = 2")]
    for pattern, new in subs:
        text, n = re.subn(pattern, new, text)
        assert n, pattern
    sim = tmp_path / "mix-sim.toml"
    sim.write_text("[length]\ndistribution = \"fixed\"\ntokens = 16\n[tool_calls]\nrate = 0.9\n"
                   "rate_after_result = 0.05\n[[providers]]\nname = \"P\"\ntag = \"p/int4\"\n"
                   "quantization = \"int4\"\nprompt_price_per_m = 0.6\n"
                   "completion_price_per_m = 3.0\nlatency_s = 0.0\n")
    text = text.replace("[[dataset]]", f'[sim]\nconfig = "{sim}"\n\n[[dataset]]', 1)
    path = tmp_path / "hub-mix.toml"
    path.write_text(text)
    return path


def test_recipe_previews_and_runs_against_the_simulator(tmp_path, hub):
    recipe_copies(hub)
    cfg = recipe_for_sim(tmp_path)
    env = {**ENV, **hf_env(tmp_path, hub), "OPENROUTER_API_KEY": "sk-test"}
    r = subprocess.run([*SPECGEN, "preview", str(cfg), "--no-color"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    for f in ("glaive-function-calling-v2.json", "all/train-00000-of-00002.parquet",
              "data/train_sft-00000-of-00001-0a1b2c3d.parquet"):
        assert f in r.stdout
    assert "math/train" not in r.stdout and "test_sft" not in r.stdout
    assert not [q for q in hub.requests if q[0] == "GET" and "/resolve/" in q[1]
                and not q[1].endswith("README.md")]
    r2 = subprocess.run([*SPECGEN, "preview", str(cfg), "--download", "--json", "-n", "1"],
                        capture_output=True, text=True, timeout=120, env=env)
    assert r2.returncode == 0, r2.stderr
    by = {d["name"]: d for d in json.loads(r2.stdout)["datasets"]}
    glaive = by["glaive"]["samples"][0]["body"]
    assert glaive["tools"][0]["type"] == "function"  # definitions sent as real tools
    assert "{" not in glaive["messages"][0]["content"]  # not left in the system text
    assert by["glaive"]["format"] == "glaive"
    reasoning = by["reasoning"]["samples"][0]["body"]
    assert reasoning["messages"][-1]["role"] == "user" and "tools" not in reasoning
    assert by["reasoning"]["hub"]["subset"] == "all" and len(by["reasoning"]["hub"]["files"]) == 2
    chat = by["chat"]["samples"][0]
    assert by["chat"]["hub"]["split"] == "train_sft"
    assert chat["conversation_id"].startswith("uc")  # prompt_id is the conversation id
    run = run_cli(cfg, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    run_dir = tmp_path / "mix-dir"
    for name in ("glaive", "reasoning", "chat"):
        assert count(run_dir, "SELECT COUNT(*) FROM results r JOIN tasks t ON t.id=r.task "
                     "JOIN conversations c ON c.id=t.conversation WHERE c.dataset=?",
                     (name,)) > 0, name
    with Store.open(run_dir) as s:
        pins = {k: json.loads(v) for k, v in s.meta().items() if k.startswith("hub:")}
    assert {p["repo"] for p in pins.values()} == {
        "glaiveai/glaive-function-calling-v2", "open-r1/Mixture-of-Thoughts",
        "HuggingFaceH4/ultrachat_200k"}


def test_probe_takes_canaries_from_a_cached_hub_dataset_and_downloads_nothing(
        tmp_path, hub, monkeypatch):
    from huggingface_hub import constants

    from specgen.config import load_config
    from specgen.probe.suite import config_canaries

    hub.commit("org/plain", {"data/train-0.parquet": parquet(chat_rows(3, "pr"))})
    cfg_path = hub_config(tmp_path, {"path": "hf://datasets/org/plain"})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    tools, plain = config_canaries(load_config(cfg_path))
    assert tools == plain == []  # nothing cached: no canaries, no download
    assert hub.requests == []
    r = subprocess.run([*SPECGEN, "preview", str(cfg_path), "--download", "--json"],
                       capture_output=True, text=True, timeout=120,
                       env={**ENV, **hf_env(tmp_path, hub)})
    assert r.returncode == 0, r.stderr
    hub.requests.clear()
    tools, plain = config_canaries(load_config(cfg_path))
    assert [c.id for c in plain] == ["d/pr0", "d/pr1", "d/pr2"]
    assert hub.requests == []
