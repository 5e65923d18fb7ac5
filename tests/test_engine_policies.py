"""The engine's small policies on their own: error classes by meaning, the retry decision,
budget-aware concurrency, endpoint health, the model check, the outcome's exit code."""

from __future__ import annotations

import json

import pytest

from specgen.client.errors import error_from_response
from specgen.client.types import ApiError
from specgen.config import EndpointConfig
from specgen.engine.inflight_budget import InFlightBudget
from specgen.engine.model_check import ModelCheck
from specgen.engine.outage import STORM_TASKS, UNREACHABLE_STREAK, EndpointHealth
from specgen.engine.outcome import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_STOPPED,
    decide,
)
from specgen.engine.retry import RetryPolicy


def err(status: int, body: dict | None = None, headers: dict | None = None) -> ApiError:
    return error_from_response(status, headers or {}, json.dumps(body or {}).encode())


IN_FLIGHT = {"error": {"code": 402, "message": "In-flight spending budget exhausted",
                       "metadata": {"reason": "in_flight_budget_exhausted",
                                    "limit_source": "openrouter_in_flight_budget"}}}
WEIGHT = {"error": {"code": 402, "message": "too heavy", "metadata": {
    "reason": "weight_exceeds_budget", "limit_source": "openrouter_credits",
    "budget_usd": 0.01, "request_usd": 0.04}}}
CREDITS = {"error": {"code": 402, "message": "Insufficient credits",
                     "metadata": {"limit_source": "openrouter_credits"}}}
GUARDRAIL = {"error": {"code": 403, "message": "Budget limit exceeded", "metadata": {
    "limit_source": "openrouter_workspace_budget", "scope": "workspace", "limit_usd": 50,
    "spend_usd": 50.2, "resets_at": "2026-12-07T00:00:00Z"}}}
MODERATION = {"error": {"code": 403, "message": "flagged",
                        "metadata": {"reasons": ["harassment"]}}}


def test_402_and_403_are_classified_by_what_they_mean():
    assert err(402, IN_FLIGHT, {"Retry-After": "2"}).kind == "in_flight_budget"
    assert err(402, IN_FLIGHT, {"Retry-After": "2"}).retry_after == 2.0
    assert err(402, WEIGHT).kind == "weight_exceeds_budget"
    assert err(402, CREDITS).kind == "credits" and err(402, {}).kind == "credits"
    assert err(403, GUARDRAIL).kind == "spend_limit"
    assert err(403, MODERATION).kind == "moderation"
    # only the reason text, no metadata: still the in-flight budget
    assert err(402, {"error": {"message": "in_flight_budget_exhausted"}}).kind \
        == "in_flight_budget"


def test_429_waits_come_from_every_place_they_can():
    assert err(429, {}, {"Retry-After": "7"}).retry_after == 7.0
    body = {"error": {"code": 429, "message": "slow down",
                      "metadata": {"retry_after_seconds": 12}}}
    assert err(429, body).retry_after == 12.0
    import time
    reset_ms = str(int((time.time() + 30) * 1000))
    wait = err(429, {}, {"X-RateLimit-Reset": reset_ms}).retry_after
    assert 28 <= wait <= 31


def policy(**kw) -> RetryPolicy:
    return RetryPolicy(EndpointConfig(base_url=["x"], max_attempts=3, retry_base_delay=0.01,
                                      retry_max_delay=0.05), **kw)


def test_retry_decisions():
    p = policy(retry_after_cap=300)
    d = p.decide(err(402, IN_FLIGHT, {"Retry-After": "2"}), attempts=5, max_tokens=100)
    assert d.action == "retry" and not d.counts and d.delay >= 2.0
    d = p.decide(err(402, CREDITS), attempts=1, max_tokens=100)
    assert d.action == "stop_run" and "add credits" in d.message
    d = p.decide(err(403, GUARDRAIL), attempts=1, max_tokens=100)
    assert d.action == "stop_run" and "workspace budget" in d.message
    assert "2026-12-07T00:00:00Z" in d.message
    assert p.decide(err(403, MODERATION), attempts=1, max_tokens=10).action == "fail_task"
    assert p.decide(err(401, {}), attempts=1, max_tokens=10).action == "fail_run"
    d = p.decide(err(402, WEIGHT), attempts=1, max_tokens=4096)
    assert d.action == "fail_task" and "shrink_max_tokens" in d.message
    d = policy(shrink_max_tokens=True).decide(err(402, WEIGHT), attempts=1, max_tokens=4096)
    assert d.action == "shrink" and d.max_tokens == int(4096 * 0.25 * 0.9)
    # retryable errors count, until the budget of attempts is spent ...
    assert p.decide(err(500, {}), attempts=2, max_tokens=10).action == "retry"
    assert p.decide(err(500, {}), attempts=3, max_tokens=10).action == "fail_task"
    # ... except while the endpoint is down, and never for a connection that was not made
    for down_err in (err(500, {}), ApiError("connection", "reset mid-body"),
                     ApiError("timeout", "idle")):
        assert p.decide(down_err, attempts=3, max_tokens=10, endpoint_down=True).counts is False
    d = p.decide(ApiError("unreachable", "refused"), attempts=9, max_tokens=10)
    assert d.action == "retry" and not d.counts
    # a Retry-After above the cap pauses the endpoint instead of parking one request
    d = policy(retry_after_cap=60).decide(err(429, {}, {"Retry-After": "86400"}), attempts=1,
                                          max_tokens=10)
    assert d.action == "retry" and d.pause == 86400


def test_in_flight_budget_learns_the_cap_and_grows_back_slowly():
    b = InFlightBudget()
    assert b.admits(1.0, 1000.0, 1000)  # nothing learned yet
    # 150 requests of weight 1 fit; the 151st to 600th are refused
    for before in range(150, 600):
        b.on_refused(float(before), 1.0)
    assert b.cap == pytest.approx(0.9 * 151)
    assert b.limit_for(600) == 135
    assert not b.admits(1.0, 135.0, 135) and b.admits(1.0, 134.0, 134)
    assert b.admits(500.0, 0.0, 0)  # nothing in flight: always one
    cap = b.cap
    for _ in range(135):  # a round trip of successes while the cap holds requests back
        b.on_success(135.0, 135)
    assert cap * 1.004 < b.cap < cap * 1.006  # near the bound: slowly
    for _ in range(135):  # not holding requests back: no growth
        b.on_success(10.0, 10)
    assert b.cap < cap * 1.006
    while b.cap < 1.1 * 151:
        b.on_success(b.cap, 150)
    fast = b.cap
    for _ in range(150):  # well past the last bound with no refusal: the budget grew
        b.on_success(b.cap, 150)
    assert fast * 1.04 < b.cap < fast * 1.06
    assert b.on_refused(170.0, 1.0) and b.cap == pytest.approx(0.9 * 171)


def test_endpoint_health_outage_probe_and_recovery():
    t = [0.0]
    h = EndpointHealth(outage_timeout=10, probe_max=4, clock=lambda: t[0], wall=lambda: 0.0)
    for i in range(UNREACHABLE_STREAK - 1):
        assert h.on_failure("unreachable", i, "refused", responded=False) is None
    assert h.gate() is None
    note = h.on_failure("unreachable", 9, "refused", responded=False)
    assert note and "endpoint down" in note and h.down and h.gate() == 0
    t[0] = 1.0
    assert h.gate() == 1  # one probe
    h.probe_sent()
    assert h.gate() == 0
    h.on_failure("unreachable", 1, "refused", responded=False, probe=True)
    t[0] = 2.5
    assert h.gate() == 0
    t[0] = 3.1
    assert h.gate() == 1
    t[0] = 10.5
    assert h.expired() and "endpoint unreachable since" in h.stop_reason()
    assert "reachable again" in h.on_answer(probe=True)
    assert not h.down and h.gate() is None


def test_reports_of_requests_sent_before_the_last_change_change_nothing():
    t = [0.0]
    h = EndpointHealth(clock=lambda: t[0], wall=lambda: 0.0)
    t[0] = 1.0
    for i in range(UNREACHABLE_STREAK):
        h.on_failure("unreachable", i, "refused", responded=False, sent_at=0.9)
    assert h.down
    t[0] = 2.0  # answers of a graceful shutdown, sent before it: still down
    assert h.on_answer(sent_at=0.5) is None and h.down
    assert h.on_failure("bad_request", 7, "400", responded=True, sent_at=0.5) is None
    assert h.down
    assert "reachable again" in h.on_answer(probe=True, sent_at=1.5)
    t[0] = 3.0  # failures of requests sent while it was down: no new outage
    for i in range(UNREACHABLE_STREAK):
        assert h.on_failure("unreachable", 20 + i, "refused", responded=False,
                            sent_at=1.9) is None
    assert not h.down and h.outages == 1
    for i in range(UNREACHABLE_STREAK):  # sent since it came back: down again
        h.on_failure("unreachable", 30 + i, "refused", responded=False, sent_at=2.5)
    assert h.down and h.outages == 2


def test_5xx_storm_across_tasks_is_an_outage_but_one_task_is_not():
    h = EndpointHealth()
    for _ in range(100):
        assert h.on_failure("server", 1, "500", responded=True) is None  # one task only
    for task in range(STORM_TASKS - 2):  # with task 1: one short of a storm
        h.on_failure("server", 100 + task, "500", responded=True)
    assert not h.down
    h.on_answer()
    for task in range(STORM_TASKS):
        h.on_failure("overloaded", 200 + task, "503", responded=True)
    assert h.down
    # a 4xx means the server answers: the path is up
    assert "reachable again" in h.on_failure("bad_request", 1, "400", responded=True)


def test_long_pause_gates_everything_until_it_ends():
    t = [0.0]
    h = EndpointHealth(clock=lambda: t[0])
    assert h.pause(30, "Retry-After 30s") and not h.pause(10, "shorter")
    assert h.gate() == 0 and h.to_json()["state"] == "paused"
    t[0] = 31
    assert h.gate() is None and h.to_json()["state"] == "ok"


@pytest.mark.parametrize("model,ok", [
    ("moonshotai/kimi-k2.5", True), ("moonshotai/kimi-k2.5-20260127", True),
    ("kimi-k2.5", True), ("MoonshotAI/Kimi-K2.5", True), (None, True),
    ("meta-llama/llama-3-8b", False), ("moonshotai/kimi-k2", False),
    ("moonshotai/kimi-k2.5-turbo", False), ("other/kimi-k2.5-x", False),
])
def test_model_check(model, ok):
    check = ModelCheck("moonshotai/kimi-k2.5:exacto", ["acme/kimi-mirror"])
    assert (check.rejection(model) is None) is ok
    assert check.rejection("acme/kimi-mirror") is None


def test_exit_codes_tell_the_truth():
    def out(**kw):
        base = dict(fatal=None, stopping=None, stop_reason=None, pending=0, failed={},
                    done_note="")
        base.update(kw)
        return decide(**base)
    assert out().exit_code == EXIT_OK and out().state == "finished"
    assert out(done_note="budget reached: a").exit_code == EXIT_OK
    o = out(failed={"connection": 233, "bad_request": 1})
    assert (o.state, o.exit_code) == ("incomplete", EXIT_INCOMPLETE)
    assert "234 task(s) failed (connection 233, bad_request 1)" in o.stop_reason
    assert out(stopping="drain", stop_reason="signal", pending=3).exit_code == EXIT_STOPPED
    assert out(stopping="now", stop_reason="signal").exit_code == EXIT_CANCELLED
    assert out(fatal="bad key").exit_code == EXIT_FAILED
