"""End to end against `specgen sim`: planner -> request builder -> client -> simulator ->
normaliser -> renderer, checked against the true ids the simulator reports.

* on-policy multi-turn and tool-loop planning: the prompt ids the simulator computed from our
  request body equal `renderer.prompt_ids` of the planned messages, and each answer's
  completion ids equal the true sampled ids;
* every quirk of the simulator's providers is repaired (ids equal the truth) or quarantined
  with its reason, except re-serialised arguments, which cannot be undone (flagged instead).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from specgen.client.chat import ChatClient
from specgen.config import DatasetConfig, parse_config
from specgen.conversation import AssistantMessage, Conversation
from specgen.normalize import Normalized, Quarantined, normalize
from specgen.planner import (
    TOOL_COUNT_MISMATCH,
    TOOL_NAME_MISMATCH,
    End,
    TurnRequest,
    next_request,
)
from specgen.render import get_renderer
from specgen.request import build_request
from specgen.sim import start_in_thread
from specgen.sim.config import LengthConfig, ProviderConfig, QuirkRates, SimConfig, ToolCallConfig
from specgen.sources import iter_rows

FIX = Path(__file__).parent / "fixtures" / "datasets"

QUIRKY = {
    "clean": {},
    "think-in-content": {"think_in_content": 1.0},
    "im-end": {"im_end_in_content": 1.0},
    "as-text": {"tool_calls_as_text": 1.0},
    "spaced": {"spaces_around_special": 1.0, "im_end_in_content": 1.0,
               "think_in_content": 1.0, "tool_calls_as_text": 1.0},
    "spaced-calls": {"spaces_around_special": 1.0, "tool_calls_as_text": 1.0},
    "renumber": {"renumber_tool_call_ids": 1.0},
    "openai-ids": {"openai_tool_call_ids": 1.0},
    "reserialize": {"reserialize_arguments": 1.0},
    "drop-end-think": {"drop_end_think": 1.0},
    "empty": {"empty_content": 1.0},
    "raw-calls": {"tool_calls_in_content": 1.0},
}


@pytest.fixture(scope="module")
def sim():
    providers = [ProviderConfig(name=tag, tag=tag, quirks=QuirkRates(**q), reasoning_field=(
        "reasoning_content" if tag == "renumber" else "reasoning")) for tag, q in QUIRKY.items()]
    cfg = SimConfig(providers=providers,
                    length=LengthConfig(distribution="uniform", min=6, max=60),
                    tool_calls=ToolCallConfig(rate=0.8, max_parallel=2, content_rate=0.5))
    handle = start_in_thread(cfg, seed=3, tokenizer="demo", renderer="kimi-k2.5")
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def renderer(demo_tokenizer):
    return get_renderer("kimi-k2.5", demo_tokenizer, thinking=True)


def run_config(tmp_path, provider_tag: str, *, stream: bool = False):
    raw = {
        "run_dir": "run",
        "target": {"model": "moonshotai/kimi-k2.5", "tokenizer": "demo"},
        "endpoint": {"base_url": "sim", "stream": stream, "return_token_ids": True,
                     "provider": {"only": [provider_tag], "allow_fallbacks": False}},
        "sampling": {"max_tokens": 4000, "temperature": 1.0},
        "dataset": [{"name": "d", "path": str(FIX / "glaive.jsonl")}],
    }
    return parse_config(raw, tmp_path / "run.toml")


def ask(sim, cfg, reqs: list[TurnRequest]):
    """Send the bodies built for `reqs`; the ChatResponses in order."""
    async def go():
        async with ChatClient(sim.url, stream=cfg.endpoint.stream) as client:
            return await asyncio.gather(*(client.chat(build_request(cfg, cfg.datasets[0], r))
                                          for r in reqs))
    return asyncio.run(go())


def glaive_convs():
    return [r.conversation for r in iter_rows(DatasetConfig(name="g", path=FIX / "glaive.jsonl"))
            if r.conversation is not None]


def tool_requests(n: int) -> list[TurnRequest]:
    """Requests with tools; half of them after a history with two tool calls (k starts at 2)."""
    out = []
    for i in range(n):
        conv = glaive_convs()[[0, 2, 5][i % 3]]
        if i % 2:
            # history up to the results of the row's first call message
            j = next(k for k, m in enumerate(conv.messages) if m.get("tool_calls"))
            end = j + 1
            while end < len(conv.messages) and conv.messages[end]["role"] == "tool":
                end += 1
            msgs = [*conv.messages[:end], {"role": "user", "content": f"and now {i}?"}]
        else:
            msgs = [*conv.messages[:2], {"role": "user", "content": f"variant {i}"}]
        out.append(TurnRequest(turn=len(msgs), messages=msgs, tools=conv.tools))
    return out


def plain_requests(n: int) -> list[TurnRequest]:
    return [TurnRequest(turn=1, messages=[{"role": "user", "content": f"question {i}"}], tools=None)
            for i in range(n)]


def outcome(resp, req, renderer):
    try:
        norm = normalize(resp, tools=req.tools, renderer=renderer, messages=req.messages)
    except Quarantined as q:
        return q
    return norm


def ids_equal(renderer, norm: Normalized, resp) -> bool:
    return renderer.completion_ids(norm.message) == resp.completion_token_ids


# -- quirks ----------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tag", ["clean", "think-in-content", "im-end", "as-text", "spaced",
                                 "spaced-calls", "renumber", "openai-ids"])
def test_repairable_quirks_give_the_true_ids(sim, renderer, tmp_path, tag, stream):
    cfg = run_config(tmp_path, tag, stream=stream)
    reqs = tool_requests(12) + plain_requests(4)
    resps = ask(sim, cfg, reqs)
    repaired: set[str] = set()
    calls = 0
    for req, resp in zip(reqs, resps, strict=True):
        assert resp.provider == tag
        norm = outcome(resp, req, renderer)
        assert isinstance(norm, Normalized), f"{tag}: {norm}"
        assert ids_equal(renderer, norm, resp), (tag, resp, norm)
        # the prompt the simulator tokenised from our body is the one we render
        assert renderer.prompt_ids(req.messages, req.tools) == resp.prompt_token_ids
        repaired.update(x for x in norm.repairs if not x.startswith("flag:"))
        calls += len(norm.message.tool_calls)
    assert calls > 0
    expected = {
        "clean": set(), "think-in-content": {"think_in_content"},
        "im-end": {"trailing_stop_token"}, "as-text": {"tool_calls_from_content"},
        "spaced": {"special_token_spaces", "think_in_content", "trailing_stop_token",
                   "tool_calls_from_content"},
        "spaced-calls": {"special_token_spaces", "tool_calls_from_content"},
        "renumber": {"tool_call_id_renumbered"}, "openai-ids": {"tool_call_id_restored"},
    }[tag]
    assert repaired == expected


def test_reserialized_arguments_are_flagged_not_undone(sim, renderer, tmp_path):
    cfg = run_config(tmp_path, "reserialize")
    reqs = tool_requests(16)
    styles_changed = 0
    for req, resp in zip(reqs, ask(sim, cfg, reqs), strict=True):
        norm = outcome(resp, req, renderer)
        assert isinstance(norm, Normalized)
        truth = renderer.parse_completion(resp.completion_token_ids)
        if not truth.tool_calls:
            assert ids_equal(renderer, norm, resp)
            continue
        assert any(x.startswith("flag:arguments_") for x in norm.repairs)
        # the same call, in the other JSON style: the ids cannot match
        assert [c.name for c in norm.message.tool_calls] == [c.name for c in truth.tool_calls]
        if [c.arguments for c in norm.message.tool_calls] != [c.arguments for c in truth.tool_calls]:
            styles_changed += 1
            assert not ids_equal(renderer, norm, resp)
    assert styles_changed > 0


def test_dropped_end_think_is_quarantined_or_exact(sim, renderer, tmp_path):
    cfg = run_config(tmp_path, "drop-end-think")
    reqs = tool_requests(10) + plain_requests(8)
    reasons = set()
    for req, resp in zip(reqs, ask(sim, cfg, reqs), strict=True):
        got = outcome(resp, req, renderer)
        if isinstance(got, Quarantined):
            reasons.add(got.reason)
        else:
            # kept only where nothing was lost: tool calls with no content after </think>
            assert got.message.tool_calls and got.message.content == ""
            assert ids_equal(renderer, got, resp)
    assert reasons == {"unbalanced_reasoning"}


def test_empty_content_is_quarantined(sim, renderer, tmp_path):
    cfg = run_config(tmp_path, "empty")
    reqs = tool_requests(6) + plain_requests(6)
    for req, resp in zip(reqs, ask(sim, cfg, reqs), strict=True):
        got = outcome(resp, req, renderer)
        assert isinstance(got, Quarantined) and got.reason == "empty", got


def test_raw_tool_calls_without_tools_are_an_unknown_tool(sim, renderer, tmp_path):
    cfg = run_config(tmp_path, "raw-calls")
    convs = glaive_convs()
    # a conversation without declared tools (history holds a call): the model calls anyway
    msgs = [m for m in convs[0].messages[:4]] + [{"role": "user", "content": "again?"}]
    reqs = [TurnRequest(turn=5, messages=msgs, tools=None) for _ in range(3)]
    for req, resp in zip(reqs, ask(sim, cfg, reqs), strict=True):
        got = outcome(resp, req, renderer)
        assert isinstance(got, Quarantined) and got.reason == "unknown_tool", got


# -- planning end to end ---------------------------------------------------------------------

def drive(sim, renderer, cfg, conv: Conversation, turns: str):
    """Run one conversation to its end; (requests, answers, end) with every id checked."""
    answers: dict[int, AssistantMessage] = {}
    sent = []
    while True:
        step = next_request(conv, answers, turns)
        if isinstance(step, End):
            return sent, answers, step
        (resp,) = ask(sim, cfg, [step])
        assert resp.prompt_token_ids == renderer.prompt_ids(step.messages, step.tools)
        norm = normalize(resp, tools=step.tools, renderer=renderer, messages=step.messages)
        assert renderer.completion_ids(norm.message) == resp.completion_token_ids
        sent.append(step)
        answers[step.turn] = norm.message


def test_on_policy_multi_turn_against_the_sim(sim, renderer, tmp_path):
    cfg = run_config(tmp_path, "clean", stream=True)
    conv = next(r.conversation for r in iter_rows(DatasetConfig(name="u", path=FIX / "ultrachat.parquet")))
    sent, answers, end = drive(sim, renderer, cfg, conv, "all")
    assert end == End(None) and [s.turn for s in sent] == [1, 3]
    # the second request carries the model's own first answer, reasoning included
    hist = sent[1].messages[1]
    assert hist["content"] == answers[1].content
    assert hist["reasoning_content"] == answers[1].reasoning and answers[1].reasoning


def test_tool_loop_against_the_sim(sim, renderer, tmp_path):
    """A dataset whose recorded call is the one the model makes: the loop continues with the
    recorded result under the model's id; a call of another function ends it."""
    cfg = run_config(tmp_path, "as-text")
    base = glaive_convs()[0]  # system, user, call, result, answer
    for attempt in range(12):
        prompt = [*base.messages[:1], {"role": "user", "content": f"weather please ({attempt})"}]
        first = TurnRequest(turn=2, messages=prompt, tools=base.tools)
        (resp,) = ask(sim, cfg, [first])
        made = normalize(resp, tools=base.tools, renderer=renderer, messages=prompt).message
        if made.tool_calls:
            break
    else:
        pytest.fail("the simulated model never called a tool")
    # the dataset recorded the same calls (arguments in another JSON style) and their results
    recorded = [{"id": f"call_{k}", "type": "function", "function": {
        "name": c.name, "arguments": c.arguments.replace('": ', '":').replace(", ", ",")}}
        for k, c in enumerate(made.tool_calls)]
    messages = [*prompt, {"role": "assistant", "content": "", "tool_calls": recorded},
                *({"role": "tool", "tool_call_id": f"call_{k}", "content": f"result {k}"}
                  for k in range(len(recorded))),
                {"role": "assistant", "content": "All done."}]
    conv = Conversation(id="loop", messages=messages, tools=base.tools)
    answers = {2: made}
    step = next_request(conv, answers, "last")
    assert step.turn == 3 + len(recorded)
    assert [m["tool_call_id"] for m in step.messages[3:]] == [c.id for c in made.tool_calls]
    (resp,) = ask(sim, cfg, [step])
    assert resp.prompt_token_ids == renderer.prompt_ids(step.messages, step.tools)
    answers[step.turn] = normalize(resp, tools=step.tools, renderer=renderer,
                                   messages=step.messages).message
    end = next_request(conv, answers, "last")
    assert isinstance(end, End)
    assert end.reason in (None, TOOL_COUNT_MISMATCH)  # the model may call again at the end
    # a dataset that recorded another call: mismatch, the first answer is kept
    other = [{**recorded[0], "function": {"name": "get_time", "arguments": '{"city": "Nowhere"}'}}]
    conv2 = Conversation(id="mm", tools=base.tools, messages=[
        *prompt, {"role": "assistant", "content": "", "tool_calls": other},
        {"role": "tool", "tool_call_id": "call_0", "content": "x"},
        {"role": "assistant", "content": "y"}])
    if [c.name for c in made.tool_calls] != ["get_time"]:
        want = TOOL_NAME_MISMATCH if len(made.tool_calls) == 1 else TOOL_COUNT_MISMATCH
        assert next_request(conv2, {2: made}, "last") == End(want)


def test_quirks_with_the_real_kimi_vocabulary(tmp_path):
    from conftest import model_path
    from specgen.tokenizer import load_tokenizer

    tok = load_tokenizer(model_path("kimi-k2.5"))
    renderer = get_renderer("kimi-k2.5", tok, thinking=True)
    providers = [ProviderConfig(name=t, tag=t, quirks=QuirkRates(**QUIRKY[t]))
                 for t in ("spaced", "openai-ids", "think-in-content")]
    cfg_sim = SimConfig(providers=providers, length=LengthConfig(distribution="uniform", min=6, max=60),
                        tool_calls=ToolCallConfig(rate=0.8, max_parallel=2, content_rate=0.5))
    with start_in_thread(cfg_sim, seed=5, tokenizer=tok, renderer="kimi-k2.5") as handle:
        for tag in ("spaced", "openai-ids", "think-in-content"):
            cfg = run_config(tmp_path, tag, stream=tag == "spaced")
            reqs = tool_requests(8) + plain_requests(2)
            for req, resp in zip(reqs, ask(handle, cfg, reqs), strict=True):
                norm = outcome(resp, req, renderer)
                assert isinstance(norm, Normalized), (tag, norm)
                assert ids_equal(renderer, norm, resp), (tag, resp)
                assert renderer.prompt_ids(req.messages, req.tools) == resp.prompt_token_ids


@pytest.mark.parametrize("name, thinking", [("kimi-k2-thinking", True), ("kimi-k2.5", False),
                                            ("kimi-k2-instruct", False)])
def test_other_kimi_variants_and_thinking_off(tmp_path, demo_tokenizer, name, thinking):
    renderer = get_renderer(name, demo_tokenizer, thinking=thinking)
    tags = ("clean", "spaced", "think-in-content", "openai-ids", "im-end")
    cfg_sim = SimConfig(providers=[ProviderConfig(name=t, tag=t, quirks=QuirkRates(**QUIRKY[t]))
                                   for t in tags],
                        length=LengthConfig(distribution="uniform", min=6, max=60),
                        tool_calls=ToolCallConfig(rate=0.8, max_parallel=2, content_rate=0.5))
    with start_in_thread(cfg_sim, seed=5, tokenizer=demo_tokenizer, renderer=name) as handle:
        for tag in tags:
            cfg = run_config(tmp_path, tag)
            cfg.sampling.reasoning = thinking
            reqs = tool_requests(6) + plain_requests(3)
            for req, resp in zip(reqs, ask(handle, cfg, reqs), strict=True):
                norm = outcome(resp, req, renderer)
                assert isinstance(norm, Normalized), (name, tag, norm)
                assert ids_equal(renderer, norm, resp), (name, tag, resp)
                assert renderer.prompt_ids(req.messages, req.tools) == resp.prompt_token_ids
                assert (norm.message.reasoning is not None) == thinking
