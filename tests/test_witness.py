"""The count witness and the count-guided repairs on their own (real demo tokenizer and Kimi
renderer for the repairs)."""

from __future__ import annotations

import json

import pytest

from specgen.conversation import AssistantMessage, ToolCall
from specgen.quality.repairs import candidates, count_repair
from specgen.quality.shapes import ShapeBook, combine, shape_signature
from specgen.quality.witness import MAX_OFFSET, UNUSABLE_AFTER, WARMUP, CountWitness
from specgen.render import get_renderer
from specgen.tokenizer import load_tokenizer


def usage(p: int, c: int) -> dict:
    return {"prompt_tokens": p, "completion_tokens": c}


def test_exact_and_mismatch():
    w = CountWitness()
    for _ in range(WARMUP):  # the provider's counting offset of plain answers
        w.judge("A", prompt=100, completion=50, usage=usage(100, 50))
    assert w.judge("A", prompt=100, completion=50, usage=usage(100, 50)).check == "exact"
    v = w.judge("A", prompt=100, completion=50, usage=usage(100, 53))
    assert v.check == "mismatch" and "ours 50, provider 53" in v.detail
    # the prompt side of a single-turn request: a constant per request shape (its rendering
    # of the tools block), known once two answers show it (80% of the shape's answers)
    v = w.judge("A", prompt=100, completion=50, usage=usage(112, 50), shape="s", key=1,
                tools=True)
    assert (v.check, v.prompt_check, v.prompt_delta) == ("pending", "pending", 12)
    v = w.judge("A", prompt=90, completion=50, usage=usage(102, 50), shape="s", key=2,
                tools=True)
    assert (v.check, v.prompt_check) == ("exact", "rendering")
    assert [(r.key, r.prompt_check, r.count_check) for r in w.take_resolved()
            if isinstance(r.key, int)] == [(1, "rendering", "exact")]
    # more than the shape's rendering: recorded; less: the model saw less (a mismatch)
    v = w.judge("A", prompt=100, completion=50, usage=usage(114, 50), shape="s", key=3,
                tools=True)
    assert (v.check, v.prompt_check) == ("exact", "rendering")
    v = w.judge("A", prompt=100, completion=50, usage=usage(105, 50), shape="s", key=4,
                tools=True)
    assert (v.check, v.prompt_check) == ("mismatch", "shortfall")
    assert v.detail.startswith("prompt: ours 100, provider 105")
    # a history explains a delta; an absent system prompt explains the default one's
    v = w.judge("A", prompt=600, completion=50, usage=usage(26, 50), history=True,
                prompt_floor=lambda: 20)
    assert (v.check, v.prompt_check) == ("exact", "history")
    v = w.judge("A", prompt=100, completion=50, usage=usage(91, 50), system=False,
                prompt_floor=lambda: 80, default_system=lambda: 9)
    assert (v.check, v.prompt_check) == ("exact", "default_system")
    # less than any rendering of the messages holds: the model saw less (a mismatch)
    v = w.judge("A", prompt=600, completion=50, usage=usage(300, 50), history=True,
                prompt_floor=lambda: 500)
    assert (v.check, v.prompt_check) == ("mismatch", "shortfall")
    assert v.detail.startswith("prompt: ours 600, provider 300")
    # an implausible delta is a contradiction, never a rendering
    v = w.judge("A", prompt=100, completion=50, usage=usage(10**15, 50), tools=True)
    assert (v.check, v.prompt_check) == ("mismatch", "implausible")
    assert w.judge("A", prompt=1, completion=1, usage={}).check == "unverified"
    assert w.judge("A", prompt=1, completion=1, usage={"completion_tokens": True}).check \
        == "unverified"


def test_a_constant_offset_is_learned_but_a_large_one_is_content():
    w = CountWitness()
    checks = [w.judge("B", prompt=10, completion=40, usage=usage(10, 39), key=k).check
              for k in range(WARMUP + 5)]
    # until the offset is known the answers wait, then are judged at it: none is lost
    assert checks[:WARMUP - 1] == ["pending"] * (WARMUP - 1)
    assert checks[WARMUP - 1:] == ["exact"] * 6
    assert {r.key: r.count_check for r in w.take_resolved()} == {
        k: "exact" for k in range(WARMUP - 1)}
    plain = w.state("B")["completion"]["forms"]["plain"]
    assert (plain["state"], plain["offset"], plain["answers"]) == ("adopted", -1, WARMUP + 5)
    # a delta no counting offset explains is a mismatch at once, and no evidence
    v = w.judge("B", prompt=10, completion=40, usage=usage(10, 40 + MAX_OFFSET + 5))
    assert v.check == "mismatch" and v.completion_check == "mismatch"
    # a hidden system prompt: a constant per request shape on the prompt side, recorded
    checks = [w.judge("B", prompt=10, completion=40, usage=usage(10 + MAX_OFFSET + 10, 39),
                      shape="s", key=100 + k).check for k in range(3)]
    assert checks == ["pending", "exact", "exact"]
    assert [r.key for r in w.take_resolved()] == [100]
    assert w.to_json()["B"]["prompt_shapes"]["s"]["delta"] == MAX_OFFSET + 10


def test_counts_that_never_settle_are_unusable():
    w = CountWitness()
    seen = [w.judge("D", prompt=10, completion=100, usage=usage(10, 100 - 50 + (i * 7) % 60)
                    ).check for i in range(UNUSABLE_AFTER + 10)]
    assert w.unusable("D") and set(seen[UNUSABLE_AFTER + 1:]) == {"unverified"}
    assert w.to_json()["D"]["completion"]["state"] == "unusable"


@pytest.fixture(scope="module")
def renderer():
    return get_renderer("kimi-k2.5", load_tokenizer("demo"))


def test_compact_arguments_are_respaced_only_when_the_count_says_so(renderer):
    spaced = {"city": "Paris", "days": 3, "units": ["c", "f"]}
    model = AssistantMessage(content="", reasoning="Let me check.", tool_calls=(
        ToolCall("functions.get_weather:0", "get_weather", json.dumps(spaced)),))
    compact = AssistantMessage(content="", reasoning="Let me check.", tool_calls=(
        ToolCall("functions.get_weather:0", "get_weather",
                 json.dumps(spaced, separators=(",", ":"))),))
    truth = renderer.completion_ids(model)
    assert len(renderer.completion_ids(compact)) < len(truth)
    fixed = count_repair(compact, len(truth), renderer.completion_ids)
    assert fixed is not None
    message, ids, names = fixed
    assert names == ["arguments_spaced"] and ids == truth and message == model
    # a count that no known transformation explains: no guess
    assert count_repair(compact, len(truth) + 5, renderer.completion_ids) is None


def test_inserted_whitespace_is_removed_when_the_count_says_so(renderer):
    model = AssistantMessage(content="The answer is 4.", reasoning="2 + 2")
    padded = AssistantMessage(content="\n\nThe answer is 4.", reasoning="2 + 2")
    truth = renderer.completion_ids(model)
    message, ids, names = count_repair(padded, len(truth), renderer.completion_ids)
    assert names == ["content_whitespace"] and ids == truth and message == model
    # before a tool-call section too; whitespace the model wrote at the end of a plain
    # answer is not where providers insert it, so it stays
    call = (ToolCall("functions.f:0", "f", '{"a": 1, "b": 2}'),)
    model = AssistantMessage(content="Checking", reasoning="r", tool_calls=call)
    padded = AssistantMessage(content="\n\nChecking\n", reasoning="r", tool_calls=call)
    truth = renderer.completion_ids(model)
    message, ids, names = count_repair(padded, len(truth), renderer.completion_ids)
    assert ids == truth and message == model
    own = AssistantMessage(content="The answer is 4.\n", reasoning="2 + 2")
    assert all(c.content.endswith("\n") for _, c in candidates(own))


def test_the_witness_takes_a_repair_that_makes_the_counts_agree(renderer):
    w = CountWitness()
    model = AssistantMessage(content="ok", reasoning="r", tool_calls=(
        ToolCall("functions.f:0", "f", '{"a": 2, "b": 3}'),))
    served = AssistantMessage(content="ok", reasoning="r", tool_calls=(
        ToolCall("functions.f:0", "f", '{"a":2,"b":3}'),))
    ours = renderer.completion_ids(served)
    truth = renderer.completion_ids(model)
    for _ in range(WARMUP):
        w.judge("Groq", prompt=5, completion=9, usage=usage(5, 9))
    v = w.judge("Groq", prompt=5, completion=len(ours), usage=usage(5, len(truth)),
                repair=lambda n: count_repair(served, n, renderer.completion_ids))
    assert v.check == "repaired" and v.repairs == ["arguments_spaced"] and v.ids == truth
    # explained: not a counting offset
    assert w.state("Groq")["completion"]["forms"]["plain"]["offset"] == 0


def test_the_shape_signature_is_the_tools_block_system_prompt_and_thinking_mode():
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"a": 1, "b": 2}}}]
    same = [{"function": {"parameters": {"b": 2, "a": 1}, "name": "add"}, "type": "function"}]
    user = [{"role": "user", "content": "hi"}]
    system = [{"role": "system", "content": "be brief"}, *user]
    sig = shape_signature(tools, user, True)
    assert sig == shape_signature(same, [{"role": "user", "content": "other"}], True)
    assert len({sig, shape_signature(None, user, True), shape_signature(tools, system, True),
                shape_signature(tools, user, False), shape_signature(tools, user, None)}) == 5


@pytest.mark.parametrize("order", [[9, 9, 9, 9, 4], [9, 4, 9, 9, 9], [4, 9, 9, 9, 9]])
def test_no_prompt_class_depends_on_the_order_answers_arrive(order):
    book = ShapeBook()
    final = {}
    for key, delta in enumerate(order):
        final[key] = book.judge("P", "s", delta, prompt=100, tools=True, key=key)[0]
    final.update({r.key: r.prompt_check for r in book.take_resolved()})
    final.update({r.key: r.prompt_check for r in book.settle()})
    assert all(final[k] == ("shortfall" if d == 4 else "rendering") for k, d in enumerate(order))


def test_settling_gives_every_pending_sample_a_verdict():
    book = ShapeBook()
    assert book.judge("P", "once", 7, prompt=100, tools=True, key=1)[0] == "pending"
    assert book.judge("P", "split", 3, prompt=100, tools=True, key=2)[0] == "pending"
    assert book.judge("P", "split", 5, prompt=100, tools=True, key=3)[0] == "pending"
    # exact agreement with the official rendering is never pending, and never a mismatch
    assert book.judge("P", "split", 0, prompt=100, tools=True, key=4)[0] == "exact"
    # a history explains a delta: recorded at once, no evidence of the shape
    assert book.judge("P", "split", -50, prompt=100, tools=True, history=True)[0] == "history"
    got = {r.key: r.prompt_check for r in book.settle()}
    # no delta holds 80%: no rendering adopted, nothing proves a shortfall: recorded
    assert got == {1: "rendering", 2: "rendering", 3: "rendering"}
    assert book.settle() == []
    # a prompt shorter than ours with nothing to render compactly: a dropped message
    assert book.judge("P", "plain", -40, prompt=100, tools=False)[0] == "shortfall"
    assert book.judge("P", "tools", -40, prompt=100, tools=True)[0] == "pending"
    assert combine("repaired", "rendering") == "repaired"
    assert combine("exact", "history") == "exact"
    assert combine("exact", "shortfall") == "mismatch"
    assert combine("exact", "pending") == "pending"


def test_a_right_completion_is_kept_whatever_the_providers_rendering():
    w = CountWitness()
    for _ in range(WARMUP):
        w.judge("Together", prompt=10, completion=30, usage=usage(10, 30))
    for i in range(3):  # Together renders the two-tool declaration 9 tokens longer
        v = w.judge("Together", prompt=209, completion=30, usage=usage(218, 30),
                    shape="two-tools", tools=True, key=i)
        assert v.completion_check == "exact" and v.prompt_delta == 9
    assert v.check == "exact" and v.prompt_check == "rendering"
    assert [r.prompt_check for r in w.take_resolved() if isinstance(r.key, int)] == [
        "rendering"]
    # a wrong completion is a mismatch whatever the prompt side: that side is recorded
    v = w.judge("Together", prompt=209, completion=30, usage=usage(218, 45),
                shape="two-tools", tools=True, key=9)
    assert (v.check, v.completion_check, v.prompt_check) == ("mismatch", "mismatch",
                                                              "rendering")


def test_a_resumed_run_judges_the_samples_an_earlier_session_left_pending():
    book = ShapeBook()  # rows in task order, as the store gives them on resume
    book.seed("P", "s", 9, tools=True, key=1, pending=True)
    assert book.take_resolved() == []
    book.seed("P", "s", 9, tools=True, key=2)  # judged its rendering then
    book.seed("P", "s", 9, tools=True, key=3)
    book.seed("P", "s", 9, tools=True, key=4)
    book.seed("P", "s", 4, tools=True, key=5, pending=True)
    got = {r.key: r.prompt_check for r in book.take_resolved()}
    assert got == {1: "rendering", 5: "shortfall"}
    assert book.settle() == []


def _answers(renderer):
    """Realistic answers of two providers: plain ones, compact arguments counted in the
    model's spaced form, inserted whitespace of a token or two (a small repair, which only
    the provider's known offset can tell from its counting); "F" counts one token more."""
    spaced = AssistantMessage(content="", reasoning="r", tool_calls=(
        ToolCall("functions.add:0", "add", '{"a": 2, "b": 3}'),))
    compact = AssistantMessage(content="", reasoning="r", tool_calls=(
        ToolCall("functions.add:0", "add", '{"a":2,"b":3}'),))
    model = AssistantMessage(content="The answer is 5.", reasoning="2 + 3")
    padded = AssistantMessage(content="\n\nThe answer is 5.", reasoning="2 + 3")
    plain = AssistantMessage(content="It is 5.", reasoning="sum")
    render = renderer.completion_ids
    out = []
    for provider, offset in (("F", 1), ("Z", 0)):
        for _ in range(3):
            out.append((provider, compact, len(render(spaced)) + offset))
            out.append((provider, padded, len(render(model)) + offset))
        for _ in range(WARMUP):
            out.append((provider, None, len(render(plain)) + offset))
    assert 0 < len(render(padded)) - len(render(model)) <= MAX_OFFSET  # a small repair
    return out, render, plain


def _final_verdicts(answers, render, plain, order):
    w = CountWitness()
    final = {}
    for key in order:
        provider, message, theirs = answers[key]
        ours = len(render(message if message is not None else plain))
        repair = None if message is None else (
            lambda n, m=message: count_repair(m, n, render))
        v = w.judge(provider, prompt=100, completion=ours, usage=usage(100, theirs),
                    repair=repair, key=key)
        final[key] = (v.check, v.completion_check, v.ids)
        for r in w.take_resolved():
            c = r.completion
            final[r.key] = (r.count_check, r.completion_check, c.ids if c else None)
    for r in w.settle():
        c = r.completion
        final[r.key] = (r.count_check, r.completion_check, c.ids if c else None)
    return final


def test_completion_verdicts_do_not_depend_on_the_order_answers_arrive(renderer):
    import random

    answers, render, plain = _answers(renderer)
    forward = list(range(len(answers)))
    shuffled = forward[:]
    random.Random(21).shuffle(shuffled)
    got = [_final_verdicts(answers, render, plain, order)
           for order in (forward, forward[::-1], shuffled)]
    assert got[0] == got[1] == got[2]
    # and every right completion is kept, the small whitespace repair included
    assert {k: v[0] for k, v in got[0].items()} == {
        k: "exact" if m is None else "repaired" for k, (_, m, _) in enumerate(answers)}
    assert all(v[1] != "pending" for v in got[0].values())
