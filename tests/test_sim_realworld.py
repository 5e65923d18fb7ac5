"""The simulator's real-world account and network behaviours, over real sockets: the in-flight
spending budget (402), credits and spend budgets (402 / 403 with `limit_source`), 429 details,
outage windows (refused / reset connections), answers naming the wrong model, and the
OpenRouter-only request fields it accepts and ignores."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlparse

import pytest

from specgen.config import ConfigError
from specgen.sim import SimConfig, load_sim_config, start_in_thread
from test_sim_support import CHAT, MODEL, SimProcess, sse_events, wait_for

USER = [{"role": "user", "content": "What is the weather like in Paris?"}]
SHORT = {"distribution": "fixed", "tokens": 20, "min": 20, "max": 20}
# Easy prices: 1 USD per million prompt tokens, 10 per million completion tokens.
PRICES = {"prompt_price_per_m": 1.0, "completion_price_per_m": 10.0}
NETWORK_ERRORS = (OSError, http.client.HTTPException)  # refused, reset, remote disconnected


def sim(**cfg: Any):
    """A simulator in a thread, from a config table (every key as in sim.toml)."""
    cfg.setdefault("length", SHORT)
    return start_in_thread(SimConfig.from_dict(cfg))


def post(handle, body: dict, timeout: float = 20, path: str = CHAT
         ) -> tuple[int, dict[str, str], Any]:
    data = json.dumps({"model": MODEL, "messages": USER, **body}).encode()
    req = urllib.request.Request(handle.root_url + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, headers, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, dict(exc.headers), exc.read()
    if body.get("stream") and status == 200:
        return status, headers, sse_events([x for x in raw.decode().split("\n") if x])
    return status, headers, json.loads(raw)


def in_background(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run():
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def only(tag: str) -> dict:
    return {"provider": {"only": [tag], "allow_fallbacks": False}}


def port_of(handle) -> int:
    return urlparse(handle.url).port


def refused(port: int) -> bool:
    """Whether connecting is refused (a connection reset at once, as in a `reset` outage,
    is not a refusal: the connection was accepted)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        pass
    return False


def prompt_tokens(handle, body: dict) -> int:
    status, _, answer = post(handle, body)
    assert status == 200, answer
    return answer["usage"]["prompt_tokens"]


# -- in-flight spending budget ---------------------------------------------------------------
BUDGET = 0.025


@pytest.fixture(scope="module")
def budgeted():
    h = sim(in_flight_budget_usd=BUDGET, in_flight_retry_after_s=3, providers=[
        {"name": "Held", "tag": "held", "latency_s": 0.6, "max_completion_tokens": 4000,
         **PRICES},
        {"name": "Quick", "tag": "quick", "max_completion_tokens": 4000, **PRICES},
        {"name": "Limited", "tag": "limited", "latency_s": 0.2, "faults": {"rate_limit": 1.0},
         **PRICES},
    ])
    yield h
    h.stop()


def _weight(n_prompt: int, max_tokens: int) -> float:
    return n_prompt * 1e-6 + max_tokens * 1e-5


def test_in_flight_budget_refuses_what_does_not_fit_and_releases_on_finish(budgeted):
    h = budgeted
    n_prompt = prompt_tokens(h, {"max_tokens": 1000, **only("quick")})
    w = _weight(n_prompt, 1000)  # ~0.01: two fit in 0.025, three do not
    assert h.stats()["in_flight_weight_usd"] == 0.0
    held = [in_background(post, h, {"max_tokens": 1000, **only("held")}) for _ in range(2)]
    assert wait_for(lambda: h.stats()["in_flight"] == 2, timeout=10)
    st = h.stats()
    assert st["in_flight_weight_usd"] == pytest.approx(2 * w)
    status, headers, body = post(h, {"max_tokens": 1000, **only("quick")})
    assert status == 402 and headers["Retry-After"] == "3"
    err = body["error"]
    assert err["code"] == 402 and err["message"].startswith("In-flight spending budget exhausted")
    assert err["metadata"] == {"reason": "in_flight_budget_exhausted",
                               "limit_source": "openrouter_in_flight_budget",
                               "in_flight_usd": pytest.approx(2 * w),
                               "request_usd": pytest.approx(w), "budget_usd": BUDGET}
    for t, box in held:
        t.join(10)
        assert box["result"][0] == 200
    st = wait_for(lambda: (s := h.stats())["in_flight"] == 0 and s)
    assert st["in_flight_weight_usd"] == 0.0
    assert 2 * w - 1e-12 <= st["in_flight_weight_peak_usd"] <= BUDGET
    assert st["failed"]["in_flight_budget"] >= 1
    # Freed: the same request fits again.
    assert post(h, {"max_tokens": 1000, **only("quick")})[0] == 200


def test_a_request_bigger_than_the_whole_budget(budgeted):
    h = budgeted
    n_prompt = prompt_tokens(h, {"max_tokens": 10, **only("quick")})
    before = h.stats()["failed"].get("weight_exceeds_budget", 0)
    status, headers, body = post(h, {"max_tokens": 3000, **only("quick")})
    assert status == 402 and "Retry-After" not in headers
    err = body["error"]
    assert err["message"].startswith("This request's estimated cost ($")
    assert "larger than your in-flight budget ($0.025)" in err["message"]
    assert err["metadata"] == {"reason": "weight_exceeds_budget",
                               "limit_source": "openrouter_credits",
                               "request_usd": pytest.approx(_weight(n_prompt, 3000)),
                               "budget_usd": BUDGET}
    # Without max_tokens the provider's max_completion_tokens (4000) is the estimate.
    status, _, body = post(h, only("quick"))
    assert status == 402
    assert body["error"]["metadata"]["request_usd"] == pytest.approx(_weight(n_prompt, 4000))
    st = h.stats()
    assert st["failed"]["weight_exceeds_budget"] == before + 2
    assert st["in_flight_weight_usd"] == 0.0


def test_weight_is_released_when_the_client_leaves_or_the_request_fails(budgeted):
    h = budgeted
    before = h.stats()["failed"]
    # A client that goes away while its request waits for the first token.
    body = json.dumps({"model": MODEL, "messages": USER, "max_tokens": 1000,
                       **only("held")}).encode()
    s = socket.create_connection(("127.0.0.1", port_of(h)), timeout=10)
    s.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
              % len(body) + body)
    assert wait_for(lambda: h.stats()["in_flight_weight_usd"] > 0.009)
    s.close()
    st = wait_for(lambda: (x := h.stats())["in_flight"] == 0 and x)
    assert st["in_flight_weight_usd"] == 0.0
    assert st["failed"]["cancelled"] == before.get("cancelled", 0) + 1
    # A failed request (a provider 429 after 0.2 s) holds its weight until it fails.
    t, box = in_background(post, h, {"max_tokens": 1000, **only("limited")})
    assert wait_for(lambda: h.stats()["in_flight_weight_usd"] > 0.009)
    t.join(10)
    assert box["result"][0] == 429
    assert h.stats()["in_flight_weight_usd"] == 0.0


def test_a_stream_holds_its_weight_until_it_ends(budgeted):
    h = budgeted
    t, box = in_background(post, h, {"max_tokens": 1000, "stream": True, **only("held")})
    assert wait_for(lambda: h.stats()["in_flight_weight_usd"] > 0.009)
    t.join(10)
    status, _, (_, events, done) = box["result"]
    assert status == 200 and done and events[-1]["usage"]["completion_tokens"] > 0
    assert h.stats()["in_flight_weight_usd"] == 0.0


def test_many_concurrent_requests_never_exceed_the_budget(budgeted):
    h = budgeted
    before = h.stats()
    runs = [in_background(post, h, {"max_tokens": 1000, "messages": [
        {"role": "user", "content": f"question {i}"}], **only("held")}) for i in range(12)]
    statuses = []
    for t, box in runs:
        t.join(15)
        statuses.append(box["result"][0])
    assert set(statuses) <= {200, 402} and statuses.count(200) >= 2 and 402 in statuses
    st = h.stats()
    assert st["in_flight_weight_peak_usd"] <= BUDGET
    assert st["failed"]["in_flight_budget"] - before["failed"].get("in_flight_budget", 0) \
        == statuses.count(402)
    assert st["in_flight_weight_usd"] == 0.0


def test_finished_requests_linger_in_the_running_weight():
    with sim(in_flight_budget_usd=0.015, in_flight_linger_s=1.0,
             providers=[{"name": "Quick", **PRICES}]) as h:
        t0 = time.monotonic()
        assert post(h, {"max_tokens": 1000})[0] == 200
        weight = h.stats()["in_flight_weight_usd"]
        assert h.stats()["in_flight"] == 0 and weight > 0.01
        status, headers, body = post(h, {"max_tokens": 1000})
        if time.monotonic() - t0 < 0.9:  # still lingering (a slow machine may be past it)
            assert status == 402 and headers["Retry-After"] == "1"
            assert body["error"]["metadata"]["in_flight_usd"] == pytest.approx(weight)
        assert wait_for(lambda: h.stats()["in_flight_weight_usd"] == 0.0, timeout=5)
        assert post(h, {"max_tokens": 1000})[0] == 200


def test_no_budget_no_weight():
    with sim() as h:
        assert post(h, {"max_tokens": 100})[0] == 200
        st = h.stats()
        assert st["in_flight_budget_usd"] is None
        assert st["in_flight_weight_usd"] == st["in_flight_weight_peak_usd"] == 0.0
        assert st["outage_active"] is False and st["outages_started"] == 0


# -- credits and spend budgets ---------------------------------------------------------------
def test_credits_402_names_its_limit_source():
    with sim(credit_limit_usd=0) as h:
        status, headers, body = post(h, {"max_tokens": 10})
        assert status == 402 and "Retry-After" not in headers
        assert body["error"]["metadata"] == {"limit_source": "openrouter_credits"}
        assert h.stats()["failed"] == {"credits": 1}


@pytest.mark.parametrize("source,scope", [("openrouter_guardrail_budget", "guardrail"),
                                          ("openrouter_workspace_budget", "workspace"),
                                          ("openrouter_key_limit", "key")])
def test_spend_limit_403(source, scope):
    resets = "2026-07-01T00:00:00Z" if scope != "guardrail" else None
    cfg: dict[str, Any] = {"spend_limit_usd": 1e-9}
    if scope != "guardrail":  # the default source
        cfg.update(spend_limit_source=source, spend_limit_resets_at=resets)
    with sim(**cfg) as h:
        assert post(h, {"max_tokens": 10})[0] == 200  # nothing spent yet
        spent = h.stats()["spent_usd"]
        assert spent > 1e-9
        for stream in (False, True):
            status, headers, body = post(h, {"max_tokens": 10, "stream": stream})
            assert status == 403 and "Retry-After" not in headers
            err = body["error"]
            assert err["code"] == 403 and err["message"].startswith("Budget limit exceeded: ")
            assert err["metadata"] == {"limit_source": source, "scope": scope,
                                       "limit_usd": 1e-9, "spend_usd": spent,
                                       "resets_at": resets}
        st = h.stats()
        assert st["failed"] == {"spend_limit": 2} and st["spend_limit_usd"] == 1e-9


def test_spend_limit_resets_at_as_a_toml_datetime(tmp_path):
    path = tmp_path / "sim.toml"
    path.write_text("spend_limit_usd = 5.0\nspend_limit_resets_at = 2026-07-01T00:00:00Z\n")
    assert load_sim_config(path).spend_limit_resets_at == "2026-07-01T00:00:00Z"


@pytest.mark.parametrize("text,needle", [
    ("in_flight_budget_usd = -1", "in_flight_budget_usd"),
    ('in_flight_budget_usd = "lots"', "in_flight_budget_usd"),
    ("in_flight_retry_after_s = -2", "in_flight_retry_after_s"),
    ("in_flight_linger_s = -0.5", "in_flight_linger_s"),
    ("spend_limit_usd = -3", "spend_limit_usd"),
    ('spend_limit_source = "openrouter_mood"', "spend_limit_source"),
    ('spend_limit_resets_at = "next tuesday"', "spend_limit_resets_at"),
    ('wrong_model_slug = ""', "wrong_model_slug"),
    ('[[providers]]\nname = "A"\nquirks = { wrong_model = 1.5 }', "quirks.wrong_model"),
    ("outages = 3", "outages"),
    ("[[outages]]\nduration_s = 1", "outages[0].start_s"),
    ("[[outages]]\nstart_s = 1\nduration_s = 0", "outages[0].duration_s"),
    ("[[outages]]\nstart_s = -1\nduration_s = 1", "outages[0].start_s"),
    ('[[outages]]\nstart_s = 1\nduration_s = 1\nmode = "flaky"', "outages[0].mode"),
    ("[[outages]]\nstart_s = 1\nduration_s = 1\ncolour = 2", "colour"),
    ("[[outages]]\nstart_s = 5\nduration_s = 1\n[[outages]]\nstart_s = 1\nduration_s = 4.5",
     "overlap"),
])
def test_new_config_errors_name_the_file_and_key(tmp_path, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_sim_config(path)
    assert needle in str(exc.value) and str(path) in str(exc.value)


def test_outage_windows_are_sorted_and_may_touch(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text('[[outages]]\nstart_s = 3\nduration_s = 1\nmode = "reset"\n'
                    "[[outages]]\nstart_s = 1\nduration_s = 2\n")
    cfg = load_sim_config(path)
    assert [(o.start_s, o.mode) for o in cfg.outages] == [(1.0, "refuse"), (3.0, "reset")]
    assert cfg.to_json()["outages"][0] == {"start_s": 1.0, "duration_s": 2.0, "mode": "refuse"}


# -- 429 details -----------------------------------------------------------------------------
def _post_429(h, body, retry_after):
    """Post `body`, expecting a 429 whose reset lies `retry_after` s after some moment while
    the request was in flight (an ordering on the wall clock, not a tolerance)."""
    sent = time.time()
    status, headers, answer = post(h, body)
    _check_429(status, headers, answer, retry_after, (sent, time.time()))


def _check_429(status, headers, body, retry_after, window):
    assert status == 429
    assert headers["Retry-After"] == str(retry_after).removesuffix(".0")
    assert body["error"]["metadata"]["retry_after_seconds"] == retry_after
    assert headers["X-RateLimit-Limit"] == "200" and headers["X-RateLimit-Remaining"] == "0"
    reset_ms = int(headers["X-RateLimit-Reset"])
    sent, got = window
    assert int((sent + retry_after) * 1000) <= reset_ms <= int((got + retry_after) * 1000) + 1


@pytest.mark.timing
def test_every_429_carries_retry_after_seconds_and_rate_limit_headers():
    with sim(retry_after_s=2.5, providers=[
            {"name": "Clean", "tag": "clean"},
            {"name": "Limited", "tag": "limited", "faults": {"rate_limit": 1.0}}]) as h:
        for i in range(4):  # provider-level (both metadata shapes), stream or not
            _post_429(h, {"messages": [{"role": "user", "content": str(i)}],
                          "stream": i % 2 == 1, **only("limited")}, 2.5)
        assert post(h, only("clean"))[0] == 200
    with sim(retry_after_s=4, faults={"rate_limit": 1.0}) as h:  # router-level
        _post_429(h, {"max_tokens": 10}, 4)
        assert h.stats()["failed"] == {"rate_limit": 1}


# -- outage windows --------------------------------------------------------------------------
OUTAGE_PROVIDERS = [{"name": "Fast", "tag": "fast"},
                    {"name": "Slow", "tag": "slow", "latency_s": 1.0}]


@pytest.mark.timing
def test_refuse_window_refuses_resets_and_comes_back_on_the_same_port():
    with sim(providers=OUTAGE_PROVIDERS,
             outages=[{"start_s": 0.5, "duration_s": 1.0, "mode": "refuse"}]) as h:
        url, port = h.url, port_of(h)
        assert post(h, {"max_tokens": 10, **only("fast")})[0] == 200
        # A request in flight when the window starts loses its connection.
        t, box = in_background(post, h, {"max_tokens": 10, **only("slow")})
        assert wait_for(lambda: h.stats()["in_flight"] == 1, timeout=5)
        assert wait_for(lambda: refused(port), timeout=5, interval=0.02)
        st = h.stats()  # in-process: /sim/stats itself is unreachable now
        assert st["outage_active"] is True and st["outages_started"] == 1
        t.join(5)
        assert isinstance(box.get("error"), NETWORK_ERRORS), box
        with pytest.raises(urllib.error.URLError) as exc:
            post(h, {"max_tokens": 10, **only("fast")})
        assert isinstance(exc.value.reason, ConnectionRefusedError)
        # Back after the window (it was refused above), same port, same URL.
        assert wait_for(lambda: not refused(port), timeout=5, interval=0.02)
        assert h.url == url and port_of(h) == port
        assert post(h, {"max_tokens": 10, **only("fast")})[0] == 200
        st = h.stats()
        assert st["outage_active"] is False and st["outages_started"] == 1
        assert st["failed"] == {"cancelled": 1} and st["in_flight"] == 0


def _raw_post(port: int, body: dict) -> bytes:
    """Send one request on a new connection; what came back before the reset (or close)."""
    data = json.dumps({"model": MODEL, "messages": USER, **body}).encode()
    try:  # the reset can come before connect() returns
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except ConnectionResetError:
        return b""
    got = b""
    try:
        s.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                  b"\r\n" % len(data) + data)
        while chunk := s.recv(65536):
            got += chunk
    except (ConnectionResetError, BrokenPipeError):
        return got
    finally:
        s.close()
    raise AssertionError(f"closed without a reset: {got[:200]!r}")


def test_reset_window_resets_new_connections_and_new_requests():
    with sim(providers=OUTAGE_PROVIDERS,
             outages=[{"start_s": 0.6, "duration_s": 1.2, "mode": "reset"}]) as h:
        port = port_of(h)
        keep = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        payload = json.dumps({"model": MODEL, "messages": USER, "max_tokens": 10,
                              **only("fast")})
        keep.request("POST", CHAT, payload, {"Content-Type": "application/json"})
        assert keep.getresponse().read() and True
        # Started before the window, answered during it: an answer under way finishes.
        t, box = in_background(post, h, {"max_tokens": 10, **only("slow")})
        assert wait_for(lambda: h.stats()["outage_active"], timeout=5, interval=0.02)
        assert not refused(port)  # connections are accepted ...
        assert _raw_post(port, {"max_tokens": 10, **only("fast")}) == b""  # ... and reset
        with pytest.raises(NETWORK_ERRORS):  # a new request on a keep-alive connection too
            keep.request("POST", CHAT, payload, {"Content-Type": "application/json"})
            keep.getresponse().read()
        keep.close()
        t.join(5)
        assert box["result"][0] == 200
        assert wait_for(lambda: not h.stats()["outage_active"], timeout=5, interval=0.02)
        assert post(h, {"max_tokens": 10, **only("fast")})[0] == 200
        st = h.stats()
        assert st["outages_started"] == 1 and st["completed"] == 3


def test_outages_by_hand_and_several_windows():
    with sim(providers=OUTAGE_PROVIDERS) as h:
        port = port_of(h)
        h.begin_outage("refuse")
        assert refused(port) and h.outage_active
        h.end_outage()
        assert not refused(port) and not h.outage_active
        h.begin_outage("reset")
        assert _raw_post(port, {"max_tokens": 10}) == b""
        h.end_outage()
        assert post(h, {"max_tokens": 10, **only("fast")})[0] == 200
        assert h.stats()["outages_started"] == 2
        with pytest.raises(ValueError):
            h.begin_outage("sideways")
    with sim(outages=[{"start_s": 0.1, "duration_s": 0.3},
                      {"start_s": 0.5, "duration_s": 0.3, "mode": "reset"}]) as h:
        assert wait_for(lambda: h.stats()["outages_started"] == 2, timeout=5, interval=0.02)
        assert wait_for(lambda: not h.stats()["outage_active"], timeout=5, interval=0.02)
        assert post(h, {"max_tokens": 10})[0] == 200


def test_an_outage_cancels_streams_under_way_and_releases_their_weight():
    with sim(in_flight_budget_usd=1.0, providers=[
            {"name": "Trickle", "tokens_per_second": 20, **PRICES}]) as h:
        runs = [in_background(post, h, {"max_tokens": 200, "stream": True,
                                        "messages": [{"role": "user", "content": str(i)}]})
                for i in range(3)]
        assert wait_for(lambda: h.stats()["in_flight"] == 3, timeout=5)
        assert h.stats()["in_flight_weight_usd"] > 0.006
        h.begin_outage("refuse")
        st = wait_for(lambda: (x := h.stats())["in_flight"] == 0 and x, timeout=5)
        assert st["failed"] == {"cancelled": 3} and st["in_flight_weight_usd"] == 0.0
        for t, box in runs:
            t.join(5)
            assert isinstance(box.get("error"), NETWORK_ERRORS), box  # cut off mid-stream
        h.end_outage()
        assert post(h, {"max_tokens": 5})[0] == 200


def test_cli_schedules_outage_windows(tmp_path):
    proc = SimProcess(tmp_path, "[[outages]]\nstart_s = 1.0\nduration_s = 1.0\n")
    try:
        port = int(proc.root.rsplit(":", 1)[1])
        assert wait_for(lambda: refused(port), timeout=10, interval=0.02)
        assert wait_for(lambda: not refused(port), timeout=10, interval=0.02)
        status, body, _ = proc.chat({"messages": USER, "max_tokens": 10})
        assert status == 200
        st = proc.stats()
        assert st["outages_started"] == 1 and st["outage_active"] is False
    finally:
        proc.stop()


# -- wrong model -----------------------------------------------------------------------------
def test_wrong_model_quirk_names_another_model_everywhere():
    with sim(wrong_model_slug="openai/gpt-4o-mini", providers=[
            {"name": "Clean", "tag": "clean", **PRICES},
            {"name": "Wrong", "tag": "wrong", "quirks": {"wrong_model": 1.0}, **PRICES},
            {"name": "Both", "tag": "both",
             "quirks": {"wrong_model": 1.0, "im_end_in_content": 1.0}}]) as h:
        status, _, body = post(h, {"max_tokens": 50, "return_token_ids": True, **only("wrong")})
        assert status == 200 and body["model"] == "openai/gpt-4o-mini"
        assert body["specgen_sim"]["quirks"] == ["wrong_model"]
        usage = body["usage"]  # billed normally
        assert usage["cost"] == pytest.approx(usage["prompt_tokens"] * 1e-6
                                              + usage["completion_tokens"] * 1e-5)
        assert body["choices"][0]["message"]["content"]
        status, _, (_, events, done) = post(h, {"max_tokens": 50, "stream": True,
                                                "return_token_ids": True, **only("wrong")})
        assert status == 200 and done and len(events) > 3
        assert {e["model"] for e in events} == {"openai/gpt-4o-mini"}
        assert events[-1]["specgen_sim"]["quirks"] == ["wrong_model"]
        status, _, body = post(h, {"max_tokens": 50, "return_token_ids": True, **only("both")})
        assert body["model"] == "openai/gpt-4o-mini"
        assert body["specgen_sim"]["quirks"] == ["im_end_in_content", "wrong_model"]
        status, _, body = post(h, {"max_tokens": 50, **only("clean")})
        assert body["model"] == MODEL + "-20260127"
        st = h.stats()
        assert st["quirks"] == {"wrong_model": 3, "im_end_in_content": 1}
        assert st["completed"] == 4 and st["spent_usd"] > 0


def test_wrong_model_default_slug():
    with sim(providers=[{"name": "Wrong", "quirks": {"wrong_model": 1.0}}]) as h:
        assert post(h, {"max_tokens": 10})[2]["model"] == "meta-llama/llama-3-8b"


# -- OpenRouter-only request fields ----------------------------------------------------------
def test_transforms_plugins_and_models_are_accepted_and_type_checked():
    with sim() as h:
        status, _, body = post(h, {"max_tokens": 10, "transforms": [],
                                   "plugins": [{"id": "context-compression", "enabled": False}],
                                   "models": [MODEL, "other/model"]})
        assert status == 200 and body["model"] == MODEL + "-20260127"
        assert post(h, {"max_tokens": 10, "transforms": ["middle-out"], "plugins": []})[0] == 200
        for extra, field in [({"transforms": "middle-out"}, "transforms"),
                             ({"transforms": [1]}, "transforms[0]"),
                             ({"plugins": {"id": "x"}}, "plugins"),
                             ({"plugins": ["context-compression"]}, "plugins[0]"),
                             ({"models": MODEL}, "models"),
                             ({"models": [MODEL, 3]}, "models[1]")]:
            status, _, body = post(h, {"max_tokens": 10, **extra})
            assert status == 400 and body["error"]["message"].startswith(field + ":"), body
