"""Engine parts that need no server: budget, adaptive limit, provider policy, shards, control."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from specgen.engine.budget import Budget, Prices, resolve_prices
from specgen.engine.concurrency import AdaptiveLimit
from specgen.engine.control import (
    RunLock,
    RunLockedError,
    clear_control,
    pid_alive,
    read_control,
    session_alive,
    write_control,
)
from specgen.engine.policy import ProviderPolicy, parse_endpoints
from specgen.engine.shard import ShardError, parse_shard, shard_of
from specgen.engine.stats import LatencyHistogram, RateMeter


# -- budget ---------------------------------------------------------------------------------
def test_token_budget_counts_in_flight_worst_case():
    b = Budget(None, Prices())
    b.add_dataset("a", 1000)
    rs = []
    for _ in range(4):
        assert b.check("a", 10, 250) == "ok"
        rs.append(b.reserve("a", 10, 250))
    assert b.check("a", 10, 250) == "wait"  # 4 x 250 reserved = the whole budget
    b.release(rs[0])
    b.charge("a", 10, 100, None)  # the first used 100 of its 250
    assert b.check("a", 10, 250) == "wait"  # 100 + 3 x 250 + 250 > 1000
    b.release(rs[1])
    b.charge("a", 10, 100, None)
    assert b.check("a", 10, 250) == "ok"  # 200 + 2 x 250 + 250 <= 1000
    for r in rs[2:]:
        b.release(r)
    b.charge("a", 10, 650, None)
    assert b.datasets["a"].completion_tokens == 850
    assert b.check("a", 10, 250) == "tokens_exhausted"  # 850 + 250 > 1000 even with none in flight
    assert b.check("a", 10, 150) == "ok"


def test_cost_cap_with_known_and_unknown_prices():
    prices = resolve_prices(1.0, 2.0, None)  # $1/M prompt, $2/M completion
    assert prices.known and prices.source == "config"
    b = Budget(0.01, prices)
    b.add_dataset("a", None)
    worst = b.worst_cost(1000, 1000)
    assert worst == pytest.approx(0.003)
    r1, r2, r3 = (b.reserve("a", 1000, 1000) for _ in range(3))
    assert b.check("a", 1000, 1000) == "wait"  # 0.009 + 0.003 > 0.01
    for r in (r1, r2, r3):
        b.release(r)
    b.charge("a", 1000, 1000, None)
    b.charge("a", 0, 0, 0.006)
    assert b.cost_usd == pytest.approx(0.006)  # charge(None) adds no cost; the engine prices it
    assert b.attempt_cost(1000, 1000, None) == pytest.approx(0.003)
    assert b.attempt_cost(1000, 1000, 0.5) == 0.5  # reported cost wins
    b.charge("a", 0, 0, 0.002)
    assert b.check("a", 1000, 1000) == "cost_exhausted"

    unknown = Budget(0.01, Prices())
    unknown.add_dataset("a", None)
    assert unknown.check("a", 10**6, 10**6) == "ok"  # no prices: only what was reported counts
    unknown.charge("a", 0, 0, 0.01)
    assert unknown.check("a", 1, 1) == "cost_exhausted"


def test_prices_from_endpoints_and_overrides():
    p = resolve_prices(None, 3.0, (5e-7, 2e-6))
    assert p.prompt == 5e-7 and p.completion == 3e-6 and p.source == "config+endpoints"
    assert resolve_prices(None, None, None).source == "unknown"
    assert Prices(1e-6, 2e-6).to_json()["completion_per_m"] == pytest.approx(2.0)


# -- adaptive concurrency -------------------------------------------------------------------
def test_aimd_backs_off_once_per_window_and_recovers():
    now = [0.0]
    lim = AdaptiveLimit(100, 10, clock=lambda: now[0])
    epoch = lim.epoch
    assert lim.on_error("rate_limit", epoch) and lim.limit == 70
    # requests sent before the decrease say nothing about the new limit
    assert not lim.on_error("rate_limit", epoch) and lim.limit == 70
    now[0] += 1
    assert lim.on_error("overloaded", lim.epoch) and lim.limit == 49
    assert not lim.on_error("timeout", lim.epoch)  # timeouts are not congestion
    assert not lim.on_error("server", lim.epoch)
    for _ in range(30):
        now[0] += 1
        lim.on_error("rate_limit", lim.epoch)
    assert lim.limit == 10  # floor
    for _ in range(2000):
        lim.on_success()
    assert lim.limit == 100  # ceiling
    off = AdaptiveLimit(50, 1, enabled=False)
    assert not off.on_error("rate_limit", 0) and off.limit == 50
    assert AdaptiveLimit(3, 8).minimum == 3


# -- provider policy ------------------------------------------------------------------------
ENDPOINTS = {"data": {"id": "m", "endpoints": [
    {"provider_name": "DeepInfra", "tag": "deepinfra/fp4", "quantization": "fp4",
     "pricing": {"prompt": "0.0000004", "completion": "0.000002"}},
    {"provider_name": "Moonshot AI", "tag": "moonshotai", "quantization": "int4",
     "pricing": {"prompt": "0.0000006", "completion": "0.0000025"}},
    {"provider_name": "Fireworks", "tag": "fireworks/fp8", "quantization": "fp8",
     "pricing": {"prompt": "0.0000006", "completion": "0.000003"}},
    {"provider_name": "Fireworks", "tag": "fireworks/fp4", "quantization": "fp4",
     "pricing": {"prompt": "0.0000002", "completion": "0.000001"}},
    {"provider_name": "Odd", "quantization": None, "pricing": {"prompt": "x"}},
    "garbage",
]}}


def test_parse_endpoints_defensively():
    eps = parse_endpoints(ENDPOINTS)
    assert [e.tag for e in eps] == ["deepinfra/fp4", "moonshotai", "fireworks/fp8",
                                    "fireworks/fp4", "odd"]
    assert eps[0].prompt_price == 4e-7 and eps[4].quantization == "unknown"
    assert eps[4].prompt_price is None
    assert parse_endpoints({"error": "x"}) == [] and parse_endpoints(None) == []


def test_policy_rejects_outside_answers():
    eps = parse_endpoints(ENDPOINTS)
    pol = ProviderPolicy({"quantizations": ["int4", "fp8", "bf16"]}, eps)
    assert pol.rejection("Moonshot AI") is None
    assert pol.rejection("DeepInfra") == "quantization:fp4"
    assert pol.rejection("Fireworks") is None  # one of its endpoints (fp8) is allowed
    assert pol.rejection("Unlisted") == "quantization:unknown"
    # an answer naming no provider cannot be shown to be at an allowed quantization when
    # there is a list to check it against (issue 25); without a list it is not judged
    assert pol.rejection(None) == "quantization:unknown" == pol.rejection("")
    assert pol.max_prices() == (6e-7, 3e-6)

    ign = ProviderPolicy({"ignore": ["deepinfra", "fireworks/fp4"]}, eps)
    assert ign.rejection("DeepInfra") == "provider_ignored"
    assert ign.rejection("deepinfra") == "provider_ignored"
    assert ign.rejection("Fireworks") is None  # fp8 endpoint not ignored
    assert ign.rejection("Unlisted") is None

    only = ProviderPolicy({"only": ["moonshotai"]}, eps)
    assert only.rejection("Moonshot AI") is None
    assert only.rejection("Fireworks") == "provider_not_allowed"
    order = ProviderPolicy({"order": ["fireworks"], "allow_fallbacks": False}, eps)
    assert order.rejection("Fireworks") is None and order.rejection("DeepInfra") is not None

    no_list = ProviderPolicy({"ignore": ["deepinfra"], "quantizations": ["fp8"]})
    assert no_list.rejection("DeepInfra") == "provider_ignored"
    assert no_list.rejection("Other") is None  # nothing known about it: cannot judge
    assert no_list.rejection(None) is None  # a local server names no provider
    assert not ProviderPolicy({}, eps).active and ProviderPolicy({}, eps).rejection("x") is None


# -- shards ---------------------------------------------------------------------------------
def test_shards_are_disjoint_deterministic_and_balanced():
    ids = [f"conv-{i}" for i in range(4000)]
    shards = [parse_shard(f"{i}/4") for i in range(4)]
    owners = [[s.owns(c) for s in shards].count(True) for c in ids]
    assert set(owners) == {1}
    counts = [sum(s.owns(c) for c in ids) for s in shards]
    assert min(counts) > 800
    assert shard_of("abc", 7) == shard_of("abc", 7)
    # pinned so a change of the hash is noticed (it would split resumed runs differently)
    assert [shard_of(f"x{i}", 5) for i in range(6)] == [shard_of(f"x{i}", 5) for i in range(6)]
    assert parse_shard(None) is None and parse_shard("") is None
    assert str(parse_shard("2/3")) == "2/3" and parse_shard("0/1").owns("anything")
    for bad in ("3/3", "-1/2", "a/b", "1", "0/0"):
        with pytest.raises(ShardError):
            parse_shard(bad)


def test_shard_hash_is_sha256_mod_n():
    import hashlib

    digest = hashlib.sha256(b"row-17").digest()
    assert shard_of("row-17", 9) == int.from_bytes(digest[:8], "big") % 9


# -- control --------------------------------------------------------------------------------
def test_control_file_round_trip(tmp_path):
    assert read_control(tmp_path) is None
    write_control(tmp_path, "now", 4)
    ctl = read_control(tmp_path)
    assert ctl["action"] == "now" and ctl["session"] == 4
    (tmp_path / "control.json").write_text("{half")
    assert read_control(tmp_path) is None
    clear_control(tmp_path)
    clear_control(tmp_path)
    assert read_control(tmp_path) is None


def test_pid_alive_and_session_liveness():
    assert pid_alive(os.getpid())
    assert not pid_alive(None) and not pid_alive(0)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_alive(proc.pid)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # exited but not reaped: a zombie counts as dead
        if not pid_alive(zombie.pid):
            break
        time.sleep(0.05)
    assert not pid_alive(zombie.pid)
    zombie.wait()
    me = {"state": "running", "pid": os.getpid(), "host": socket.gethostname(),
          "heartbeat_at": time.time()}
    assert session_alive(me)
    assert not session_alive({**me, "heartbeat_at": time.time() - 3600})
    assert not session_alive({**me, "state": "stopped"})
    assert not session_alive({**me, "pid": proc.pid})
    assert session_alive({**me, "host": "elsewhere", "pid": 1})  # other host: heartbeat only


def test_run_lock_excludes_a_second_process(tmp_path):
    code = ("import sys, time; from specgen.engine.control import RunLock; "
            f"l = RunLock({str(tmp_path)!r}); l.acquire(); print('locked', flush=True); "
            "time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}"):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with RunLock(tmp_path):  # the kernel released it when the holder died
        pass


def test_the_lock_file_goes_with_its_holder(tmp_path, monkeypatch):
    import os

    path = tmp_path / "run.lock"
    a = RunLock(tmp_path)
    a.acquire()
    stale = os.open(path, os.O_RDWR)  # a second process that opened it just before the end
    a.release()
    assert not path.exists()  # a finished run leaves no lock behind
    real_open, calls = os.open, []

    def opener(p, flags, mode=0o777):
        calls.append(p)
        return stale if len(calls) == 1 else real_open(p, flags, mode)

    monkeypatch.setattr(os, "open", opener)
    b = RunLock(tmp_path)
    b.acquire()  # it locks the removed file first, sees that, and locks the current one
    monkeypatch.undo()
    assert len(calls) == 2 and path.exists()
    with pytest.raises(RunLockedError):
        RunLock(tmp_path).acquire()
    b.release()


# -- stats ----------------------------------------------------------------------------------
def test_latency_histogram_and_rates():
    h = LatencyHistogram()
    assert h.percentile(50) is None
    for i in range(1, 1001):
        h.add(i / 100)
    assert h.percentile(50) == pytest.approx(5.0, rel=0.06)
    assert h.percentile(99) == pytest.approx(9.9, rel=0.06)
    now = [0.0]
    r = RateMeter(window=10, clock=lambda: now[0])
    for i in range(20):
        now[0] = float(i)
        r.sample(i * 5, i * 100)
    rps, tps = r.rates()
    assert rps == pytest.approx(5.0) and tps == pytest.approx(100.0)
