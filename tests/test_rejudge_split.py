"""A count repair chosen at an offset its form later loses (the form splits) is taken back:
the sample becomes unverified *and* is again what the provider sent, never a rewrite the
counts no longer back (engine.answer.rejudge, with the real count witness).

The case it comes from: the simulator's raw text mode inflates a provider's counts on some
answers, so the witness adopts +1 for a while; at +1 a model's own repeated word, streamed as
two identical events, looks like a relay's retransmission the count backs, and was taken out."""

from __future__ import annotations

from array import array

import orjson

from specgen import jsonexact
from specgen.conversation import AssistantMessage
from specgen.engine.answer.rejudge import Rejudge
from specgen.quality.forms import SPLIT_AFTER
from specgen.quality.witness import WARMUP, CountWitness
from specgen.records import ResultRecord
from specgen.store import pack_ids, pack_json, unpack_ids

PROMPT = list(range(100, 110))
SAID = AssistantMessage(content="Or five, and and around")  # what the model sampled
SAID_IDS = list(range(500, 520))  # 20 ids
CUT = AssistantMessage(content="Or five, and around")  # one "and" taken out
CUT_IDS = SAID_IDS[:19]


def record(task: int, message: AssistantMessage, ids: list[int], check: str,
           repairs: list[str]) -> ResultRecord:
    return ResultRecord(
        task=task, conversation=task, dataset="d", turn=1, provider="P", model="m",
        finish_reason="stop", native_finish_reason="stop", request=pack_json({"messages": []}),
        message=jsonexact.dumps(message.to_openai()).decode(),
        input_ids=pack_ids(array("I", PROMPT + ids)), n_prompt=len(PROMPT),
        true_prompt_ids=None, true_completion_ids=None, prompt_tokens=len(PROMPT),
        completion_tokens=20, reasoning_tokens=None, cost_usd=0.0,
        repairs=orjson.dumps(repairs).decode(), latency_s=0.1, created_at=0.0,
        count_check=check, tool_matches=None, quantization=None, sampling=None)


def dedup(target: int):
    """The dedup repair as the witness stage offers it: one "and" out fits 19 ids."""
    return (CUT, CUT_IDS, ["duplicate_events"]) if target == len(CUT_IDS) else None


def judge(w: CountWitness, key: int, theirs: int, ours: int = 20, repair=None):
    return w.judge("P", prompt=len(PROMPT), completion=ours,
                   usage={"prompt_tokens": len(PROMPT), "completion_tokens": theirs},
                   repair=repair, key=key)


def apply(row: ResultRecord, changes) -> ResultRecord:
    for c in changes:
        if c.task == row.task and c.verdict is not None:
            row = row._replace(**{k: v for k, v in c.verdict._asdict().items()
                                  if v is not None})
    return row


def split(w: CountWitness, rj: Rejudge, start: int, row: ResultRecord) -> ResultRecord:
    """Honest answers (another offset) until the form holding +1 splits."""
    for k in range(start, start + SPLIT_AFTER):
        judge(w, k, theirs=18)
        row = apply(row, rj.take())
        if w.split_forms("P"):
            return row
    raise AssertionError("the form never split")


def test_a_pending_sample_repaired_at_an_offset_later_lost_goes_back_to_what_was_sent():
    w = CountWitness()
    rj = Rejudge(w, "quarantine", None)
    judge(w, 0, theirs=21)
    judge(w, 1, theirs=21)
    # exact at 0, repaired at +1: it waits for the offset
    assert judge(w, 100, theirs=20, repair=dedup).check == "pending"
    row = record(100, SAID, SAID_IDS, "pending", [])
    rj.hold(row, {"content": SAID.content})
    for k in range(2, WARMUP):  # +1 adopted: the repair is taken
        judge(w, k, theirs=21)
        row = apply(row, rj.take())
    assert row.count_check == "repaired"
    assert unpack_ids(row.input_ids)[len(PROMPT):] == CUT_IDS
    row = split(w, rj, WARMUP, row)
    assert row.count_check == "unverified"
    assert jsonexact.loads(row.message)["content"] == SAID.content
    assert unpack_ids(row.input_ids) == PROMPT + SAID_IDS
    assert not any(r.startswith("count:") for r in orjson.loads(row.repairs))


def test_a_sample_repaired_at_once_goes_back_when_its_form_splits():
    w = CountWitness()
    rj = Rejudge(w, "quarantine", None)
    for k in range(WARMUP):
        judge(w, k, theirs=21)
    rj.take()
    v = judge(w, 100, theirs=20, repair=dedup)
    assert v.check == "repaired" and v.completion_repairs == ["duplicate_events"]
    row = record(100, CUT, CUT_IDS, "repaired", ["normalised", "count:duplicate_events"])
    sent = record(100, SAID, SAID_IDS, "repaired", ["normalised"])
    rj.remember(row, (sent.message, sent.input_ids, sent.repairs))
    row = split(w, rj, WARMUP, row)
    assert row.count_check == "unverified"
    assert (row.message, row.input_ids, orjson.loads(row.repairs)) == (
        sent.message, sent.input_ids, ["normalised"])


def test_an_exact_sample_is_left_as_it_is_when_its_form_splits():
    w = CountWitness()
    rj = Rejudge(w, "quarantine", None)
    for k in range(WARMUP):
        judge(w, k, theirs=21)
    assert judge(w, 100, theirs=21).check == "exact"
    row = record(100, SAID, SAID_IDS, "exact", [])
    rj.remember(row)
    after = split(w, rj, WARMUP, row)
    assert after.count_check == "unverified"
    assert (after.message, after.input_ids) == (row.message, row.input_ids)


def test_a_sample_repaired_at_once_while_its_prompt_waits_goes_back_too():
    w = CountWitness()
    rj = Rejudge(w, "quarantine", None)
    for k in range(WARMUP):
        judge(w, k, theirs=21)
    rj.take()
    # completion repaired at +1 at once; a prompt side 9 ids off on a new shape waits
    v = w.judge("P", prompt=len(PROMPT), completion=20, shape="s", tools=True, key=100,
                usage={"prompt_tokens": len(PROMPT) + 9, "completion_tokens": 20},
                repair=dedup)
    assert (v.check, v.completion_check, v.prompt_check) == ("pending", "repaired", "pending")
    row = record(100, CUT, CUT_IDS, "pending", ["count:duplicate_events"])
    sent = record(100, SAID, SAID_IDS, "pending", [])
    rj.hold(row, {"content": CUT.content}, (sent.message, sent.input_ids, sent.repairs))
    row = split(w, rj, WARMUP, row)
    w.judge("P", prompt=len(PROMPT), completion=20, shape="s", tools=True, key=101,
            usage={"prompt_tokens": len(PROMPT) + 9, "completion_tokens": 18})
    row = apply(row, rj.take())
    assert row.count_check == "unverified"
    assert (row.message, row.input_ids, row.repairs) == (sent.message, sent.input_ids, "[]")
