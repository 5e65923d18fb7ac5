"""ChatClient against a real `specgen sim` process: answers, true ids, every fault class."""

from __future__ import annotations

import asyncio
import socket

import pytest

from specgen.client import ApiError, ChatClient
from test_sim_support import MODEL, SimProcess

KEY = "sk-sim-client-test-key-0001"

FAULT_KIND = {  # sim fault -> the class the client must report
    "rate_limit": "rate_limit",
    "timeout": "timeout",
    "server_error": "server",
    "bad_gateway": "server",
    "unavailable": "overloaded",
    "moderation": "moderation",
    "error_in_body": "error_in_body",
    "mid_stream_error": "stream_error",
    "connection_reset": "connection",
    "slow_first_byte": "timeout",
    "malformed_json": "invalid_response",
}


def tag(fault: str) -> str:
    return "f-" + fault.replace("_", "-")


def sim_config() -> str:
    parts = [f"""
seed = 1
keepalive_interval_s = 0.1
retry_after_s = 5
slow_first_byte_s = 20
api_keys = ["{KEY}"]

[length]
distribution = "uniform"
min = 20
max = 80

[[providers]]
name = "Clean"
tag = "clean"

[[providers]]
name = "Content"
tag = "rc"
reasoning_field = "reasoning_content"

[[providers]]
name = "Slow"
tag = "slow"
latency_s = 1.2
"""]
    for fault in FAULT_KIND:
        parts.append(f'[[providers]]\nname = "F {fault}"\ntag = "{tag(fault)}"\n'
                     f"faults = {{ {fault} = 1.0 }}\n")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    proc = SimProcess(tmp_path_factory.mktemp("client-sim"), sim_config())
    yield proc
    proc.stop()


def body(provider: str, stream: bool, n: int = 0) -> dict:
    return {"model": MODEL, "stream": stream, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Tell me about rivers, take {n}."}],
            "max_tokens": 400, "reasoning": {"enabled": True}, "return_token_ids": True,
            "usage": {"include": True},
            "provider": {"only": [provider], "allow_fallbacks": False}}


def client(sim: SimProcess, **kw) -> ChatClient:
    return ChatClient(sim.root + "/api/v1", api_key=KEY, **kw)


@pytest.mark.parametrize("stream", [True, False])
def test_answers_with_true_ids_usage_and_provider(sim, stream):
    async def go():
        async with client(sim) as c:
            return await asyncio.gather(*(c.chat(body("clean", stream, i)) for i in range(8)),
                                        c.chat(body("rc", stream, 99)))
    *answers, rc = asyncio.run(go())
    for r in answers + [rc]:
        assert r.stream is stream and r.http_status == 200
        assert r.finish_reason in ("stop", "length", "tool_calls")
        assert r.model.startswith(MODEL) and r.id
        assert r.prompt_token_ids and r.completion_token_ids
        assert len(r.completion_token_ids) == r.completion_tokens > 0
        assert r.prompt_tokens == len(r.prompt_token_ids)
        assert r.cost_usd and r.cost_usd > 0
        assert r.reasoning and r.started_at <= r.first_byte_at <= r.ended_at
    assert {r.provider for r in answers} == {"Clean"}
    assert all(r.reasoning_field == "reasoning" for r in answers)
    assert rc.provider == "Content" and rc.reasoning_field == "reasoning_content"


@pytest.mark.parametrize("fault", list(FAULT_KIND))
def test_every_sim_fault_is_classified(sim, fault):
    stream = fault == "mid_stream_error"  # the others answer non-stream requests too

    async def go():
        async with client(sim, first_byte_timeout=1.5, idle_timeout=5) as c:
            with pytest.raises(ApiError) as info:
                await c.chat(body(tag(fault), stream))
            return info.value
    err = asyncio.run(go())
    assert err.kind == FAULT_KIND[fault], (fault, err)
    if fault == "rate_limit":
        assert err.retry_after == 5.0
    if fault == "moderation":
        assert err.reasons
    if fault == "slow_first_byte":
        assert err.timeout_phase == "first_byte"
    if fault in ("error_in_body", "mid_stream_error", "bad_gateway"):
        assert err.retryable
    assert KEY not in str(err) and KEY not in repr(err.body)


@pytest.mark.parametrize("fault", ["malformed_json", "connection_reset", "rate_limit",
                                   "moderation"])
def test_the_same_faults_in_a_stream(sim, fault):
    async def go():
        async with client(sim) as c:
            with pytest.raises(ApiError) as info:
                await c.chat(body(tag(fault), True))
            return info.value
    assert asyncio.run(go()).kind == FAULT_KIND[fault]


def test_run_level_errors_and_keepalive(sim):
    async def go():
        out = {}
        async with ChatClient(sim.root + "/api/v1", api_key="sk-wrong") as c:
            with pytest.raises(ApiError) as info:
                await c.chat(body("clean", True))
            out["auth"] = info.value
        async with client(sim, idle_timeout=0.6) as c:
            with pytest.raises(ApiError) as info:
                await c.chat(body("nobody-serves-this", True))
            out["no_endpoints"] = info.value
            # 1.2 s before the first token, kept alive by `: OPENROUTER PROCESSING` comments
            out["slow"] = await c.chat(body("slow", True))
            out["endpoints"] = await c.get_json(f"models/{MODEL}/endpoints")
            out["key"] = await c.get_json("key")
        return out
    out = asyncio.run(go())
    assert out["auth"].kind == "auth" and out["auth"].fatal_for_run
    assert out["no_endpoints"].kind == "no_endpoints" and out["no_endpoints"].availability
    assert out["slow"].completion_token_ids
    tags = {e["tag"] for e in out["endpoints"]["data"]["endpoints"]}
    assert {"clean", "rc", "slow"} <= tags
    assert "data" in out["key"]


def test_a_dead_url_next_to_the_sim(sim):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}/api/v1"
    s.close()

    async def go():
        async with ChatClient([dead, sim.root + "/api/v1"], api_key=KEY, failure_threshold=2,
                              cooldown=60) as c:
            ok = errors = 0
            while ok < 10:
                try:
                    await c.chat(body("clean", True, ok))
                    ok += 1
                except ApiError as e:
                    assert e.kind == "unreachable"
                    errors += 1
            return errors, c.endpoint_stats()
    errors, stats = asyncio.run(go())
    assert errors == 2 and stats[0]["cooldowns"] == 1 and stats[1]["ok"] == 10
