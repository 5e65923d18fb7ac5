"""The `attempts` rows of one try of a task: answered (kept, quarantined, rejected), failed
with an error, or cancelled by a stop."""

from __future__ import annotations

import time

from ..client.types import ApiError, ChatResponse
from ..records import AttemptRecord
from .budget import Charge
from .state import Job


def answered(session: int, job: Job, resp: ChatResponse, charge: Charge, outcome: str,
             error: str | None = None) -> AttemptRecord:
    return AttemptRecord(
        task=job.task_id, session=session, base_url=resp.base_url, provider=resp.provider,
        model=resp.model, started_at=resp.started_at or time.time(),
        first_byte_at=resp.first_byte_at, ended_at=resp.ended_at or time.time(),
        outcome=outcome, http_status=getattr(resp, "http_status", None), error=error,
        prompt_tokens=charge.prompt_tokens, completion_tokens=charge.completion_tokens,
        cost_usd=charge.cost_usd, generation_id=resp.id, dataset=job.ds.name,
        first_token_at=resp.first_token_at)


def failed(session: int, job: Job, err: ApiError, charge: Charge,
           outcome: str) -> AttemptRecord:
    return AttemptRecord(
        task=job.task_id, session=session, base_url=err.base_url, provider=err.provider,
        model=err.model, started_at=err.started_at or time.time(),
        first_byte_at=err.first_byte_at, ended_at=err.ended_at or time.time(),
        outcome=outcome, http_status=err.status, error=str(err)[:2000],
        prompt_tokens=charge.prompt_tokens, completion_tokens=charge.completion_tokens,
        cost_usd=charge.cost_usd, generation_id=err.generation_id, dataset=job.ds.name)


def cancelled(session: int, job: Job, started: float) -> AttemptRecord:
    return AttemptRecord(
        task=job.task_id, session=session, base_url=None, provider=None, model=None,
        started_at=started, first_byte_at=None, ended_at=time.time(), outcome="cancelled",
        http_status=None, error="cancelled by stop --now", prompt_tokens=None,
        completion_tokens=None, cost_usd=None, generation_id=None, dataset=job.ds.name)
