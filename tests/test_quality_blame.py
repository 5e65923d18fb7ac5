"""Whose fault an alarm is (quality/blame.py) and what the monitor makes of it: with
`auto_exclude`, an alarm whose evidence sits on one provider excludes it and is judged again
over the others' answers; a cause every provider shares still fires the alarm; without
`auto_exclude` the alarm names the provider and the command that excludes it."""

from __future__ import annotations

import random

import pytest

from specgen.config import QualityConfig
from specgen.engine.policy import ProviderPolicy, parse_endpoints
from specgen.quality.alarms import ALARMS, Alarm, alarm_rules
from specgen.quality.blame import PROVIDER_CAUSED, blame
from specgen.quality.monitor import QualityMonitor
from specgen.quality.observe import Observation, Rolling
from specgen.quality.policing import Exclusion


def obs(provider: str, task: int, **kw) -> Observation:
    return Observation(provider=provider, dataset="d", task=task, outcome="ok", **kw)


# one answer that is each alarm's evidence, and one that is not
HIT = {
    "raw_markers": dict(raw_markers=True, calls=True, tools_offered=True),
    "tool_calls": dict(tools_offered=True, calls=False),
    "schema_mismatch": dict(outcome="quarantined", reason="schema_mismatch", calls=True,
                            tools_offered=True),
    "count_mismatch": dict(count_check="mismatch", witness="mismatch"),
    "quarantine": dict(outcome="quarantined", reason="tool_args_invalid"),
    "unverifiable": dict(witness="mismatch"),
    "empty": dict(outcome="quarantined", reason="empty"),
    "length": dict(truncated=True),
    "repetition": dict(repetition=True),
}
CLEAN = {
    "raw_markers": dict(calls=True, tools_offered=True),
    "tool_calls": dict(tools_offered=True, calls=True),
    "schema_mismatch": dict(calls=True, tools_offered=True),
    "count_mismatch": dict(count_check="exact", witness="exact"),
    "unverifiable": dict(witness="exact"),
}


def answer(name: str, provider: str, task: int, hit: bool) -> Observation:
    kw = dict(HIT[name] if hit else CLEAN.get(name, {}))
    outcome = kw.pop("outcome", "ok")
    return Observation(provider=provider, dataset="d", task=task, outcome=outcome, **kw)


def monitor(only: str = "raw_markers", auto: bool = True, **kw) -> QualityMonitor:
    """A monitor with the one alarm `only` at its defaults (policing thresholds out of the
    way: the alarm decides)."""
    cfg = QualityConfig(auto_exclude=auto, max_quarantine_rate=1.0, min_schema_accuracy=0.0,
                        min_count_agreement=0.0,
                        alarms={n: False for n in ALARMS if n != only})
    return QualityMonitor(cfg, **kw)


def two_providers(name: str, n: int, bad_rate: float, good_rate: float = 0.0, seed: int = 1,
                  bad: str = "Bad", good: str = "Good", every: int = 2):
    """`n` answers between the providers (Good answers every `every`-th, Bad the others),
    each a hit at its provider's rate (a below alarm: a hit is an answer without what should
    be there)."""
    rnd = random.Random(seed)
    for i in range(n):
        p, rate = (bad, bad_rate) if i % every else (good, good_rate)
        yield answer(name, p, i, rnd.random() < rate)


def feed(m: QualityMonitor, stream) -> list:
    out = []
    for o in stream:
        out += m.observe(o)
    return out


# -- the rule -----------------------------------------------------------------------------------
def test_the_evidence_on_one_provider_excludes_it_and_the_run_goes_on():
    m = monitor()
    out = feed(m, two_providers("raw_markers", 20, bad_rate=0.8))
    assert [type(d) for d in out] == [Exclusion]  # no alarm: the cause went with Bad
    (ex,) = out
    assert ex.provider == "Bad" and ex.metric == "alarm:raw_markers"
    assert ex.alarm["alarm"] == "raw_markers" and ex.alarm["dataset"] == "d"
    assert ex.samples == 10 and ex.value > 0.2 and ex.alarm["others"]["answers"] == 10
    assert ex.alarm["others"]["figure"] == 0.0
    assert {e["provider"] for e in ex.examples} == {"Bad"}
    assert ex.message.startswith("provider 'Bad' excluded by alarm raw_markers on dataset 'd' (")
    assert "of its 10 answers, against 0% of the other providers' 10" in ex.message
    assert ex.to_json()["alarm"]["share"] == ex.alarm["share"]
    # judged again over the providers that remain: only Good's answers are in the window
    window = m.alarms.window_of("d", "raw_markers")
    assert {e[2] for e in window.recent} == {"Good"} and window.fails == 0
    assert m.alarms.fired["d"] == []  # re-armed
    assert feed(m, (answer("raw_markers", "Good", 100 + i, False) for i in range(100))) == []


def test_the_alarm_fires_when_the_cause_persists_in_the_providers_that_remain():
    m = monitor()
    out = feed(m, two_providers("raw_markers", 20, bad_rate=0.8, good="Good", bad="Bad"))
    assert [d.provider for d in out] == ["Bad"]
    # the remaining providers turn out to show it too: the alarm stops the run
    rnd = random.Random(3)
    later = feed(m, (answer("raw_markers", p, 200 + i, rnd.random() < 0.9)
                     for i, p in enumerate(["Good", "Other"] * 20)))
    assert [type(d) for d in later] == [Alarm]
    assert "not one provider's" in later[0].message
    assert "--exclude" not in later[0].message.split("; to fix:")[0]


def test_a_fault_every_provider_shares_fires_in_the_first_answers():
    m = monitor()
    out = feed(m, two_providers("raw_markers", 20, bad_rate=1.0, good_rate=1.0))
    assert [type(d) for d in out] == [Alarm] and out[0].samples == 20
    assert "not one provider's: " in out[0].message
    assert out[0].blame["verdict"] == "spread"
    assert out[0].blame["by_provider"]["Bad"]["answers"] == 10


def test_one_provider_alone_is_not_blamed():
    m = monitor()
    out = feed(m, (answer("raw_markers", "Deaf", i, True) for i in range(20)))
    assert [type(d) for d in out] == [Alarm]
    assert "one provider answered (Deaf 100% of its 20): none to compare it with" \
        in out[0].message
    assert "--exclude Deaf" in out[0].message  # (no endpoint list: it may route elsewhere)


def test_others_that_are_not_clearly_clean_keep_the_alarm():
    # Good at 15%: under the 20% threshold, but not half of it: not one provider's fault
    m = monitor()
    stream = [answer("raw_markers", "Bad", i, True) for i in range(10)]
    stream += [answer("raw_markers", "Good", 10 + i, i < 3) for i in range(20)]
    random.Random(0).shuffle(stream)
    out = feed(m, stream)
    assert [type(d) for d in out] == [Alarm] and out[0].blame["verdict"] == "spread"


def test_no_provider_left_keeps_the_alarm_and_says_so():
    m = monitor(routable=lambda names: False)
    out = feed(m, two_providers("raw_markers", 20, bad_rate=1.0))
    assert [type(d) for d in out] == [Alarm]
    assert "leaves no provider the policy allows" in out[0].message


def test_too_few_answers_of_the_others_waits_then_decides():
    m = monitor()
    stream = [answer("raw_markers", "Bad", i, i % 5 != 0) for i in range(17)]
    stream += [answer("raw_markers", "Good", 17 + i, False) for i in range(3)]
    assert feed(m, stream) == []  # fired, but Good has 3 answers: wait
    out = feed(m, (answer("raw_markers", "Good", 30 + i, False) for i in range(2)))
    assert [d.provider for d in out] == ["Bad"]


def test_waiting_ends_at_twice_the_alarms_min_samples():
    m = monitor()
    stream = [answer("raw_markers", "Good", i, False) for i in range(2)]
    stream += [answer("raw_markers", "Bad", 2 + i, True) for i in range(37)]
    assert feed(m, stream) == []  # Good's 2 answers are too few to tell: wait
    out = m.observe(answer("raw_markers", "Bad", 99, True))  # the 40th answer: no more wait
    assert [type(d) for d in out] == [Alarm] and out[0].blame["verdict"] == "unproven"
    assert "too few answers of the other providers to compare (Bad 100% of its 38, Good 0% " \
        "of its 2)" in out[0].message
    assert "`specgen provider RUN_DIR --exclude Bad` excludes it" in out[0].message


@pytest.mark.parametrize("name", sorted(PROVIDER_CAUSED - {"tool_calls"}))
def test_every_alarm_a_provider_can_cause_excludes_it(name):
    m = monitor(name)
    rule = alarm_rules({})[name]
    n = 2 * rule.min_samples
    # Bad: every answer is evidence (for tool_calls: it never calls); Good: none is (for
    # tool_calls: it calls in 70% of its answers)
    out = feed(m, two_providers(name, n, bad_rate=1.0, good_rate=0.3 if rule.below else 0.0,
                                every=3))
    assert [(type(d), d.provider) for d in out] == [(Exclusion, "Bad")], out
    assert out[0].metric == f"alarm:{name}"


def test_a_provider_that_never_calls_a_tool_and_takes_most_answers():
    # the tool_calls alarm (calls < 2%) fires only when the provider that never calls takes
    # nearly every answer: Good calls in 1 of its 5 answers, Bad in none of its 95
    m = monitor("tool_calls")
    stream = [answer("tool_calls", "Good" if i % 20 == 0 else "Bad", i, i != 40)
              for i in range(100)]
    out = feed(m, stream)
    assert [(type(d), d.provider) for d in out] == [(Exclusion, "Bad")], out
    assert "call one" in out[0].alarm["what"] and out[0].alarm["below"]
    assert "< 2%" in out[0].message and "against 20% of the other providers' 5" in out[0].message


def test_a_repetition_loop_is_not_one_providers():
    m = monitor("repetition")
    out = feed(m, two_providers("repetition", 20, bad_rate=1.0))
    assert [type(d) for d in out] == [Alarm] and out[0].cause is None


def test_without_auto_exclude_the_alarm_names_the_provider_and_the_command():
    m = monitor(auto=False, run_dir="/runs/my run")
    out = feed(m, two_providers("raw_markers", 20, bad_rate=0.8))
    assert [type(d) for d in out] == [Alarm]
    msg = out[0].message
    assert "caused by provider 'Bad' (" in msg and "answers, against 0% of the other " \
        "providers' 10): `specgen" in msg
    assert out[0].fix.startswith("`specgen provider '/runs/my run' --exclude Bad` excludes "
                                 "it")  # what a standing alarm shows
    assert "`specgen provider '/runs/my run' --exclude Bad` excludes it" in msg
    assert "`[quality] auto_exclude = true` does it itself" in msg
    assert msg.index("caused by") < msg.index("; to fix:")
    assert out[0].to_json()["blame"]["providers"] == ["Bad"]


@pytest.mark.parametrize("name", sorted(PROVIDER_CAUSED - {"tool_calls"}))
def test_without_auto_exclude_every_provider_alarm_names_it(name):
    m = monitor(name, auto=False, run_dir="/r")
    rule = alarm_rules({})[name]
    out = feed(m, two_providers(name, 2 * rule.min_samples, bad_rate=1.0,
                                good_rate=0.3 if rule.below else 0.0, every=3))
    assert [type(d) for d in out] == [Alarm]
    assert "`specgen provider /r --exclude Bad`" in out[0].message


# -- the parts ----------------------------------------------------------------------------------
def test_blame_reads_a_window_of_entries():
    rule = alarm_rules({})["raw_markers"]
    window = [(True, i, "Bad", None) for i in range(8)] + [(False, i, "Good", None)
                                                           for i in range(12)]
    b = blame(rule, window)
    assert b.verdict == "exclude" and b.providers == ("Bad",)
    assert b.evidence() == "Good 0% of its 12, Bad 100% of its 8"
    assert blame(rule, window, routable=lambda names: "Bad" not in names).verdict == "none_left"
    # an answer naming no provider is never blamed (nothing to route around)
    unnamed = [(True, i, "(unknown)", None) for i in range(8)] + window[8:]
    assert blame(rule, unnamed).verdict == "spread"


def test_rolling_forgets_a_providers_entries():
    r = Rolling(5)
    for i, (hit, p) in enumerate([(True, "Bad"), (False, "Good"), (True, "bad"),
                                  (False, "Good")]):
        r.add(hit, i, p)
    assert r.forget({"bad"}) == 2 and r.n == 2 and r.fails == 0 and r.share == 0.0
    assert r.recent.maxlen == 5 and r.total == 4  # totals are the run's, kept


def test_the_policy_knows_whether_a_provider_would_remain():
    eps = parse_endpoints({"data": {"endpoints": [
        {"provider_name": "Good", "tag": "good/fp8"}, {"provider_name": "Bad", "tag": "bad/fp8"},
        {"provider_name": "Far", "tag": "far/fp8"}]}})
    policy = ProviderPolicy({"ignore": ["far"]}, eps)
    assert policy.routable_without(["Bad"])
    assert not policy.routable_without(["Bad", "Good"])
    assert ProviderPolicy({}, []).routable_without(["Bad"])  # no list: the answers tell


def test_waiting_never_outlasts_a_full_window():
    cfg = QualityConfig(auto_exclude=True, window=30,
                        alarms={n: False for n in ALARMS if n != "raw_markers"})
    m = QualityMonitor(cfg)
    stream = [answer("raw_markers", "Good", i, False) for i in range(2)]
    stream += [answer("raw_markers", "Bad", 2 + i, True) for i in range(27)]
    assert feed(m, stream) == []
    out = m.observe(answer("raw_markers", "Bad", 99, True))  # 30 answers: the window is full
    assert [type(d) for d in out] == [Alarm] and out[0].blame["verdict"] == "unproven"


def test_an_alarm_that_waits_does_not_hold_back_the_others():
    # raw_markers waits (Good has 2 answers); repetition is no provider's: it fires at once
    cfg = QualityConfig(auto_exclude=True, alarms={
        n: False for n in ALARMS if n not in ("raw_markers", "repetition")})
    m = QualityMonitor(cfg)
    stream = [obs("Good", i, repetition=True) for i in range(2)]
    stream += [obs("Bad", 2 + i, repetition=True, raw_markers=True) for i in range(18)]
    out = feed(m, stream)
    assert [(type(d), d.name) for d in out] == [(Alarm, "repetition")]
    assert m.alarms.fired["d"] == ["repetition"]  # raw_markers re-armed: still waiting
