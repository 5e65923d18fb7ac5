"""The completion side per answer form (quality.forms): offsets learnt from every answer of a
form, the argument repairs solved jointly with the offset, the evidence rule (80%, at the end
too), split forms unverified — with the real Kimi K2.5 renderer on the demo tokenizer."""

from __future__ import annotations

import pytest

from specgen.conversation import AssistantMessage, ToolCall
from specgen.quality.forms import SPLIT_AFTER, answer_form
from specgen.quality.repairs import count_repair
from specgen.quality.witness import WARMUP, CountWitness
from specgen.render import get_renderer
from specgen.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def renderer():
    return get_renderer("kimi-k2.5", load_tokenizer("demo"))


def usage(p: int, c: int) -> dict:
    return {"prompt_tokens": p, "completion_tokens": c}


def call(args: str, i: int = 0) -> tuple[ToolCall, ...]:
    return (ToolCall(f"functions.add:{i}", "add", args),)


def test_the_form_of_an_answer():
    assert answer_form(AssistantMessage(content="hi")) == "plain"
    assert answer_form(AssistantMessage(content="hi", reasoning="")) == "plain"
    assert answer_form(AssistantMessage(content="", reasoning="r")) == "reasoning"
    assert answer_form(AssistantMessage(content="", tool_calls=call("{}"))) == "tools"
    assert answer_form(AssistantMessage(reasoning="r", tool_calls=call("{}"))) \
        == "reasoning+tools"


def judge_all(w, answers, render):
    """answers: (provider, form, message the provider sent, its completion count);
    the final verdict of each (key: its index)."""
    final = {}
    for key, (provider, form, sent, theirs) in enumerate(answers):
        ours = len(render(sent))
        v = w.judge(provider, prompt=100, completion=ours, usage=usage(100, theirs),
                    repair=lambda n, m=sent: count_repair(m, n, render), key=key, form=form)
        final[key] = (v.check, v.ids)
        for r in w.take_resolved():
            final[r.key] = (r.count_check, r.completion.ids if r.completion else None)
    for r in w.settle():
        final[r.key] = (r.count_check, r.completion.ids if r.completion else None)
    return final


def test_each_form_learns_its_offset_with_the_argument_repairs_solved_jointly(renderer):
    # plain 0, tools -1, reasoning -1, both -2; half of the tool calls served compact while
    # the count is of the model's spaced form: the repair and the offset at once
    render = renderer.completion_ids
    spaced, compact = '{"a": 2, "b": 3}', '{"a":2,"b":3}'
    kinds = {"plain": (AssistantMessage(content="It is 5."), 0),
             "tools": (AssistantMessage(content="", tool_calls=call(spaced)), -1),
             "reasoning": (AssistantMessage(content="5", reasoning="2 + 3"), -1),
             "reasoning+tools": (AssistantMessage(reasoning="add", tool_calls=call(spaced)),
                                 -2)}
    answers, truth = [], []
    for i in range(12):
        for form in ("tools", "reasoning+tools") if i < 6 else kinds:
            model, offset = kinds[form]
            sent = model
            if model.tool_calls and i % 2:
                sent = AssistantMessage(content=model.content, reasoning=model.reasoning,
                                        tool_calls=call(compact))
            answers.append(("P", form, sent, len(render(model)) + offset))
            truth.append(render(model))
    w = CountWitness()
    final = judge_all(w, answers, render)
    assert all(final[k][0] in ("exact", "repaired") for k in range(len(answers))), final
    for k, (_, _, sent, _) in enumerate(answers):
        got = final[k][1] if final[k][0] == "repaired" else render(sent)
        assert got == truth[k]  # the model's own ids, repaired where served compact
    forms = w.state("P")["completion"]["forms"]
    assert {f: s["offset"] for f, s in forms.items()} == {
        f: o for f, (_, o) in kinds.items()}
    # a run of tool calls only learns its offset within its first answers
    w = CountWitness()
    model, _ = kinds["tools"]
    checks = [w.judge("Q", prompt=10, completion=len(render(model)),
                      usage=usage(10, len(render(model)) - 1), form="tools", key=k).check
              for k in range(WARMUP + 2)]
    assert checks == ["pending"] * (WARMUP - 1) + ["exact"] * 3
    assert {r.count_check for r in w.take_resolved()} == {"exact"}


def test_a_corrupted_majority_is_never_learnt(renderer):
    # a relay adds a token to 60% of the answers' text and passes the honest count: the
    # form splits, nothing it judged is left exact, at the end too (no "most common" vote)
    for order_seed in range(5):
        w = CountWitness()
        final = {}
        pattern = [k % 5 < 3 for k in range(40)]
        import random
        random.Random(order_seed).shuffle(pattern)
        for k, corrupted in enumerate(pattern):
            v = w.judge("Relay", prompt=10, completion=31 if corrupted else 30,
                        usage=usage(10, 30), key=k)
            final[k] = v.check
            final.update({r.key: r.count_check for r in w.take_resolved()})
        final.update({r.key: r.count_check for r in w.settle()})
        assert set(final.values()) == {"unverified"}, (order_seed, final)
        assert w.split_forms("Relay") == ["plain"]
        assert w.to_json()["Relay"]["unverified_forms"] == ["plain"]


def test_an_adopted_offset_that_loses_its_evidence_is_revoked():
    w = CountWitness()
    got = {}
    for k in range(WARMUP):  # 5 corrupted answers first: -1 adopted
        got[k] = w.judge("R", prompt=10, completion=31, usage=usage(10, 30), key=k).check
    got.update({r.key: r.count_check for r in w.take_resolved()})
    assert set(got.values()) == {"exact"}
    for k in range(WARMUP, SPLIT_AFTER):  # then honest ones: they wait, then it splits
        got[k] = w.judge("R", prompt=10, completion=30, usage=usage(10, 30), key=k).check
        got.update({r.key: r.count_check for r in w.take_resolved()})
    assert set(got.values()) == {"unverified"}, got
    assert w.settle() == []


def test_alternating_counts_vouch_for_nothing():
    w = CountWitness()
    final = {}
    for k in range(30):
        v = w.judge("Alt", prompt=10, completion=30, usage=usage(10, 30 + (1 if k % 2 else -1)),
                    key=k)
        final[k] = v.check
        final.update({r.key: r.count_check for r in w.take_resolved()})
    final.update({r.key: r.count_check for r in w.settle()})
    assert "exact" not in final.values() and set(final.values()) == {"unverified"}


def test_the_evidence_rule_holds_at_the_session_end():
    # three answers of a form, 2 at -1 and 1 at 0: no offset holds 80%: unverified, not
    # "the most common delta"
    w = CountWitness()
    for k, theirs in enumerate((29, 29, 30)):
        assert w.judge("S", prompt=10, completion=30, usage=usage(10, theirs), key=k,
                       form="tools").check == "pending"
    assert {r.key: r.count_check for r in w.settle()} == {k: "unverified" for k in range(3)}
    # four of four agree: adopted at the end with fewer answers than the warm-up
    w = CountWitness()
    for k in range(4):
        w.judge("S", prompt=10, completion=30, usage=usage(10, 29), key=k, form="tools")
    assert {r.count_check for r in w.settle()} == {"exact"}
    # an answer the adopted offset does not explain while another does waits for the end,
    # then is a mismatch if the offset still holds
    w = CountWitness()
    for k in range(10):
        w.judge("S", prompt=10, completion=30, usage=usage(10, 29), key=k, form="tools")
    assert {r.count_check for r in w.take_resolved()} == {"exact"}
    assert w.judge("S", prompt=10, completion=30, usage=usage(10, 30), key=99,
                   form="tools").check == "pending"
    assert {r.key: r.count_check for r in w.settle()} == {99: "mismatch"}


def test_a_probed_offset_per_form_judges_the_first_answer():
    w = CountWitness()
    w.learn_offset("P", -2, "reasoning+tools")
    w.learn_offset("P", 0, "plain")
    assert w.judge("P", prompt=5, completion=40, usage=usage(5, 38), key=1,
                   form="reasoning+tools").check == "exact"
    # another offset explains it: it waits for the evidence's end, a mismatch if 0 holds
    assert w.judge("P", prompt=5, completion=40, usage=usage(5, 38), key=2,
                   form="plain").check == "pending"
    assert {r.key: r.count_check for r in w.settle()} == {2: "mismatch"}


def test_an_unvouched_sample_whose_prompt_waits_stays_unvouched():
    # its form split (alternating counts) while its single-turn prompt side waits for the
    # shape's rendering: when that is known, the sample is unverified and still unvouched
    # (it feeds the unverifiable alarm)
    w = CountWitness()
    for k in range(SPLIT_AFTER):
        w.judge("Alt", prompt=10, completion=30, key=k, usage=usage(10, 30 + (1 if k % 2 else -1)))
    assert w.split_forms("Alt") == ["plain"]
    v = w.judge("Alt", prompt=10, completion=30, usage=usage(19, 31), shape="s", key=50,
                tools=True)
    assert (v.check, v.completion_check, v.prompt_check) == ("pending", "unverified",
                                                              "pending")
    w.judge("Alt", prompt=10, completion=30, usage=usage(19, 31), shape="s", key=51,
            tools=True)
    got = {r.key: r for r in w.take_resolved()}
    assert got[50].count_check == "unverified" and got[50].unvouched


def test_the_sampled_forms_are_the_interpretation_only_when_they_explain_more():
    from specgen.quality.forms import SPLIT_AFTER, TIE_AFTER, Form

    # 80% of tool-call answers without the section end, 20% canonical, honest counts: the
    # plain table holds -1 for 80%, the sampled one 0 for all of them
    f = Form()
    for i in range(SPLIT_AFTER):
        omitted = i % 5 != 0
        f.add({-1: True} if omitted else {0: True},
              {-1: True, 0: True} if omitted else {0: True, 1: True})
        f.evaluate()
    assert f.offset == 0 and f.forms
    # every answer one fewer (a counting offset or the form without the end alike): a tie
    # waits, then keeps the counting offset
    g = Form()
    for _ in range(TIE_AFTER - 1):
        g.add({-1: True}, {-1: True, 0: True})
        assert g.evaluate() is None
    g.add({-1: True}, {-1: True, 0: True})
    assert g.evaluate() == "adopted" and g.offset == -1 and not g.forms
