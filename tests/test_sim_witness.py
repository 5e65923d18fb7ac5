"""What the count witness sees, over real sockets: a simulated provider's `usage` against the
true ids (`return_token_ids`). Counting keys (`usage_completion_offset`, `usage_prompt_offset`,
`usage_noise`, `hidden_system_prompt_tokens`) change only the reported counts; quirks that
rewrite text (`pad_whitespace`, `reserialize_arguments`, `spaces_around_special`) never change
them: `completion_tokens` is always len(true ids)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from specgen.config import ConfigError
from specgen.render import get_renderer
from specgen.render.kimi import END_THINK
from specgen.sim import SimConfig, start_in_thread
from specgen.tokenizer import load_tokenizer
from test_sim_support import CHAT, MODEL, sse_events

USER = [{"role": "user", "content": "What is the weather like in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 2, "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    }, "required": ["city", "days"]}}}
PRICES = {"prompt_price_per_m": 1.0, "completion_price_per_m": 10.0}
NOISE = 0.5
HIDDEN = 20
WORLD = {"tools": -1, "reasoning": -1, "reasoning+tools": -2}  # plain: 0


def provider(tag: str, **keys: Any) -> dict[str, Any]:
    return {"name": tag.capitalize(), "tag": tag, **PRICES, **keys}


CONFIG = {
    "length": {"distribution": "uniform", "min": 30, "max": 80},
    "tool_calls": {"rate": 1.0, "compact_arguments_rate": 0.5, "content_rate": 0.5},
    "providers": [
        provider("clean"),
        provider("offset", usage_completion_offset=-1, usage_prompt_offset=3),
        provider("hidden", hidden_system_prompt_tokens=HIDDEN),
        provider("noisy", usage_noise=NOISE),
        provider("floor", usage_completion_offset=-100_000, usage_prompt_offset=-100_000),
        provider("padded", quirks={"pad_whitespace": 1.0}),
        provider("compact", quirks={"reserialize_arguments": 1.0}),
        provider("spaces", quirks={"spaces_around_special": 1.0, "think_in_content": 1.0,
                                   "tool_calls_as_text": 1.0}),
        provider("padcached", quirks={"pad_whitespace": 1.0}, hidden_system_prompt_tokens=5,
                 usage_completion_offset=-1, cache_hit_rate=1.0),
        provider("world", usage_completion_offsets=WORLD, history_rendering_tokens=-6,
                 omits_default_system=True),
        provider("relay", quirks={"relay_extra_token": 1.0}),
        provider("alternating", usage_alternating=True),
    ],
}


@pytest.fixture(scope="module")
def sim():
    with start_in_thread(SimConfig.from_dict(CONFIG)) as handle:
        yield handle


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("demo")


@pytest.fixture(scope="module")
def k25(tok):
    return {t: get_renderer("kimi-k2.5", tok, thinking=t) for t in (True, False)}


def ask(handle, tag: str, n: int, **body: Any) -> Any:
    """POST a chat request (n distinguishes bodies); the parsed body, or the SSE events."""
    data = json.dumps({"model": MODEL, "messages": USER + [{"role": "user", "content": f"#{n}"}],
                       "provider": {"only": [tag], "allow_fallbacks": False},
                       "return_token_ids": True, **body}).encode()
    req = urllib.request.Request(handle.root_url + CHAT, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        assert r.status == 200
        raw = r.read()
    if body.get("stream"):
        _, events, done = sse_events([x for x in raw.decode().split("\n") if x])
        assert done
        return events
    return json.loads(raw)


def counts(answer: Any) -> tuple[dict[str, Any], int, int, dict[str, Any]]:
    """(usage, len(true prompt ids), len(true completion ids), specgen_sim) of an answer."""
    if isinstance(answer, list):  # stream events
        n_prompt = len(answer[0]["prompt_token_ids"])
        n_ids = sum(len(e["choices"][0]["token_ids"]) for e in answer if e.get("choices"))
        return answer[-1]["usage"], n_prompt, n_ids, answer[-1]["specgen_sim"]
    return (answer["usage"], len(answer["prompt_token_ids"]),
            len(answer["choices"][0]["token_ids"]), answer["specgen_sim"])


def true_cost(n_prompt: int, n_ids: int) -> float:
    return n_prompt * 1e-6 + n_ids * 10e-6


# -- counting keys -----------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_a_clean_provider_reports_the_true_counts(sim, stream):
    for i in range(4):
        usage, n_prompt, n_ids, info = counts(ask(sim, "clean", i, stream=stream,
                                                  tools=[WEATHER]))
        assert usage["prompt_tokens"] == n_prompt and usage["completion_tokens"] == n_ids
        assert usage["total_tokens"] == n_prompt + n_ids
        assert abs(usage["cost"] - true_cost(n_prompt, n_ids)) < 1e-12
        assert info["quirks"] == []


@pytest.mark.parametrize("stream", [False, True])
def test_offsets_are_added_to_the_reported_counts_and_the_cost_stays_true(sim, stream):
    for i in range(4):
        usage, n_prompt, n_ids, _ = counts(ask(sim, "offset", i, stream=stream))
        assert usage["completion_tokens"] == n_ids - 1  # the stop token is not counted
        assert usage["prompt_tokens"] == n_prompt + 3
        assert usage["total_tokens"] == n_prompt + 3 + n_ids - 1
        assert abs(usage["cost"] - true_cost(n_prompt, n_ids)) < 1e-12


@pytest.mark.parametrize("stream", [False, True])
def test_a_hidden_system_prompt_grows_only_the_prompt_count(sim, stream):
    for i in range(4):
        usage, n_prompt, n_ids, _ = counts(ask(sim, "hidden", i, stream=stream))
        assert usage["prompt_tokens"] == n_prompt + HIDDEN
        assert usage["completion_tokens"] == n_ids
        assert usage["total_tokens"] == n_prompt + HIDDEN + n_ids
        assert abs(usage["cost"] - true_cost(n_prompt, n_ids)) < 1e-12


def test_noisy_counts_stay_within_bounds_and_vary(sim):
    ratios = []
    for i in range(40):
        usage, n_prompt, n_ids, _ = counts(ask(sim, "noisy", i, stream=i % 2 == 1))
        reported = usage["completion_tokens"]
        assert round(n_ids * (1 - NOISE)) <= reported <= round(n_ids * (1 + NOISE))
        assert usage["prompt_tokens"] == n_prompt  # only the completion count is noisy
        assert usage["total_tokens"] == n_prompt + reported
        assert abs(usage["cost"] - true_cost(n_prompt, n_ids)) < 1e-12
        ratios.append(reported / n_ids)
    assert len({round(r, 3) for r in ratios}) > 10  # really varying, per request
    assert min(ratios) < 0.85 and max(ratios) > 1.15  # over most of the range
    assert sum(r != 1 for r in ratios) >= 30


def test_reported_counts_never_go_below_zero(sim):
    for i, stream in enumerate((False, True)):
        usage, n_prompt, n_ids, _ = counts(ask(sim, "floor", i, stream=stream))
        assert n_prompt > 0 and n_ids > 0
        assert usage["prompt_tokens"] == usage["completion_tokens"] == usage["total_tokens"] == 0
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        assert abs(usage["cost"] - true_cost(n_prompt, n_ids)) < 1e-12


def test_stats_count_true_tokens_and_generation_the_reported_ones(sim):
    before = sim.stats()["providers"].get("Offset", {"prompt_tokens": 0, "completion_tokens": 0})
    body = ask(sim, "offset", 1000)
    usage, n_prompt, n_ids, _ = counts(body)
    after = sim.stats()["providers"]["Offset"]
    assert after["prompt_tokens"] - before["prompt_tokens"] == n_prompt
    assert after["completion_tokens"] - before["completion_tokens"] == n_ids
    with urllib.request.urlopen(f"{sim.url}/generation?id={body['id']}", timeout=10) as r:
        gen = json.loads(r.read())["data"]
    assert (gen["tokens_prompt"], gen["tokens_completion"]) == (n_prompt + 3, n_ids - 1)


def test_counting_and_cache_together(sim):
    for i in range(3):
        usage, n_prompt, n_ids, info = counts(ask(sim, "padcached", i, tools=[WEATHER],
                                                  tool_choice="required"))
        assert usage["prompt_tokens"] == n_prompt + 5 and usage["completion_tokens"] == n_ids - 1
        assert usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]
        assert info["quirks"] == ["pad_whitespace"]


@pytest.mark.parametrize("keys, where", [
    ({"usage_noise": 1.5}, "usage_noise"),
    ({"usage_noise": -0.1}, "usage_noise"),
    ({"hidden_system_prompt_tokens": -1}, "hidden_system_prompt_tokens"),
    ({"usage_completion_offset": 1.5}, "usage_completion_offset"),
    ({"usage_prompt_offset": "3"}, "usage_prompt_offset"),
    ({"hidden_system_prompt_tokens": True}, "hidden_system_prompt_tokens"),
])
def test_counting_keys_are_validated(keys, where):
    with pytest.raises(ConfigError, match=where):
        SimConfig.from_dict({"providers": [{"name": "A", **keys}]})


def test_counting_keys_default_to_exact_counts():
    p = SimConfig().providers[0]
    assert (p.usage_completion_offset, p.usage_prompt_offset, p.usage_noise,
            p.hidden_system_prompt_tokens) == (0, 0, 0.0, 0)
    assert p.counts_exactly
    assert SimConfig.from_dict({"providers": [{"name": "A", "usage_noise": 1}]}
                               ).providers[0].usage_noise == 1.0


# -- pad_whitespace ----------------------------------------------------------------------------
@pytest.mark.parametrize("thinking, tools, lead, trail", [
    (True, True, "\n\n", "\n"), (False, True, "", "\n"), (True, False, "\n\n", ""),
])
def test_pad_whitespace_is_visible_and_usage_is_the_true_count(sim, tok, k25, thinking,
                                                                 tools, lead, trail):
    extra: dict[str, Any] = {"reasoning": {"enabled": thinking}}
    if tools:
        extra.update(tools=[WEATHER], tool_choice="required")
    for i in range(5):
        body = ask(sim, "padded", i, **extra)
        usage, n_prompt, n_ids, info = counts(body)
        assert usage["completion_tokens"] == n_ids and usage["prompt_tokens"] == n_prompt
        choice = body["choices"][0]
        ids = choice["token_ids"]
        parsed = k25[thinking].parse_completion(ids)
        assert choice["message"]["content"] == lead + parsed.content + trail
        assert (tok.token_id(END_THINK) in ids) == thinking
        assert bool(choice["message"].get("tool_calls")) == tools
        assert info["quirks"] == ["pad_whitespace"]


def test_pad_whitespace_leaves_an_answer_without_reasoning_or_calls_alone(sim):
    body = ask(sim, "padded", 0, reasoning={"enabled": False})
    usage, _, n_ids, info = counts(body)
    assert not body["choices"][0]["message"]["content"].startswith("\n")
    assert info["quirks"] == [] and usage["completion_tokens"] == n_ids


def test_pad_whitespace_in_a_stream_is_in_the_first_and_last_content_delta(sim, k25):
    for i in range(5):
        events = ask(sim, "padded", i, stream=True, tools=[WEATHER], tool_choice="required")
        deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
        contents = [n for n, d in enumerate(deltas) if d.get("content")]
        assert deltas[contents[0]]["content"].startswith("\n\n")
        assert deltas[contents[-1]]["content"].endswith("\n")
        # after the reasoning, before the tool calls
        reasoning = [n for n, d in enumerate(deltas) if "reasoning" in d]
        calls = [n for n, d in enumerate(deltas) if "tool_calls" in d]
        assert reasoning and calls and reasoning[-1] < contents[0] <= contents[-1] < calls[0]
        ids = [t for e in events if e.get("choices") for t in e["choices"][0]["token_ids"]]
        parsed = k25[True].parse_completion(ids)
        assert "".join(deltas[n]["content"] for n in contents) == f"\n\n{parsed.content}\n"
        usage, _, n_ids, info = counts(events)
        assert usage["completion_tokens"] == n_ids == len(ids)
        assert info["quirks"] == ["pad_whitespace"]


# -- text-rewriting quirks: usage is the true count --------------------------------------------
def test_reserialize_arguments_at_rate_one_writes_the_other_style(sim, k25):
    k25 = k25[True]
    styles = set()
    for i in range(24):
        stream = i % 3 == 0
        answer = ask(sim, "compact", i, stream=stream, tools=[WEATHER], tool_choice="required")
        usage, n_prompt, n_ids, info = counts(answer)
        assert usage["completion_tokens"] == n_ids and usage["prompt_tokens"] == n_prompt
        assert info["quirks"] == ["reserialize_arguments"]
        if stream:
            ids = [t for e in answer if e.get("choices") for t in e["choices"][0]["token_ids"]]
            served: dict[int, str] = {}
            for e in answer:
                for c in (e["choices"][0]["delta"].get("tool_calls") or [] if e.get("choices")
                          else []):
                    served[c["index"]] = served.get(c["index"], "") + c["function"]["arguments"]
            served_args = [served[k] for k in sorted(served)]
        else:
            ids = answer["choices"][0]["token_ids"]
            served_args = [c["function"]["arguments"]
                           for c in answer["choices"][0]["message"]["tool_calls"]]
        sampled = k25.parse_completion(ids).tool_calls
        assert len(served_args) == len(sampled) >= 1
        for got, model_call in zip(served_args, sampled, strict=True):
            obj = json.loads(model_call.arguments)
            spaced = json.dumps(obj, ensure_ascii=False)
            compact = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
            assert spaced != compact
            assert model_call.arguments in (spaced, compact)
            other = compact if model_call.arguments == spaced else spaced
            assert got == other
            styles.add(model_call.arguments == spaced)
    assert styles == {True, False}  # both of the model's styles were turned around


@pytest.mark.parametrize("stream", [False, True])
def test_spaces_around_special_keeps_the_true_count(sim, stream):
    for i in range(3):
        answer = ask(sim, "spaces", i, stream=stream, tools=[WEATHER], tool_choice="required")
        usage, n_prompt, n_ids, info = counts(answer)
        assert "spaces_around_special" in info["quirks"]
        assert usage["completion_tokens"] == n_ids and usage["prompt_tokens"] == n_prompt



# -- world-like providers (docs/sim.md, "Usage counting") ----------------------------------------
def form_of(message: dict) -> str:
    reasoning = bool(message.get("reasoning") or message.get("reasoning_content"))
    calls = bool(message.get("tool_calls"))
    return ("reasoning+tools" if calls else "reasoning") if reasoning else (
        "tools" if calls else "plain")


def test_a_world_like_provider_counts_per_form_and_per_history(sim, k25):
    seen = set()
    history = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "functions.get_weather:0", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "sunny"}]
    for n in range(24):
        thinking = n % 2 == 0
        extra = history * (n % 3)
        body = {"reasoning": {"enabled": thinking}}
        if n % 4 < 2:
            body["tools"] = [WEATHER]
        data = json.dumps({"model": MODEL, "messages": USER + extra + [
            {"role": "user", "content": f"#{n}"}], "provider": {"only": ["world"],
                                                                "allow_fallbacks": False},
            "return_token_ids": True, **body}).encode()
        req = urllib.request.Request(sim.root_url + CHAT, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=20) as r:
            answer = json.loads(r.read())
        usage, n_prompt, n_ids, _ = counts(answer)
        form = form_of(answer["choices"][0]["message"])
        seen.add(form)
        assert usage["completion_tokens"] - n_ids == WORLD.get(form, 0), (form, usage)
        # the history moves the prompt delta; no default system prompt (none in the request)
        messages = USER + extra + [{"role": "user", "content": f"#{n}"}]
        renderer = k25[thinking]
        # (K2.5's template adds no default system prompt: 0 here; K2's adds one)
        default = max(0, n_prompt - len(renderer.prompt_ids(
            [{"role": "system", "content": ""}, *messages], body.get("tools"))))
        assert usage["prompt_tokens"] - n_prompt == -6 * len(extra) - default
    assert {"tools", "reasoning+tools"} <= seen


def test_a_relay_adds_a_token_to_the_text_and_passes_the_honest_count(sim, k25):
    answer = ask(sim, "relay", 1)
    usage, _, n_ids, meta = counts(answer)
    message = answer["choices"][0]["message"]
    assert message["content"].endswith(" Indeed") and usage["completion_tokens"] == n_ids
    assert "relay_extra_token" in meta["quirks"]


def test_alternating_counts_are_one_over_then_one_under(sim):
    errors = []
    for n in range(6):
        usage, _, n_ids, _ = counts(ask(sim, "alternating", 100 + n))
        errors.append(usage["completion_tokens"] - n_ids)
    assert set(errors) == {1, -1} and all(a != b for a, b in zip(errors, errors[1:], strict=False))
