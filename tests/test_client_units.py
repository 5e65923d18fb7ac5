"""Client pieces without a network: SSE parser, body parser, error classes, backoff, balancer."""

from __future__ import annotations

import json
import random
import time
from email.utils import formatdate

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specgen.client import ApiError, backoff_delay, parse_rate_limit_reset, parse_retry_after
from specgen.client.balancer import Balancer, normalize_base_url
from specgen.client.errors import Redactor, classify_status, error_from_response
from specgen.client.parse import StreamParser, parse_completion


def sse(*chunks: dict | str, done: bool = True, nl: bytes = b"\n") -> bytes:
    out = b""
    for c in chunks:
        payload = c.encode() if isinstance(c, str) else orjson.dumps(c)
        out += b"data: " + payload + nl + nl
    if done:
        out += b"data: [DONE]" + nl + nl
    return out


def delta(**d) -> dict:
    return {"id": "gen-1", "model": "moonshotai/kimi-k2.5", "provider": "Moonshot",
            "choices": [{"index": 0, "delta": d}]}


STREAM = [
    delta(role="assistant", content=""),
    delta(reasoning="Let me "),
    delta(reasoning="think."),
    delta(content="Hello "),
    delta(content="world"),
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop",
                  "native_finish_reason": "end_turn"}]},
    {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.0012}},
]


def parse_stream(data: bytes, pieces: list[int] | None = None):
    p = StreamParser()
    if pieces is None:
        p.feed(data)
    else:
        pos = 0
        for n in pieces:
            p.feed(data[pos:pos + n])
            pos += n
        if pos < len(data):
            p.feed(data[pos:])
    return p.finish()


def test_stream_canonical():
    r = parse_stream(b": OPENROUTER PROCESSING\n\n" + sse(*STREAM))
    assert r.content == "Hello world"
    assert r.reasoning == "Let me think." and r.reasoning_field == "reasoning"
    assert r.finish_reason == "stop" and r.native_finish_reason == "end_turn"
    assert r.provider == "Moonshot" and r.model == "moonshotai/kimi-k2.5" and r.id == "gen-1"
    assert r.usage == {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.0012}
    assert r.cost_usd == 0.0012 and r.completion_tokens == 5
    assert r.stream and r.tool_calls == []


def test_stream_every_byte_split_and_crlf():
    data = b": OPENROUTER PROCESSING\r\n\r\n" + sse(*STREAM, nl=b"\r\n")
    whole = parse_stream(data)
    bytewise = parse_stream(data, [1] * len(data))
    assert whole == bytewise
    assert whole.content == "Hello world" and whole.usage["prompt_tokens"] == 10


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), max_size=60))
def test_stream_any_split_gives_same_answer(pieces):
    data = sse(*STREAM, nl=b"\r\n") + b"\n"
    assert parse_stream(data, pieces) == parse_stream(data)


def test_sse_multiline_empty_data_comments_and_other_fields():
    chunk = orjson.dumps(delta(content="multi"), option=orjson.OPT_INDENT_2).split(b"\n")
    data = (b": keep-alive\n\nevent: message\nid: 7\nretry: 100\n"
            + b"".join(b"data: " + line + b"\n" for line in chunk) + b"\n"
            + b"data:\n\n"  # empty data: nothing to parse
            + b"data:" + orjson.dumps(delta(content="!")) + b"\n\n"  # no space after colon
            + sse(STREAM[5]))
    r = parse_stream(data)
    assert r.content == "multi!" and r.finish_reason == "stop"


def test_events_without_blank_line_between():
    data = b"".join(b"data: " + orjson.dumps(c) + b"\n" for c in STREAM) + b"\ndata: [DONE]\n\n"
    r = parse_stream(data)
    assert r.content == "Hello world" and r.usage["completion_tokens"] == 5


def test_done_stops_parsing_and_eof_rules():
    r = parse_stream(sse(*STREAM) + b"data: {not json\n\n")
    assert r.content == "Hello world"
    # EOF without [DONE] but with a finish reason: accepted
    assert parse_stream(sse(*STREAM, done=False)).finish_reason == "stop"
    # last line without its newline is still parsed
    r = parse_stream(sse(*STREAM[:6], done=False).rstrip(b"\n"))
    assert r.finish_reason == "stop"
    with pytest.raises(ApiError) as e:
        parse_stream(sse(*STREAM[:4], done=False))
    assert e.value.kind == "connection" and "[DONE]" in e.value.message


def test_tool_call_deltas_merge_by_index():
    def tc(**kw):
        return delta(tool_calls=[kw])

    chunks = [
        tc(index=0, id="call_a", type="function", function={"name": "get_weather",
                                                           "arguments": ""}),
        tc(index=0, function={"arguments": '{"city": '}),
        tc(index=1, id="call_b", function={"name": "get_time", "arguments": "{}"}),
        tc(index=0, function={"arguments": '"Paris"}'}),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    r = parse_stream(sse(*chunks))
    assert [(c.index, c.id, c.name, c.arguments) for c in r.tool_calls] == [
        (0, "call_a", "get_weather", '{"city": "Paris"}'),
        (1, "call_b", "get_time", "{}"),
    ]
    assert r.finish_reason == "tool_calls" and r.content is None


def test_tool_call_deltas_without_index_and_object_arguments():
    chunks = [
        delta(tool_calls=[{"id": "c1", "function": {"name": "f", "arguments": '{"a":'}}]),
        delta(tool_calls=[{"function": {"arguments": "1}"}}]),
        delta(tool_calls=[{"id": "c2", "function": {"name": "g", "arguments": {"b": 2}}}]),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    r = parse_stream(sse(*chunks))
    assert [(c.id, c.name, c.arguments) for c in r.tool_calls] == [
        ("c1", "f", '{"a":1}'), ("c2", "g", '{"b":2}')]


def test_reasoning_content_field_and_true_ids():
    chunks = [
        {"prompt_token_ids": [1, 2, 3], "choices": [{"index": 0, "delta": {"role": "assistant"},
                                                      "token_ids": []}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}, "token_ids": [7]}]},
        {"choices": [{"index": 0, "delta": {"content": "ok"}, "token_ids": [8, 9]}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [2]}]},
    ]
    r = parse_stream(sse(*chunks))
    assert r.reasoning == "hm" and r.reasoning_field == "reasoning_content"
    assert r.prompt_token_ids == [1, 2, 3] and r.completion_token_ids == [7, 8, 9, 2]


def test_both_reasoning_fields_are_not_doubled():
    r = parse_stream(sse(delta(reasoning="a", reasoning_content="a"), STREAM[5]))
    assert r.reasoning == "a" and r.reasoning_field == "reasoning"


def test_provider_from_a_later_chunk():
    chunks = [{"choices": [{"index": 0, "delta": {"content": "x"}}]},
              {"provider": "Fireworks", "choices": [{"index": 0, "delta": {},
                                                     "finish_reason": "stop"}]}]
    assert parse_stream(sse(*chunks)).provider == "Fireworks"


def test_mid_stream_error_chunk_keeps_usage():
    chunks = [delta(content="partial"),
              {"provider": "Moonshot", "error": {"code": 502, "message": "Provider crashed",
                                                 "metadata": {"provider_name": "Moonshot"}},
               "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}],
               "usage": {"prompt_tokens": 5, "completion_tokens": 1, "cost": 0.0001}}]
    with pytest.raises(ApiError) as e:
        parse_stream(sse(*chunks))
    err = e.value
    assert err.kind == "stream_error" and err.retryable
    assert "Provider crashed" in err.message and err.provider == "Moonshot"
    assert err.cost_usd == 0.0001 and err.code == 502


def test_finish_reason_error_alone_is_a_stream_error():
    chunks = [delta(content="x"), {"choices": [{"index": 0, "delta": {},
                                                "finish_reason": "error"}]}]
    with pytest.raises(ApiError) as e:
        parse_stream(sse(*chunks))
    assert e.value.kind == "stream_error"


@pytest.mark.parametrize("chunk, words", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"choices": {"a": 1}}', "choices must be a list"),
    ('{"choices": [5]}', "choices[0]"),
    ('{"choices": [{"delta": "x"}]}', "delta must be an object"),
    ('{"choices": [{"delta": {"content": 5}}]}', "content must be a string"),
    ('{"choices": [{"delta": {"tool_calls": {"x": 1}}}]}', "tool_calls must be a list"),
    ('{"choices": [{"delta": {}, "token_ids": ["a"]}]}', "token ids"),
])
def test_stream_wrong_shapes_are_invalid_response(chunk, words):
    with pytest.raises(ApiError) as e:
        parse_stream(sse(delta(content="a"), chunk))
    assert e.value.kind == "invalid_response" and words in e.value.message
    assert len(e.value.message) < 400


def test_a_usage_that_is_not_an_object_is_missing_with_a_warning():
    # not a reason to lose the answer (issue 25): treated as missing, the engine counts it
    resp = parse_stream(sse(delta(content="a"), '{"choices": [], "usage": [1]}'))
    assert resp.usage == {} and resp.usage_warnings == ["usage is list, not an object: ignored"]


@pytest.mark.parametrize("first", [
    {"prompt_token_ids": [-1], "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"prompt_token_ids": "1 2 3", "choices": []},
    {"choices": [{"index": 0, "delta": {}, "prompt_token_ids": [1.5]}]},
])
def test_bad_prompt_ids_on_the_first_chunk(first):
    with pytest.raises(ApiError) as e:
        parse_stream(sse(first, STREAM[5]))
    assert e.value.kind == "invalid_response" and "token ids" in e.value.message


def test_huge_garbage_line_is_refused_briefly():
    p = StreamParser()
    with pytest.raises(ApiError) as e:
        for _ in range(20):
            p.feed(b"x" * (1024 * 1024))
    assert e.value.kind == "invalid_response" and len(str(e.value)) < 200


# -- non-stream ---------------------------------------------------------------------------------


def body(**over) -> bytes:
    obj = {
        "id": "gen-9", "model": "moonshotai/kimi-k2.5-0127", "provider": "Together",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "native_finish_reason": "tc",
                     "message": {"role": "assistant", "content": "", "reasoning": "why",
                                 "tool_calls": [{"id": "c1", "type": "function", "function": {
                                     "name": "f", "arguments": '{"x": 1}'}}]},
                     "token_ids": [5, 6]}],
        "prompt_token_ids": [1, 2],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2, "cost": 0.5},
    }
    obj.update(over)
    return orjson.dumps(obj)


def test_non_stream_full():
    r = parse_completion(body())
    assert r.content == "" and r.reasoning == "why" and r.reasoning_field == "reasoning"
    assert [(c.index, c.id, c.name, c.arguments) for c in r.tool_calls] == [
        (0, "c1", "f", '{"x": 1}')]
    assert r.finish_reason == "tool_calls" and r.native_finish_reason == "tc"
    assert r.provider == "Together" and r.model.endswith("0127") and r.id == "gen-9"
    assert r.prompt_token_ids == [1, 2] and r.completion_token_ids == [5, 6]
    assert r.cost_usd == 0.5 and not r.stream


def test_non_stream_reasoning_content_and_leading_whitespace():
    data = b"\n\n   " + orjson.dumps({"choices": [{"message": {
        "content": "a", "reasoning_content": "r"}, "finish_reason": "stop"}]})
    r = parse_completion(data)
    assert r.reasoning == "r" and r.reasoning_field == "reasoning_content"


@pytest.mark.parametrize("obj", [
    {"error": {"code": 502, "message": "upstream died"}, "usage": {"cost": 0.2}},
    {"choices": [{"message": {"content": "par"}, "finish_reason": "error",
                  "error": {"code": 500, "message": "upstream died"}}], "usage": {"cost": 0.2}},
])
def test_error_in_200(obj):
    with pytest.raises(ApiError) as e:
        parse_completion(orjson.dumps(obj))
    assert e.value.kind == "error_in_body" and "upstream died" in e.value.message
    assert e.value.cost_usd == 0.2


@pytest.mark.parametrize("data, words", [
    (b"", "empty"),
    (b"<html>bad gateway</html>", "not valid JSON"),
    (b"[]", "JSON object"),
    (b'{"choices": []}', "no choices"),
    (b'{"id": "x"}', "no choices"),
    (b'{"choices": [{"finish_reason": "stop"}]}', "no message"),
    (b'{"choices": [{"message": {"content": 3}}]}', "content must be a string"),
    (b'{"choices": [{"message": {"tool_calls": [{"function": {"name": 1}}]}}]}', "name"),
    (b'{"choices": [{"message": {}, "token_ids": "abc"}]}', "token ids"),
])
def test_non_stream_wrong_shapes(data, words):
    with pytest.raises(ApiError) as e:
        parse_completion(data)
    assert e.value.kind == "invalid_response" and words in e.value.message


# -- error classes ------------------------------------------------------------------------------


@pytest.mark.parametrize("status, kind", [
    (400, "bad_request"), (401, "auth"), (402, "credits"), (403, "moderation"),
    (404, "no_endpoints"), (408, "timeout"), (429, "rate_limit"), (500, "server"),
    (502, "server"), (503, "overloaded"), (504, "server"), (524, "server"),
    (529, "overloaded"), (599, "server"), (418, "bad_request"), (302, "bad_request"),
])
def test_classify_status(status, kind):
    assert classify_status(status) == kind


def test_error_bodies_keep_what_the_engine_needs():
    e = error_from_response(403, {}, orjson.dumps({"error": {
        "code": 403, "message": "flagged", "metadata": {
            "reasons": ["violence"], "flagged_input": "...", "provider_name": "Moonshot"}}}))
    assert e.kind == "moderation" and e.reasons == ["violence"] and e.provider == "Moonshot"
    assert "violence" in e.message and not e.retryable and not e.fatal_for_run

    e = error_from_response(404, {}, orjson.dumps({"error": {
        "code": 404, "message": "No endpoints found", "availability": {
            "code": "constraint_filtered", "retryable": False}}}))
    assert e.kind == "no_endpoints" and e.fatal_for_run
    assert e.availability == {"code": "constraint_filtered", "retryable": False}

    e = error_from_response(502, {}, orjson.dumps({"error": {
        "code": 502, "message": "Provider returned error",
        "metadata": {"provider_name": "Chutes", "raw": "x" * 5000}}}))
    assert e.provider == "Chutes" and "raw: xxx" in e.message and len(e.message) < 400

    e = error_from_response(400, {}, orjson.dumps({"error": {
        "code": 400, "message": "context too long",
        "metadata": {"error_type": "context_length", "provider_code": "413"}}}))
    assert "error_type=context_length" in e.message and "provider_code=413" in e.message

    e = error_from_response(500, {}, orjson.dumps({"error": {"message": "x"},
                                                   "usage": {"cost": 0.3}}))
    assert e.cost_usd == 0.3

    e = error_from_response(503, {}, b"<html>" + b"y" * 100000)
    assert e.kind == "overloaded" and len(e.message) < 400


def test_retry_after_headers():
    now = 1_700_000_000.0
    assert parse_retry_after("7", now=now) == 7.0
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30, 1)
    assert parse_retry_after("garbage", now=now) is None
    assert parse_retry_after(None) is None
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert parse_rate_limit_reset(str(int((now + 12) * 1000)), now=now) == pytest.approx(12)
    assert parse_rate_limit_reset(str(int(now + 5)), now=now) == pytest.approx(5)
    assert parse_rate_limit_reset("3", now=now) == 3.0
    e = error_from_response(429, {"Retry-After": "4"}, b"{}")
    assert e.kind == "rate_limit" and e.retry_after == 4.0
    ms = str(int((time.time() + 20) * 1000))
    e = error_from_response(429, {"X-RateLimit-Reset": ms}, b"{}")
    assert 15 < e.retry_after <= 20


def test_redactor():
    r = Redactor("sk-secret-123")
    assert r.text("key sk-secret-123 here") == "key [REDACTED] here"
    assert r.obj({"a": ["sk-secret-123"]}) == {"a": ["[REDACTED]"]}
    assert "sk-secret" not in repr(r)
    assert Redactor(None).text("anything") == "anything"


# -- backoff ------------------------------------------------------------------------------------


def test_backoff_full_jitter_bounds_and_cap():
    rng = random.Random(1)
    for attempt in range(1, 12):
        ceiling = min(60.0, 2.0 ** (attempt - 1))
        delays = [backoff_delay(attempt, rng=rng) for _ in range(300)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > 0.7 * ceiling  # spread over the whole range, not a constant
    assert backoff_delay(0, rng=rng) <= 1.0  # attempt < 1 counts as the first retry
    assert all(backoff_delay(1000, rng=rng) <= 60.0 for _ in range(50))
    assert all(backoff_delay(5, base=0.1, cap=2.0, rng=rng) <= 1.6 for _ in range(50))


def test_backoff_honours_retry_after_as_floor():
    rng = random.Random(2)
    delays = [backoff_delay(1, retry_after=10.0, rng=rng) for _ in range(200)]
    assert all(10.0 <= d <= 11.0 for d in delays)
    assert len({round(d, 6) for d in delays}) > 100  # not all at the same instant
    assert all(d >= 3.0 for d in (backoff_delay(8, retry_after=3.0, rng=rng) for _ in range(50)))
    assert backoff_delay(1, retry_after=float("nan"), rng=rng) <= 1.0
    assert backoff_delay(1, retry_after=-5, rng=rng) <= 1.0


# -- balancer -----------------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_base_url_normalisation():
    assert normalize_base_url("https://openrouter.ai/api/v1/") == "https://openrouter.ai/api/v1"
    assert normalize_base_url("http://h:8000/v1/chat/completions") == "http://h:8000/v1"
    for bad in ("", "ftp://x/v1", "openrouter.ai/api/v1", "http://user:pw@h/v1"):
        with pytest.raises(ValueError):
            normalize_base_url(bad)
    b = Balancer(["https://openrouter.ai/api/v1"])
    assert str(b.endpoints[0].chat_url) == "https://openrouter.ai/api/v1/chat/completions"
    with pytest.raises(ValueError, match="duplicate"):
        Balancer(["http://a/v1", "http://a/v1/"])


def test_least_in_flight_with_round_robin_ties():
    b = Balancer([f"http://h{i}:8000/v1" for i in range(3)], clock=Clock())
    h0, h1, h2 = b.endpoints
    held = [b.acquire() for _ in range(9)]
    assert b.in_flight() == {f"http://h{i}:8000/v1": 3 for i in range(3)}
    for ep in held:
        b.release(ep, True)
    slow = _take(b, h0)  # h0 keeps one request in flight
    nxt = [b.acquire(), b.acquire()]
    assert {id(e) for e in nxt} == {id(h1), id(h2)}
    nxt.append(b.acquire())  # all had one: a three-way tie, any may take it
    assert sorted(b.in_flight().values()) == [1, 1, 2]
    for ep in nxt + [slow]:
        b.release(ep, True)
    order = []
    for _ in range(6):  # sequential requests on idle servers rotate
        ep = b.acquire()
        order.append(ep.url)
        b.release(ep, True)
    assert len(set(order[:3])) == 3 and order[:3] == order[3:]


def test_cooldown_after_connection_failures_and_recovery():
    clock = Clock()
    b = Balancer(["http://a/v1", "http://b/v1"], failure_threshold=3, cooldown=5,
                 max_cooldown=12, clock=clock)
    a = b.endpoints[0]
    for _ in range(3):
        b.release(_take(b, a), False)
    assert a.cooled_until == clock.t + 5 and a.cooldowns == 1
    assert all(b.acquire().url == "http://b/v1" for _ in range(10))
    clock.t += 5.1
    assert any(b.acquire() is a for _ in range(3))  # tried again after the pause
    b.release(_take(b, a), False)  # one relapse cools it again, twice as long
    assert a.cooled_until == pytest.approx(clock.t + 10)
    clock.t += 10.1
    b.release(_take(b, a), False)
    assert a.cooled_until == pytest.approx(clock.t + 12)  # capped
    clock.t += 12.1
    b.release(_take(b, a), True)  # healthy again
    assert a.cooldowns == 0 and a.consecutive_failures == 0
    b.release(_take(b, a), False)
    assert a.cooled_until < clock.t  # a single failure no longer cools it
    stats = {s["url"]: s for s in b.stats()}
    assert stats["http://a/v1"]["connection_errors"] == 6


def test_all_cooled_uses_the_one_recovering_first():
    clock = Clock()
    b = Balancer(["http://a/v1", "http://b/v1"], failure_threshold=1, cooldown=5, clock=clock)
    a, bb = b.endpoints
    b.release(_take(b, a), False)
    clock.t += 1
    b.release(_take(b, bb), False)
    assert b.acquire() is a


def test_single_url_is_never_cooled():
    b = Balancer(["http://a/v1"], failure_threshold=1)
    for _ in range(5):
        b.release(b.acquire(), False)
    assert b.endpoints[0].cooled_until == 0 and b.acquire() is b.endpoints[0]


def _take(b: Balancer, ep):
    ep.in_flight += 1
    ep.requests += 1
    return ep


# -- the frame shortcut (frames.py) gives exactly what the full parser gives -------------------

_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
_PIECE = st.one_of(_TEXT, st.sampled_from(
    ['"', "\\", '\\"', '"},"token_ids":[', '"}', "]", "[", "\n", "\u2028", "é", "😀",
     '","reasoning":"x', '"content":"', "data: ", "\\u0041"]))


def _encode(obj, style: int) -> bytes:
    if style == 0:
        return orjson.dumps(obj)
    return json.dumps(obj, ensure_ascii=style == 1, separators=(",", ":") if style < 3
                      else (", ", ": ")).encode()


@st.composite
def token_streams(draw):
    style = draw(st.integers(0, 3))
    with_ids = draw(st.booleans())
    ids_first = draw(st.booleans())
    head = {"id": "gen-x", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "provider": "P"}
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}]}]
    n = draw(st.integers(1, 25))
    for _ in range(n):
        field = draw(st.sampled_from(["content", "reasoning", "reasoning_content"]))
        text = draw(_PIECE)
        delta = {field: text}
        if draw(st.booleans()):
            delta["role"] = "assistant"
        if field == "reasoning" and draw(st.booleans()):  # OpenRouter's copy of the text
            copy = text if draw(st.booleans()) else draw(_PIECE)
            delta["reasoning_details"] = [{"type": "reasoning.text", "text": copy,
                                           "format": "unknown", "index": 0}]
        choice = {"index": 0, "delta": delta, "finish_reason": None}
        if with_ids:
            ids = draw(st.lists(st.integers(0, 2**32 - 1), max_size=3))
            choice = ({"token_ids": ids, **choice} if ids_first else {**choice, "token_ids": ids})
        if draw(st.integers(0, 9)) == 0:  # now and then something a frame must not swallow
            choice["finish_reason"] = draw(st.sampled_from(["stop", "length", "error", "ok"]))
        chunks.append({**head, "choices": [choice]})
    chunks.append({**head, "choices": [], "usage": {"completion_tokens": n}})
    data = b"".join(b"data: " + _encode(c, style) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    cuts = draw(st.lists(st.integers(1, 60), max_size=20))
    return data, cuts


def _outcome(data: bytes, cuts: list[int], fast: bool):
    StreamParser.FAST = fast
    try:
        return parse_stream(data, cuts)
    except ApiError as err:
        return (err.kind, err.message)
    finally:
        StreamParser.FAST = True


@settings(max_examples=300, deadline=None)
@given(token_streams())
def test_frames_match_the_full_parser(stream):
    data, cuts = stream
    assert _outcome(data, cuts, True) == _outcome(data, cuts, False)


# Slots that a run read at once must treat exactly as the event loop does: escaped quotes,
# escaped backslashes, a dangling backslash (whose quote the next slot's text could close)
_RUN_PIECE = st.one_of(_TEXT, st.sampled_from(
    ['say \\"hi\\"', "a\\\\", "\\", "a\\", ',"z', '\\",\\"', "\\\\\\", "\\u00e9", "\\ud83d",
     "\\ude00", "x\ny", "", '"', "\\n"]))


@st.composite
def runs_of_frames(draw):
    """A stream whose chunks are mostly one frame with raw slot bytes (some not valid JSON
    string bodies), fed in blocks of whole and cut events."""
    head = (b'data: {"id":"gen-1","object":"chat.completion.chunk","provider":"P","choices":'
            b'[{"index":0,"delta":{"content":"')
    tail = b'"},"finish_reason":null}]}\n\n'
    events = [head + b'first' + tail]
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.integers(0, 19))
        if kind == 0:  # another chunk in the middle of the run
            events.append(sse(delta(reasoning="r"), done=False))
        elif kind == 1:  # the same event again (a retransmission)
            events.append(events[-1])
        elif kind == 2:  # the frame but for one byte next to the slot: not the frame
            events.append(head.replace(b'"content":"', b'"contenx":"') + b"y" + tail)
        elif kind == 3:  # a token that carries more than the frame (a vLLM stop reason)
            events.append(head + b"last" + tail.replace(b"null", b'null,"stop_reason":7'))
        else:
            piece = draw(_RUN_PIECE)
            raw = piece.encode() if draw(st.booleans()) else orjson.dumps(piece)[1:-1]
            events.append(head + raw + tail)
    events.append(sse(STREAM[5], STREAM[6]))
    data = b"".join(events)
    cuts, pos = [], 0
    while pos < len(data):
        n = draw(st.integers(1, 10))  # whole events per block, now and then cut mid-event
        size = sum(len(e) for e in events[:n]) + draw(st.integers(-30, 30))
        cuts.append(max(1, size))
        pos += cuts[-1]
    return data, cuts


@settings(max_examples=400, deadline=None)
@given(runs_of_frames())
def test_runs_of_frames_read_at_once_match_the_full_parser(stream):
    data, cuts = stream
    assert _outcome(data, cuts, True) == _outcome(data, cuts, False)


def test_runs_of_frames_are_read_at_once(monkeypatch):
    """A block of whole token chunks of the newest frame is taken by one pass (and a cut
    event waits for its end); what the run cannot prove goes through the event loop."""
    from specgen.client import frames

    taken = []
    real = frames.Frame.take_run

    def spy(self, block):
        out = real(self, block)
        taken.append(0 if out is None else len(out[0]))
        return out

    monkeypatch.setattr(frames.Frame, "take_run", spy)
    chunks = [delta(content=f"t{i} \"q\" \\") for i in range(40)]
    data = sse(*chunks, STREAM[5], STREAM[6])
    one = len(sse(chunks[0], done=False))
    r = parse_stream(data, [one] + [one * 10 - 7, one * 10 + 7] * 2)
    assert r.content == "".join(f"t{i} \"q\" \\" for i in range(40))
    assert r.finish_reason == "stop" and r.usage["completion_tokens"] == 5
    assert sum(taken) >= 30 and max(taken) >= 9
    monkeypatch.undo()
    # a slot ending in a backslash escapes the frame's closing quote: the event loop's
    # verdict (the full parser's), not the run's
    good = orjson.dumps(delta(content="a"))
    bad = good.replace(b'"content":"a"', b'"content":"a\\"')
    z = good.replace(b'"content":"a"', b'"content":",\"z"')
    data = b"".join(b"data: " + c + b"\n\n" for c in (good, good.replace(b'"a"', b'"b"'),
                                                       bad, z)) + sse(STREAM[5])
    assert _outcome(data, [len(good) + 8], True) == _outcome(data, [len(good) + 8], False)
    assert _outcome(data, [len(good) + 8], True)[0] == "invalid_response"


def test_a_repeat_after_a_run_is_noted_where_it_is():
    """A run is kept as one piece; an event repeating the run's last one is still noted at
    its own offset, in its own field."""
    chunks = [delta(content=f"t{i}") for i in range(10)]
    data = sse(*chunks, chunks[-1], delta(content="end"), STREAM[5])
    one = len(sse(chunks[0], done=False))
    for cuts in ([one, one * 9], None, [one, one * 9, one]):
        r = parse_stream(data, cuts)
        assert r.content == "".join(f"t{i}" for i in range(10)) + "t9end"
        assert r.duplicates == [("content", len("".join(f"t{i}" for i in range(10))), 2)]


def test_frames_are_used_for_plain_token_chunks():
    chunks = [delta(content=f"t{i}") for i in range(50)] + [STREAM[5], STREAM[6]]
    p = StreamParser()
    p.feed(sse(*chunks))
    assert p._learns == 1 and len(p._frames) == 1  # one frame served 49 chunks
    r = p.finish()
    assert r.content == "".join(f"t{i}" for i in range(50)) and r.finish_reason == "stop"
    # with true ids in every chunk (vLLM / the simulator) and reasoning then content
    chunks = ([{"choices": [{"index": 0, "delta": {"reasoning": f"r{i}"}, "token_ids": [i]}]}
               for i in range(20)]
              + [{"choices": [{"index": 0, "delta": {"content": f"c{i}"}, "token_ids": [100 + i]}]}
                 for i in range(20)] + [STREAM[5]])
    p = StreamParser()
    p.feed(sse(*chunks))
    assert p._learns == 2
    r = p.finish()
    assert r.reasoning == "".join(f"r{i}" for i in range(20))
    assert r.content == "".join(f"c{i}" for i in range(20))
    assert r.completion_token_ids == list(range(20)) + [100 + i for i in range(20)]


def test_frames_serve_openrouter_reasoning_chunks():
    """OpenRouter repeats each reasoning piece in `reasoning_details`: one frame still serves
    the whole reasoning (the copy is a slot the parser ignores), with or without true ids."""
    for ids in (False, True):
        chunks = []
        for i in range(30):
            piece = f'r{i} "q" \\ é'
            choice = {"index": 0, "delta": {"reasoning": piece, "reasoning_details": [
                {"type": "reasoning.text", "text": piece, "format": "unknown", "index": 0}]},
                "finish_reason": None}
            if ids:
                choice["token_ids"] = [i, i + 1]
            chunks.append({"id": "gen-1", "provider": "P", "choices": [choice]})
        p = StreamParser()
        p.feed(sse(*chunks, STREAM[5]))
        assert p._learns == 1
        r = p.finish()
        assert r.reasoning == "".join(f'r{i} "q" \\ é' for i in range(30))
        if ids:
            assert r.completion_token_ids == [x for i in range(30) for x in (i, i + 1)]


def test_a_frame_does_not_swallow_bad_ids_or_broken_strings():
    good = delta(content="a")
    bad_ids = {**good, "choices": [{**good["choices"][0], "token_ids": [-1]}]}
    with pytest.raises(ApiError) as e:
        parse_stream(sse(good, good, bad_ids, STREAM[5]))
    assert e.value.kind == "invalid_response"
    frame = orjson.dumps(good)
    broken = frame.replace(b'"content":"a"', b'"content":"a","reasoning":"b"')
    r = parse_stream(b"data: " + frame + b"\n\ndata: " + frame + b"\n\ndata: " + broken
                     + b"\n\n" + sse(STREAM[5]))
    assert r.content == "aaa" and r.reasoning == "b"


# -- HTTP/1.1 framing of the batched stream reader (h1.py) ---------------------------------------

def chunked(pieces: list[bytes], *, upper: bool = False, ext: bool = False,
            trailer: bool = False) -> bytes:
    out = b""
    for p in pieces:
        size = (b"%X" if upper else b"%x") % len(p)
        out += size + (b";name=v" if ext else b"") + b"\r\n" + p + b"\r\n"
    return out + b"0\r\n" + (b"X-Trailer: 1\r\n" if trailer else b"") + b"\r\n"


def dechunk_at(wire: bytes, cuts: list[int]) -> tuple[bytes, bool]:
    """(the body, whether its end was seen) from `wire` fed to a `Dechunker` cut at `cuts`."""
    from specgen.client.h1 import Dechunker

    d, got, pos = Dechunker(), [], 0
    for c in sorted(set(cuts)) + [len(wire)]:
        if c <= pos:
            continue
        got += d.feed(wire[pos:c])
        pos = c
        if d.done:
            break
    return b"".join(got), d.done


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), max_size=12), st.booleans(), st.booleans(),
       st.booleans(), st.lists(st.integers(min_value=1, max_value=500), max_size=10))
def test_dechunker_any_split_gives_the_body(pieces, upper, ext, trailer, cuts):

    wire = chunked(pieces, upper=upper, ext=ext, trailer=trailer) + b"HTTP/1.1 next"
    assert dechunk_at(wire, cuts) == (b"".join(pieces), True)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(min_size=1, max_size=40),
                          st.sampled_from([b"data: x\n\n", b"a\r\nb", b"\r\n", b"\r", b"\n",
                                           b"0\r\n", b"5\r\nhello", b"z" * 2100])),
                min_size=1, max_size=30),
       st.booleans(), st.booleans(), st.lists(st.integers(min_value=1, max_value=3000),
                                              max_size=6))
def test_dechunker_whole_chunks_match_the_loop(pieces, upper, zeros, cuts):
    """The one-pass read of whole chunks (sizes seen before, 4 KiB ones, upper case, leading
    zeros, data holding CRLFs or chunk-like bytes) gives what the chunk-by-chunk loop gives."""
    from specgen.client.h1 import Dechunker

    out = b""
    for p in pieces:
        size = (b"%X" if upper else b"%x") % len(p)
        out += (b"00" + size if zeros and len(p) % 3 == 0 else size) + b"\r\n" + p + b"\r\n"
    wire = out + b"0\r\n\r\nHTTP/1.1 next"

    Dechunker.BULK = False
    try:
        by_loop = dechunk_at(wire, cuts)
    finally:
        Dechunker.BULK = True
    assert dechunk_at(wire, cuts) == by_loop == (b"".join(pieces), True)


def test_dechunker_takes_whole_chunks_in_one_pass():
    from specgen.client.h1 import Dechunker

    pieces = [b"data: {\"t\":%d}\n\n" % i for i in range(12)]
    wire = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    out: list[bytes] = []
    assert Dechunker()._whole_chunks(wire + b"0\r\n\r\n", out) == len(wire)
    assert out == pieces
    out = []  # a CRLF inside a chunk's data: nothing is taken, the loop reads it
    assert Dechunker()._whole_chunks(b"4\r\na\r\nb\r\n" + wire, out) == 0 and out == []


@pytest.mark.parametrize("wire", [
    b"0x5\r\nhello\r\n", b"+5\r\nhello\r\n", b"5_0\r\n", b"zz\r\n", b"\r\n",
    b"5\r\nhelloXY", b"3\r\nabc\n\n", b"1" * 5000,
])
def test_dechunker_refuses_broken_framing(wire):
    from specgen.client.h1 import Dechunker, HttpProtocolError

    with pytest.raises(HttpProtocolError):
        Dechunker().feed(wire)


def test_response_heads():
    from specgen.client.h1 import HttpProtocolError, parse_head

    r = parse_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                   b"Transfer-Encoding: chunked\r\nX-Generation-Id: gen-9")
    assert (r.status, r.chunked, r.keep_alive, r.content_type) == (200, True, True,
                                                                   "text/event-stream")
    assert r.headers["x-generation-id"] == "gen-9"
    r = parse_head(b"HTTP/1.1 429 Too Many\r\nContent-Length: 12\r\nRetry-After: 3")
    assert (r.length, r.keep_alive, r.headers["Retry-After"]) == (12, True, "3")
    r = parse_head(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2")
    assert not r.keep_alive
    r = parse_head(b"HTTP/1.0 200 OK\r\nContent-Type: application/json")
    assert r.length is None and not r.keep_alive  # read to the end of the connection
    assert parse_head(b"HTTP/1.1 204 No Content").length == 0
    for bad in (b"HTTP/2 200", b"SSH-2.0", b"HTTP/1.1 200 OK\r\nno colon",
                b"HTTP/1.1 200 OK\r\n folded: x", b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n"
                b"Content-Length: 2", b"HTTP/1.1 200 OK\r\nContent-Length: -1"):
        with pytest.raises(HttpProtocolError):
            parse_head(bad)
