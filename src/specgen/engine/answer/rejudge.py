"""Samples judged again: a sample stored `pending` — its completion side waiting for its
provider's counting offset for its answer form (`quality.witness`, `quality.forms`) — gets its
final verdict once that offset is adopted, or its form splits, or the session ends (`settle`);
a sample judged at an offset its form later loses (the form split) becomes `unverified`.
Each becomes a `Change` of its stored row:

* still a sample (exact, repaired, unverified; or a mismatch kept under `[quality]
  on_count_mismatch = "flag" | "keep"`): a `VerdictRecord` updates its verdicts, and its
  message, ids and repairs when the offset chose another completion repair than the one it was
  stored with — or, when its form split after it was repaired at the lost offset, its row as
  it was before that repair (a repair the counts no longer back is taken back);
* a mismatch under `on_count_mismatch = "quarantine"` (the default): the row moves to the
  quarantine table as `count_mismatch` with its figures, and its task is quarantined, as an
  answer judged a mismatch at once is (`answer.quality`).
"""

from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from ... import jsonexact
from ...quality.shapes import PROMPT_MISMATCHES
from ...quality.witness import CountWitness, Resolution
from ...records import QuarantineRecord, ResultRecord, VerdictRecord
from ...store import Store, pack_ids, pack_json, unpack_ids
from .outcomes import Quarantined

RECENT = 512  # this session's latest judged rows kept in memory (the writer commits sooner)


@dataclass(frozen=True, slots=True)
class Change:
    """A stored sample's final verdict: `verdict` (it stays a sample) or `quarantine` (it
    moves to the quarantine table); `before` the count_check it was stored with."""

    task: int
    dataset: str
    provider: str | None
    before: str
    after: str
    verdict: VerdictRecord | None = None
    quarantine: QuarantineRecord | None = None
    this_session: bool = True  # stored by this session (else read back on resume)
    unvouched: bool = False  # unverified because its form's counts split (quality.forms)


class Rejudge:
    """Holds this session's pending samples (their rows and raw answers) until judged again;
    an earlier session's pending sample is read back from the store."""

    def __init__(self, witness: CountWitness, on_count_mismatch: str, store: Store | None):
        self.witness = witness
        self.on_count_mismatch = on_count_mismatch
        self.store = store
        self.held: dict[int, tuple[ResultRecord, dict[str, Any]]] = {}
        # this session's samples judged at once (exact, repaired): a form that splits later
        # makes them unverified, maybe before the writer committed their rows
        self.recent: OrderedDict[int, ResultRecord] = OrderedDict()
        # those of them stored with a count repair of their completion: the row as it was
        # without it (message, input_ids, repairs), what a split takes them back to
        self.unrepaired: dict[int, tuple[str, bytes, str]] = {}
        self.judged: set[int] = set()

    def remember(self, record: ResultRecord,
                 unrepaired: tuple[str, bytes, str] | None = None) -> None:
        """A sample stored with a final verdict this session (see `recent`); `unrepaired`:
        its row without the count repair of its completion, when it has one."""
        self.judged.add(record.task)
        self.recent[record.task] = record
        self.unrepaired.pop(record.task, None)
        if unrepaired is not None:
            self.unrepaired[record.task] = unrepaired
        while len(self.recent) > RECENT:
            self.unrepaired.pop(self.recent.popitem(last=False)[0], None)

    def hold(self, record: ResultRecord, response: dict[str, Any],
             unrepaired: tuple[str, bytes, str] | None = None) -> None:
        """A sample stored pending this session (`response`: its raw answer, for the
        quarantine row should it end a mismatch; `unrepaired`: as for `remember`, when its
        completion was repaired at once and its prompt side waits)."""
        self.held[record.task] = (record, response)
        if unrepaired is not None:
            self.unrepaired[record.task] = unrepaired

    def take(self) -> list[Change]:
        """The samples the witness judged again since the last call."""
        return self._changes(self.witness.take_resolved())

    def settle(self) -> list[Change]:
        """Final verdicts of every sample still pending (the session ends)."""
        return self._changes(self.witness.settle())

    def _changes(self, resolved: list[Resolution]) -> list[Change]:
        out = []
        for r in resolved:
            if isinstance(r.key, int) and (change := self._change(r)) is not None:
                out.append(change)
        return out

    def _change(self, r: Resolution) -> Change | None:
        held = self.held.pop(r.key, None)
        back = self.unrepaired.pop(r.key, None)
        # this session's own view first (its latest verdict may not be committed yet)
        record = held[0] if held is not None else self.recent.get(r.key)
        if record is None and self.store is not None:
            record = self.store.result_record(r.key)
        if record is None:
            return None  # not stored (e.g. quarantined by a later stage): nothing to change
        response = held[1] if held is not None else _stored_response(record)
        message, input_ids, repairs = _completion_fix(record, r)
        if r.unvouched and back is not None:
            # repaired at an offset its form has lost: the counts no longer back the repair,
            # so the sample is again what the provider sent (never rewritten unbacked)
            message, input_ids, repairs = back
            # a true-ids row's recorded witness verdict is the final one (rewritten below)
            repairs = orjson.dumps(["witness:pending" if x.startswith("witness:") else x
                                    for x in orjson.loads(repairs)]).decode()
        true_ids = record.count_check == "true_ids"
        if true_ids:  # the backend's ids are the sample: the verdict on ours is measured
            repairs = orjson.dumps([f"witness:{r.count_check}" if x == "witness:pending"
                                    else x for x in orjson.loads(repairs or record.repairs
                                                                 or "[]")]).decode()
        after = "true_ids" if true_ids else r.count_check
        base = dict(task=record.task, dataset=record.dataset, provider=record.provider,
                    before=record.count_check or "pending", after=after,
                    this_session=held is not None or r.key in self.judged,
                    unvouched=r.unvouched)
        if after == "mismatch" and self.on_count_mismatch == "quarantine":
            q = Quarantined("count_mismatch", _figures(record, r))
            return Change(**base, quarantine=QuarantineRecord(
                task=record.task, dataset=record.dataset, provider=record.provider,
                reason=q.reason, response=pack_json(response), created_at=time.time(),
                detail=q.detail_json()))
        verdict = VerdictRecord(
            task=record.task, count_check=after, prompt_check=r.prompt_check,
            completion_check=r.completion_check, message=message, input_ids=input_ids,
            repairs=repairs)
        if after in ("exact", "repaired"):  # its form may still split: judged again then
            self.remember(record._replace(**{k: v for k, v in verdict._asdict().items()
                                             if v is not None}),
                          back or ((record.message, record.input_ids, record.repairs)
                                   if message is not None else None))
        return Change(**base, verdict=verdict)


def _completion_fix(record: ResultRecord, r: Resolution
                    ) -> tuple[str | None, bytes | None, str | None]:
    """The row's message, ids and repairs when the completion's final verdict is a repair (a
    sample waiting for its offset is stored with our ids unchanged; None, None, None: they
    stay)."""
    v = r.completion
    if v is None or v.check != "repaired" or v.ids is None or v.message is None:
        return None, None, None
    ids = unpack_ids(record.input_ids)[:record.n_prompt]
    old = orjson.loads(record.repairs or "[]")
    return (jsonexact.dumps(v.message.to_openai()).decode(),
            pack_ids(array("I", ids) + array("I", v.ids)),
            orjson.dumps([*old, *(f"count:{n}" for n in v.repairs)]).decode())


def _figures(record: ResultRecord, r: Resolution) -> dict[str, Any]:
    """A re-judged mismatch's figures, as `answer.quality.count_figures` gives them at once."""
    if r.prompt_check in PROMPT_MISMATCHES:
        message = (f"prompt: ours {record.n_prompt}, provider {record.prompt_tokens} "
                   f"({r.prompt_check})")
    else:
        message = r.completion.detail if r.completion is not None else "completion mismatch"
    theirs_c = record.completion_tokens
    ours_c = (theirs_c - record.completion_delta
              if theirs_c is not None and record.completion_delta is not None else None)
    return {"message": f"judged again: {message}", "check": "mismatch", "settled": True,
            "prompt": {"ours": record.n_prompt, "provider": record.prompt_tokens},
            "completion": {"ours": ours_c, "provider": theirs_c}}


def _stored_response(record: ResultRecord) -> dict[str, Any]:
    """An earlier session's sample as its quarantine row's raw answer: its message and the
    counts it reported."""
    return {"message": jsonexact.loads(record.message), "provider": record.provider,
            "model": record.model, "finish_reason": record.finish_reason,
            "usage": {"prompt_tokens": record.prompt_tokens,
                      "completion_tokens": record.completion_tokens}}
