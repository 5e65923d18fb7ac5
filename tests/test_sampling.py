"""Sampling as the model card says, and per-dataset mixes (specgen.sampling): defaults only
where the config is silent, mixes drawn reproducibly from the task's identity, the values
sent and recorded on every sample, and result hashes that let runs made before the keys
resume. The engine tests run against a real `specgen sim` over HTTP with real SQLite."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import orjson
import pytest

from specgen.config import ConfigError, load_config
from specgen.engine.runner import RunError, RunOptions, run
from specgen.export.core import ExportOptions, export_run
from specgen.planner import TurnRequest
from specgen.request import build_request
from specgen.sampling import draw, pick, sample_settings
from specgen.store import Store
from specgen.verify import verify_run
from test_engine_support import (
    SimProcess,
    check_store,
    multi_turn_rows,
    prompt_rows,
    write_config,
    write_jsonl,
)

BASE = """run_dir = "runs/x"
[target]
model = "{model}"
tokenizer = "demo"
[endpoint]
base_url = "sim"
{sampling}
[[dataset]]
name = "a"
path = "data.jsonl"
{dataset}
"""


def cfg_of(tmp_path, *, sampling: str = "", dataset: str = "",
           model: str = "moonshotai/kimi-k2.5"):
    (tmp_path / "data.jsonl").write_text('{"prompt": "hi"}\n')
    path = tmp_path / "run.toml"
    path.write_text(BASE.format(model=model, sampling=sampling, dataset=dataset))
    return load_config(path)


def body(cfg, conv_id: str = "c", turn: int = 1) -> dict:
    ds = cfg.datasets[0]
    req = TurnRequest(turn=turn, messages=[{"role": "user", "content": "hi"}], tools=None)
    return build_request(cfg, ds, req, settings=sample_settings(cfg, ds, conv_id, turn))


# -- defaults only where the config is silent -------------------------------------------------
@pytest.mark.parametrize(("sampling", "dataset", "want"), [
    ("", "", (1.0, 0.95)),  # K2.5 thinking: the model card's
    ("[sampling]\nreasoning = false", "", (0.6, 0.95)),  # instant mode
    ("[sampling]\nreasoning = {effort = \"none\"}", "", (0.6, 0.95)),
    ("", "reasoning = false", (0.6, 0.95)),  # the dataset's own thinking mode
    ("[sampling]\ntemperature = 0.3", "", (0.3, 0.95)),  # set: kept; top_p still silent
    ("[sampling]\ntop_p = 0.8\nreasoning = false", "", (0.6, 0.8)),
    ("[sampling]\ntemperature = 0.7", "temperature = 0.2", (0.2, 0.95)),  # dataset wins
    ("[sampling]\nmodel_defaults = false", "", (1.0, None)),  # what specgen sent before
    ("[sampling]\nmodel_defaults = false\nreasoning = false", "", (1.0, None)),
])
def test_model_card_defaults_fill_only_silent_keys(tmp_path, sampling, dataset, want):
    b = body(cfg_of(tmp_path, sampling=sampling, dataset=dataset))
    assert (b.get("temperature"), b.get("top_p")) == want


def test_a_model_without_a_card_keeps_the_generic_default(tmp_path):
    cfg = cfg_of(tmp_path, model="acme/other-model")
    b = body(cfg)
    assert b["temperature"] == 1.0 and "top_p" not in b
    st = sample_settings(cfg, cfg.datasets[0], "c", 1)
    assert st.from_model_card == ()


def test_the_record_says_where_each_value_came_from(tmp_path):
    cfg = cfg_of(tmp_path, sampling="[sampling]\ntemperature = 0.5")
    rec = sample_settings(cfg, cfg.datasets[0], "c", 1).to_json()
    assert rec == {"sample": 0, "temperature": 0.5, "top_p": 0.95, "reasoning": True,
                   "thinking": True, "model_card": ["top_p"]}


# -- mixes --------------------------------------------------------------------------------------
def test_draws_depend_on_the_task_identity_only_and_follow_the_weights():
    assert draw("a", "c1", 1, "t") == draw("a", "c1", 1, "t")
    assert draw("a", "c1", 1, "t") != draw("a", "c1", 3, "t")
    assert pick(["x", "y"], [3, 1], 0.74) == "x" and pick(["x", "y"], [3, 1], 0.76) == "y"
    got = Counter(pick([0.6, 1.0], [3, 1], draw("d", f"c{i}", 1, "temperature"))
                  for i in range(4000))
    assert 0.70 < got[0.6] / 4000 < 0.80


def test_reasoning_is_drawn_per_conversation_temperature_per_request(tmp_path):
    cfg = cfg_of(tmp_path, dataset='temperature = [0.2, 0.4, 0.6, 0.8]\n'
                                   'reasoning = [{effort = "low"}, {effort = "high"}, false]')
    ds = cfg.datasets[0]
    for conv in ("c1", "c2", "c3", "c4"):
        turns = [sample_settings(cfg, ds, conv, t) for t in (1, 3, 5, 7, 9, 11)]
        assert len({json.dumps(s.reasoning) for s in turns}) == 1
        assert len({s.temperature for s in turns}) > 1
    modes = {sample_settings(cfg, ds, f"c{i}", 1).thinking for i in range(30)}
    assert modes == {True, False}
    off = next(sample_settings(cfg, ds, f"c{i}", 1) for i in range(30)
               if not sample_settings(cfg, ds, f"c{i}", 1).thinking)
    assert off.reasoning is False and off.top_p == 0.95  # the mix says; the card fills top_p


@pytest.mark.parametrize(("dataset", "needle"), [
    ("n = 0", "n (samples per prompt) must be >= 1, got 0"),
    ("temperature = []", "temperature = [] has nothing to draw from"),
    ("temperature = [0.5, 3.0]", "temperature[1] must be between 0 and 2, got 3.0"),
    ("temperature = -1", "temperature must be between 0 and 2"),
    ("temperature = 0.5\ntemperature_weights = [1]", "temperature_weights needs temperature "
                                                     "to be a list"),
    ("temperature = [0.5, 1]\ntemperature_weights = [1]", "temperature_weights has 1 "
                                                          "weight(s) for 2 temperature value(s)"),
    ("temperature = [0.5, 1]\ntemperature_weights = [1, 0]", "temperature_weights[1] must be > 0"),
    ('reasoning = [true, {effort = "max"}]', "reasoning[1].effort must be one of none, minimal"),
    ('reasoning = {budget = 3}', "reasoning has unknown key(s) budget"),
    ('reasoning = "on"', "'dataset[0].reasoning' has the wrong type (str: 'on')"),
    ("reasoning = [true, false]\nreasoning_weights = [1, 2, 3]", "reasoning_weights has 3"),
    ('temperature = "hot"', "'dataset[0].temperature' has the wrong type"),
])
def test_bad_mixes_are_refused_naming_the_file_and_key(tmp_path, dataset, needle):
    with pytest.raises(ConfigError) as exc:
        cfg_of(tmp_path, dataset=dataset)
    msg = str(exc.value)
    assert needle in msg and str(tmp_path / "run.toml") in msg, msg


@pytest.mark.parametrize(("sampling", "needle"), [
    ("temperature = 2.5", "sampling.temperature must be between 0 and 2"),
    ("top_p = 0", "sampling.top_p must be in (0, 1]"),
    ('reasoning = {effort = "turbo"}', "sampling.reasoning.effort must be one of"),
    ('model_defaults = "yes"', "'sampling.model_defaults' must be bool"),
])
def test_bad_sampling_values_are_refused(tmp_path, sampling, needle):
    with pytest.raises(ConfigError) as exc:
        cfg_of(tmp_path, sampling="[sampling]\n" + sampling)
    assert needle in str(exc.value)


# -- result hashes ------------------------------------------------------------------------------
def _old_hash(obj) -> str:
    return hashlib.sha256(orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)).hexdigest()


OLD_SAMPLING = {"temperature": 1.0, "top_p": None, "top_k": None, "min_p": None,
                "reasoning": True, "seed": None, "stop": None, "extra": {}}


def test_hashes_of_configs_without_the_new_keys_are_what_they_were(tmp_path):
    """The formulas of the code before the keys: a store made then resumes."""
    old_target = {"model": "moonshotai/kimi-k2.5", "renderer": "kimi-k2.5"}
    # silent temperature, model card off: exactly what was sent (and hashed) before
    off = cfg_of(tmp_path, sampling="[sampling]\nmodel_defaults = false")
    assert off.global_result_hash() == _old_hash({"target": old_target,
                                                  "sampling": OLD_SAMPLING})
    # both set explicitly: the card decides nothing, the hash is the old one
    both = cfg_of(tmp_path, sampling="[sampling]\ntemperature = 0.6\ntop_p = 0.9")
    assert both.global_result_hash() == _old_hash(
        {"target": old_target, "sampling": {**OLD_SAMPLING, "temperature": 0.6, "top_p": 0.9}})
    ds = off.datasets[0]
    assert off.dataset_result_hash(ds) == _old_hash({
        "path": "data.jsonl", "format": "auto", "max_tokens": 16384, "turns": "last",
        "on_length": "drop", "split": None, "native_tool_ids": None})


def test_sampling_that_changes_answers_changes_the_hash(tmp_path):
    silent = cfg_of(tmp_path)
    explicit = cfg_of(tmp_path, sampling="[sampling]\ntemperature = 1.0")
    off = cfg_of(tmp_path, sampling="[sampling]\nmodel_defaults = false")
    # silent + card (top_p 0.95 sent) != card off (no top_p); silent != explicit 1.0
    # (a thinking-off dataset would get 0.6 silent, 1.0 explicit)
    assert len({silent.global_result_hash(), explicit.global_result_hash(),
                off.global_result_hash()}) == 3
    base = silent.dataset_result_hash(silent.datasets[0])
    for extra in ("temperature = [0.6, 1.0]", "reasoning = false", "n = 2",
                  "temperature = [0.6, 1.0]\ntemperature_weights = [1, 3]"):
        other = cfg_of(tmp_path, dataset=extra)
        assert other.dataset_result_hash(other.datasets[0]) != base, extra
    one = cfg_of(tmp_path, dataset="n = 1")
    assert one.dataset_result_hash(one.datasets[0]) == base  # the default: not hashed


# -- the engine against the simulator ---------------------------------------------------------
SIM = """
[length]
distribution = "fixed"
tokens = 30
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    s = SimProcess(tmp_path_factory.mktemp("sim"), SIM)
    yield s
    s.stop()


MIX = {"temperature": [0.6, 1.0], "temperature_weights": [3, 1],
       "reasoning": [True, False], "n": 3}


def records(run_dir) -> dict[tuple[str, int], dict]:
    with Store.open(run_dir) as s:
        return {(conv, turn): rec and orjson.loads(rec) for conv, turn, rec in s.conn.execute(
            "SELECT c.conv_id, r.turn, r.sampling FROM results r JOIN conversations c "
            "ON c.id = r.conversation")}


def go(path):
    cfg = load_config(path)
    return cfg, run(cfg, RunOptions(live=False))


def test_mixes_are_recorded_reproducible_and_resume_the_same(tmp_path, sim):
    write_jsonl(tmp_path / "p.jsonl", prompt_rows(6))
    write_jsonl(tmp_path / "m.jsonl", multi_turn_rows(3))
    sets = [{"name": "p", "path": "p.jsonl", **MIX},
            {"name": "m", "path": "m.jsonl", "turns": "all", "temperature": [0.3, 0.9]}]
    one = write_config(tmp_path, sim.url, sets, name="one", sampling="max_tokens = 512")
    cfg, outcome = go(one)
    assert outcome.exit_code == 0, outcome
    check_store(cfg.run_dir)
    recs = records(cfg.run_dir)
    p = {k: v for k, v in recs.items() if not k[0].startswith("m")}
    assert len(p) == 18  # 6 prompts x n = 3, each its own request and sample
    assert Counter(v["sample"] for v in p.values()) == {0: 6, 1: 6, 2: 6}
    assert {k[0] for k in p} >= {"p0", "p0#1", "p0#2"}
    assert {v["temperature"] for v in p.values()} == {0.6, 1.0}
    assert {v["thinking"] for v in p.values()} == {True, False}
    assert all(v["top_p"] == 0.95 and v["drawn"] == ["reasoning", "temperature"]
               for v in p.values())
    for (conv, turn), v in recs.items():  # each record is the draw of its task's identity
        ds = cfg.datasets[0 if not conv.startswith("m") else 1]
        assert v == sample_settings(cfg, ds, conv, turn, sample=v["sample"]).to_json()
    with Store.open(cfg.run_dir) as s:  # the mode drawn is the mode sampled
        for conv, msg in s.conn.execute(
                "SELECT c.conv_id, r.message FROM results r JOIN conversations c ON "
                "c.id = r.conversation WHERE r.dataset = 'p'"):
            has_reasoning = bool(json.loads(msg).get("reasoning_content"))
            assert has_reasoning == recs[(conv, 1)]["thinking"], conv
    m = [v for k, v in recs.items() if k[0].startswith("m")]
    assert len(m) == 6 and all(v["thinking"] and "model_card" in v for v in m)

    # a second run dir gives the same per-sample draws
    two = write_config(tmp_path, sim.url, sets, name="two", sampling="max_tokens = 512")
    cfg2, _ = go(two)
    assert records(cfg2.run_dir) == recs

    # stopped part-way (a limit) and resumed: the same draws again
    part = [{**sets[0], "limit": 2}, sets[1]]
    three = write_config(tmp_path, sim.url, part, name="three", sampling="max_tokens = 512")
    cfg3, out3 = go(three)
    assert out3.exit_code == 0 and len(records(cfg3.run_dir)) == 2 * 3 + 6  # limit: prompts
    three = write_config(tmp_path, sim.url, sets, name="three", sampling="max_tokens = 512")
    cfg3, _ = go(three)
    assert records(cfg3.run_dir) == recs
    check_store(cfg3.run_dir)

    # exported on every sample, and verified in its own thinking mode
    out = export_run(cfg.run_dir, ExportOptions(format="tokens", jsonl=True,
                                                out=tmp_path / "t.jsonl"))
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert out and all(json.loads(r["sampling"])["temperature"] in (0.3, 0.9, 0.6, 1.0)
                       for r in rows)
    report = verify_run(cfg.run_dir)
    assert report.ok, report.problems[:3]


def test_a_run_made_before_the_model_card_resumes_as_it_was_made(tmp_path, sim):
    write_jsonl(tmp_path / "p.jsonl", prompt_rows(4))
    ds = [{"name": "p", "path": "p.jsonl", "limit": 2}]
    old = write_config(tmp_path, sim.url, ds, sampling="max_tokens = 512\nmodel_defaults = false")
    cfg, _ = go(old)
    with Store.open(cfg.run_dir, readonly=False) as s:  # as a store of the code before it
        s.conn.execute("DELETE FROM meta WHERE key = 'sampling_defaults'")
        s.conn.execute("UPDATE results SET sampling = NULL")
    silent = write_config(tmp_path, sim.url, [{**ds[0], "limit": 4}],
                          sampling="max_tokens = 512")
    cfg, outcome = go(silent)  # not refused: it resumes without the model card
    assert outcome.exit_code == 0
    new = [v for v in records(cfg.run_dir).values() if v is not None]
    assert len(new) == 2 and all(v["temperature"] == 1.0 and v["top_p"] is None for v in new)
    # saying so explicitly is a change of what is sent: refused
    card = write_config(tmp_path, sim.url, ds,
                        sampling="max_tokens = 512\nmodel_defaults = true")
    with pytest.raises(RunError, match="model_defaults"):
        go(card)


def test_preview_shows_the_defaults_and_each_samples_draw(tmp_path):
    from specgen.preview import preview
    from specgen.render import mode_renderers, target_renderer
    from specgen.tokenizer import load_tokenizer

    cfg = cfg_of(tmp_path, dataset="reasoning = [true, false]\nn = 3")
    tok = load_tokenizer("demo")
    renderer = target_renderer(cfg, tok)
    result = preview(cfg, renderer, n=1, renderer_for=mode_renderers(renderer, cfg.target.chat_template_kwargs))
    assert result.sampling_defaults == {"temperature": (1.0, "Kimi K2.5 model card"),
                                        "top_p": (0.95, "Kimi K2.5 model card")}
    d = result.datasets[0]
    assert d.n == 3 and d.est_requests == 3 and d.sampling == {"reasoning": [True, False]}
    s = d.samples[0]
    want = sample_settings(cfg, cfg.datasets[0], s.conversation_id, s.turn)
    assert s.sampling == want.to_json()
    assert s.body["temperature"] == want.temperature and s.body["top_p"] == 0.95
    assert s.body["reasoning"] == {"enabled": want.thinking}
    # the token view is the prompt of the sample's own thinking mode
    mode = mode_renderers(renderer, cfg.target.chat_template_kwargs)(want.thinking)
    assert s.input_ids[:s.n_prompt] == mode.prompt_ids(s.body["messages"], None)
