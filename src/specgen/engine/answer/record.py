"""Stage 5, record: the kept answer as its results row (`specgen.records.ResultRecord`).

The sample is the prompt the model saw (ours, or the one a prompt repair found) followed by
the ids it sampled; `request` is what was sent (the history as the serving stack rendered it,
when that is the prompt), with the smaller `max_tokens` of a 402 shrink recorded on it.
"""

from __future__ import annotations

import time
from array import array
from typing import Any

import orjson

from ... import jsonexact
from ...records import QuarantineRecord, ResultRecord
from ...store import encode_tool_matches, pack_ids, pack_json, unpack_ids
from .attempt import Answer, AnswerContext
from .outcomes import Kept, Outcome, Quarantined


def check(a: Answer, ctx: AnswerContext) -> Outcome | None:
    job, resp = a.job, a.resp
    prompt_ids = a.sample_prompt_ids
    request = {"messages": job.messages, "tools": job.tools}
    if a.prompt_messages is not None:  # the history as the serving stack rendered it
        request["messages"] = a.prompt_messages
    repairs = list(a.repairs)
    if job.shrunk_from is not None:  # sent smaller than configured: say so on the sample
        repairs.append(f"max_tokens_shrunk:{job.shrunk_from}->{job.max_tokens}")
        request["max_tokens"] = job.max_tokens
    usage = resp.usage or {}
    details = usage.get("completion_tokens_details") or {}
    latency = (resp.ended_at - resp.started_at) if resp.ended_at else None
    record = ResultRecord(
        task=job.task_id, conversation=job.conv.id, dataset=job.ds.name, turn=job.turn,
        provider=resp.provider, model=resp.model, finish_reason=resp.finish_reason,
        native_finish_reason=resp.native_finish_reason, request=pack_json(request),
        message=jsonexact.dumps(a.message.to_openai()).decode(),
        input_ids=pack_ids(prompt_ids + array("I", a.completion)), n_prompt=len(prompt_ids),
        true_prompt_ids=_ids(resp.prompt_token_ids),
        true_completion_ids=_ids(resp.completion_token_ids),
        prompt_tokens=a.charge.prompt_tokens, completion_tokens=a.charge.completion_tokens,
        reasoning_tokens=(details.get("reasoning_tokens") if isinstance(details, dict)
                          else None),
        cost_usd=a.charge.cost_usd, repairs=orjson.dumps(repairs).decode(),
        latency_s=latency, created_at=time.time(), count_check=a.count_check,
        tool_matches=encode_tool_matches(job.tool_matches),
        quantization=resp.quantization or ctx.policy.declared_quantization(resp.provider),
        sampling=orjson.dumps(job.settings.to_json()).decode() if job.settings else None,
        **_sides(a.verdict))
    return Kept(record, a.message, tuple(repairs), a.count_check)


def unrepaired_row(a: Answer, record: ResultRecord) -> tuple[str, bytes, str] | None:
    """`record`'s message, input_ids and repairs without the count repair of its completion
    (`Answer.unrepaired`), or None when it has none."""
    if a.unrepaired is None:
        return None
    message, completion, names = a.unrepaired
    taken = {f"count:{n}" for n in names}
    repairs = [r for r in orjson.loads(record.repairs) if r not in taken]
    return (jsonexact.dumps(message.to_openai()).decode(),
            pack_ids(array("I", (unpack_ids(record.input_ids) or [])[:record.n_prompt])
                     + array("I", completion)),
            orjson.dumps(repairs).decode())


def quarantine_record(job, resp, q: Quarantined) -> QuarantineRecord:
    """The quarantine row of a quarantined answer: the raw answer and the reason's figures."""
    return QuarantineRecord(
        task=job.task_id, dataset=job.ds.name, provider=resp.provider, reason=q.reason,
        response=pack_json(response_json(resp)), created_at=time.time(),
        detail=q.detail_json())


def response_json(resp) -> dict[str, Any]:
    """The raw answer as stored with a quarantine (for a person to look at)."""
    return {
        "content": resp.content, "reasoning": resp.reasoning,
        "reasoning_field": resp.reasoning_field,
        "tool_calls": [{"index": c.index, "id": c.id, "name": c.name, "arguments": c.arguments}
                       for c in resp.tool_calls],
        "finish_reason": resp.finish_reason, "native_finish_reason": resp.native_finish_reason,
        "provider": resp.provider, "model": resp.model, "id": resp.id, "usage": resp.usage,
    }


def _sides(v) -> dict[str, Any]:
    """The witness's two sides on the row (docs/quality.md, "Two sides")."""
    if v is None or v.completion_check is None:
        return {}
    return {"prompt_delta": v.prompt_delta, "completion_delta": v.completion_delta,
            "prompt_check": v.prompt_check, "completion_check": v.completion_check,
            "prompt_shape": v.shape}


def _ids(ids) -> bytes | None:
    return pack_ids(ids) if ids is not None else None
