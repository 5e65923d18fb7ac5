"""Provider policing and dataset alarms on synthetic answer streams (quality/policing.py,
quality/alarms.py, quality/monitor.py), and their [quality] config keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from specgen.config import ConfigError, QualityConfig, parse_config
from specgen.quality.alarms import ALARMS, DatasetAlarms, alarm_rules
from specgen.quality.monitor import QualityMonitor
from specgen.quality.observe import Observation, Rolling, has_raw_markers
from specgen.quality.policing import Exclusion, ProviderPolicing


def obs(provider="A", dataset="d", task=1, outcome="ok", **kw) -> Observation:
    return Observation(provider=provider, dataset=dataset, task=task, outcome=outcome, **kw)


def with_calls(provider: str, task: int, ok: bool) -> Observation:
    """An answer with tool calls: kept, or quarantined for a schema mismatch."""
    if ok:
        return obs(provider, task=task, tools_offered=True, calls=True)
    return obs(provider, task=task, outcome="quarantined", reason="schema_mismatch",
               tools_offered=True, calls=True)


def policing(**kw) -> ProviderPolicing:
    return ProviderPolicing(QualityConfig(auto_exclude=True, **kw))


# -- rolling window -----------------------------------------------------------------------------
def test_rolling_share_forgets_what_left_the_window():
    r = Rolling(4)
    for i, failed in enumerate([True, True, False, False, False, False]):
        r.add(failed, i, "A", "x" if failed else None)
    assert (r.n, r.fails, r.share) == (4, 0, 0.0)  # both failures rolled out
    assert (r.total, r.total_fails, dict(r.labels)) == (6, 2, {"x": 2})
    r.add(True, 9, "B", "y")
    assert r.share == 0.25 and r.examples() == [{"task": 9, "provider": "B", "reason": "y"}]


# -- policing -----------------------------------------------------------------------------------
def test_schema_accuracy_below_the_threshold_excludes_after_min_samples():
    p = policing(min_samples=10, min_schema_accuracy=0.9)
    decisions = []
    for i in range(30):
        decisions.append(p.observe(with_calls("Bad", i, ok=i % 2 == 0)))  # 50% accuracy
    first = next(k for k, d in enumerate(decisions) if d is not None)
    assert first == 9  # the 10th answer with calls: not one earlier
    ex = decisions[first]
    assert isinstance(ex, Exclusion) and ex.provider == "Bad" and ex.metric == "schema"
    assert ex.value == pytest.approx(0.5) and ex.samples == 10
    assert all(e["reason"] == "schema_mismatch" for e in ex.examples)
    assert "schema accuracy 50% < 90%" in ex.message
    assert all(d is None for d in decisions[first + 1:])  # decided once


def test_a_good_provider_is_never_excluded_and_answers_without_calls_do_not_count():
    p = policing(min_samples=20)
    for i in range(100):
        assert p.observe(with_calls("Good", i, ok=i % 25 != 24)) is None  # 96% accuracy
        assert p.observe(obs("Plain", task=i, tools_offered=True)) is None  # no calls
    assert p.figures["Plain"].schema.n == 0
    assert p.figures["Good"].value("schema") >= 0.9


def test_quarantine_rate_counts_by_reason_and_auto_exclude_off_only_watches():
    stream = [obs("Q", task=i, outcome="quarantined",
                  reason="empty" if i % 2 else "stray_special_token")
              if i % 3 == 0 else obs("Q", task=i) for i in range(60)]
    watch = ProviderPolicing(QualityConfig(auto_exclude=False, min_samples=10))
    assert all(watch.observe(o) is None for o in stream)
    fig = watch.to_json()["Q"]["quarantine"]
    assert fig["total_failures"] == 20
    assert fig["reasons_total"] == {"stray_special_token": 10, "empty": 10}
    p = policing(min_samples=10, max_quarantine_rate=0.2)
    decided = [d for d in map(p.observe, stream) if d is not None]
    assert [d.metric for d in decided] == ["quarantine"]


def test_count_agreement_ignores_unjudged_answers():
    p = policing(min_samples=10, min_count_agreement=0.9)
    for i in range(50):
        assert p.observe(obs("C", task=i, count_check=None)) is None  # learning / not judged
    assert p.figures["C"].count.n == 0
    out = [p.observe(obs("C", task=100 + i, count_check="mismatch" if i % 4 == 0 else "exact"))
           for i in range(12)]
    assert [d.metric for d in out if d] == ["count"]  # 75% agreement


def test_model_and_quantization_mismatches_and_the_unknown_provider():
    p = policing(min_samples=10, max_mismatch_rate=0.2)
    stream = [obs("M", task=i, outcome="rejected", reason="quantization:fp4") if i % 2
              else obs("M", task=i) for i in range(10)]
    assert [d.metric for d in map(p.observe, stream) if d] == ["mismatch"]
    q = policing(min_samples=5)
    revealed = [obs("R", task=i, quantization_mismatch=True) for i in range(5)]
    assert [d.metric for d in map(q.observe, revealed) if d] == ["mismatch"]
    # answers naming no provider (a local server) cannot be routed around: never excluded
    u = policing(min_samples=5)
    assert all(u.observe(with_calls("(unknown)", i, ok=False)) is None for i in range(20))


def test_an_allowed_provider_starts_afresh():
    p = policing(min_samples=5)
    assert [d for d in (p.observe(with_calls("B", i, ok=False)) for i in range(5)) if d]
    p.mark("b", False)  # allowed back (names match case-insensitively)
    assert p.figures["B"].schema.n == 0
    out = [p.observe(with_calls("B", 10 + i, ok=False)) for i in range(5)]
    assert out[:4] == [None] * 4 and out[4] is not None  # needs min_samples new answers


# -- alarms -------------------------------------------------------------------------------------
def test_raw_markers_fire_once_with_figures_and_examples():
    alarms = DatasetAlarms(alarm_rules({}), window=200)
    fired = []
    for i in range(40):
        markers = i % 3 == 0  # 1 in 3 > 20%
        fired.append(alarms.observe(obs("P", task=i, raw_markers=markers)))
    got = [(k, a) for k, a in enumerate(fired) if a is not None]
    assert len(got) == 1 and got[0][0] == 19  # at its 20th answer, not before
    alarm = got[0][1]
    assert alarm.name == "raw_markers" and alarm.samples == 20
    assert alarm.share == pytest.approx(7 / 20)
    assert [e["task"] for e in alarm.examples] == [18, 15, 12, 9, 6]
    assert "alarm raw_markers on dataset 'd': 35%" in alarm.message
    assert "task 18 (P)" in alarm.message


def test_a_healthy_stream_fires_nothing():
    alarms = DatasetAlarms(alarm_rules({}), window=200)
    for i in range(500):
        o = obs("P", task=i, tools_offered=True, calls=i % 3 == 0,
                count_check="exact" if i % 50 else "mismatch",
                outcome="quarantined" if i % 40 == 0 else "ok",
                reason="empty" if i % 40 == 0 else None, truncated=i % 10 == 0)
        assert alarms.observe(o) is None


def test_tool_calls_absent_fires_below_and_datasets_are_separate():
    alarms = DatasetAlarms(alarm_rules({"tool_calls": {"threshold": 0.1, "min_samples": 30}}),
                           window=200)
    fired = [alarms.observe(obs(dataset="tools", task=i, tools_offered=True)) for i in range(30)]
    fired += [alarms.observe(obs(dataset="chat", task=i)) for i in range(100)]  # no tools
    got = [a for a in fired if a is not None]
    assert [(a.name, a.dataset, a.share) for a in got] == [("tool_calls", "tools", 0.0)]
    assert "< 10% after 30" in got[0].message


def test_pick_alarms_and_thresholds():
    rules = alarm_rules({"length": False, "empty": 0.5, "quarantine": {"min_samples": 5}})
    assert "length" not in rules and rules["empty"].threshold == 0.5
    assert rules["quarantine"].min_samples == 5 and rules["quarantine"].threshold == 0.3
    assert set(alarm_rules({})) == set(ALARMS)
    assert alarm_rules(False) == {}
    alarms = DatasetAlarms(rules, window=200)
    stream = [obs(task=i, outcome="quarantined", reason="length", truncated=True)
              for i in range(50)]
    assert all(alarms.observe(o) is None for o in stream)  # length off, not a quarantine


def test_the_monitor_returns_exclusions_and_alarms_together():
    m = QualityMonitor(QualityConfig(auto_exclude=True, min_samples=5,
                                     alarms={"schema_mismatch": {"min_samples": 5}}))
    out = [m.observe(with_calls("Bad", i, ok=False)) for i in range(5)]
    assert [type(d).__name__ for d in out[-1]] == ["Exclusion", "Alarm"]
    assert all(not d for d in out[:-1])
    js = m.to_json()
    assert js["providers"]["Bad"]["schema"]["value"] == 0.0
    assert js["alarms"]["d"]["fired"] == ["schema_mismatch"]


def test_observation_of_an_answer():
    o = Observation.of_answer(provider=None, dataset="d", task=3, outcome="ok",
                              content="x <|tool_calls_section_begin|> y", message_calls=True,
                              count_check="true_ids", finish_reason="length")
    assert (o.provider, o.raw_markers, o.calls, o.count_check, o.truncated) == (
        "(unknown)", True, True, None, True)
    o = Observation.of_answer(provider="P", dataset="d", task=3, outcome="quarantined",
                              reason="bad_tool_call_markup")
    assert o.raw_markers and o.calls
    o = Observation.of_answer(provider="P", dataset="d", task=3, outcome="ok",
                              repairs=["tool_calls_from_content"], message_calls=True)
    assert o.raw_markers
    assert not has_raw_markers("<|im_end|>", None, "a <|tool_call")


# -- config -------------------------------------------------------------------------------------
def _cfg(tmp_path: Path, quality: str):
    (tmp_path / "d.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    raw = f"""run_dir = "r"
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
base_url = "sim"
[quality]
{quality}
[[dataset]]
name = "d"
path = "d.jsonl"
"""
    import tomllib

    return parse_config(tomllib.loads(raw), tmp_path / "run.toml")


def test_quality_defaults_and_keys(tmp_path):
    q = _cfg(tmp_path, "").quality
    assert (q.auto_exclude, q.on_alarm, q.window, q.min_samples) == (False, "stop", 200, 20)
    q = _cfg(tmp_path, 'auto_exclude = true\non_alarm = "pause_dataset"\n'
                       'alarms = { raw_markers = 0.5, length = false }').quality
    assert q.auto_exclude and q.on_alarm == "pause_dataset"
    assert _cfg(tmp_path, "alarms = false").quality.alarms is False


@pytest.mark.parametrize("text, key", [
    ('on_alarm = "panic"', "quality.on_alarm"),
    ("min_schema_accuracy = 1.5", "quality.min_schema_accuracy"),
    ("min_samples = 300", "quality.min_samples (300) is larger than quality.window"),
    ("alarms = { sparkle = 0.1 }", "sparkle"),
    ("alarms = { raw_markers = 2 }", "quality.alarms.raw_markers threshold"),
    ("alarms = { empty = { threshold = 0.1, wait = 3 } }", "quality.alarms.empty has unknown"),
    ("alarms = { empty = { min_samples = 0 } }", "quality.alarms.empty.min_samples"),
    ("alarms = { empty = { min_samples = 500 } }", "larger than quality.window"),
    ("alarms = 3", "quality.alarms"),
])
def test_bad_quality_keys_name_the_file_and_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as info:
        _cfg(tmp_path, text)
    assert key in str(info.value) and "run.toml" in str(info.value)


def test_answers_right_after_tool_results_do_not_count_for_the_tool_calls_alarm():
    alarms = DatasetAlarms(alarm_rules({}), window=200)
    for i in range(200):  # a model answering once it has its results: never calls
        assert alarms.observe(obs(task=i, tools_offered=True, after_tool_result=True)) is None
    fired = [alarms.observe(obs(task=300 + i, tools_offered=True)) for i in range(50)]
    assert [a.name for a in fired if a] == ["tool_calls"]


def test_every_alarm_says_what_to_change():
    from specgen.quality.alarms import ALARMS, FIXES

    assert set(FIXES) == set(ALARMS), set(ALARMS) ^ set(FIXES)
    assert all(FIXES[name].strip() for name in ALARMS)


def test_an_alarm_example_without_a_provider_reads_as_words():
    """Issue 35: an example from an answer that named no provider read `task 61 ((unknown))`."""
    from specgen.quality.alarms import Alarm, AlarmRule

    rule = AlarmRule("raw_tool_markers", 0.2, 20, False, "answers with raw markers")
    alarm = Alarm("d", rule, 0.5, 20, examples=[{"task": 61, "provider": "(unknown)"},
                                                 {"task": 62, "provider": "Together"}])
    assert "task 61 (no provider named), task 62 (Together)" in alarm.message
    assert "((" not in alarm.message
