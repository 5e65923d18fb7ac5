"""A failed attempt, carried out: the retry policy (`retry`) decides what an error means
(retry, shrink `max_tokens`, stop or fail the run, fail the task), and this module does it to
the engine's books, limits and queues (`engine`: the scheduler's Engine, untyped here so
the arrow points one way). The scheduler only hands the error over.
"""

from __future__ import annotations

import logging

from ..client.types import ApiError
from ..request import with_max_tokens
from . import attempts
from .retry import Decision
from .state import Job

log = logging.getLogger("specgen.engine")


def on_error(engine, job: Job, err: ApiError) -> None:
    """A failed attempt: the retry policy decides, and its decision is carried out."""
    charge = engine.budget.charge_usage(job.ds.name, err.usage, live=job.live)
    kind = err.kind
    d = engine.retry_policy.decide(
        err,
        attempts=job.attempts,
        max_tokens=job.max_tokens,
        prompt_cost=engine.budget.prices.cost(len(job.prompt_ids), 0) or 0.0,
        endpoint_down=engine.health.down,
    )
    if not d.counts:
        job.attempts -= 1  # an outage or a full in-flight budget says nothing of the task
    outcome = f"retry:{kind}" if d.action in ("retry", "shrink") else f"fatal:{kind}"
    engine.record_attempt(attempts.failed(engine.session_id, job, err, charge, outcome))
    engine.stats.errors[kind] += 1
    engine.stats.billed(
        err.provider, charge.prompt_tokens, charge.completion_tokens, charge.cost_usd
    ).errors[kind] += 1
    engine.limits.on_error(job, err)
    job.last_error = str(err)[:500]
    _carry_out(engine, job, err, d)


def _carry_out(engine, job: Job, err: ApiError, d: Decision) -> None:
    """Carry out the retry policy's decision on a failed attempt."""
    if d.action in ("stop_run", "fail_run"):
        engine.book.task_row(
            job.task_id, job.conv, job.turn, "pending", job.attempts, job.last_error
        )
        job.ds.ready.appendleft(job)  # stays pending: a later run sends it again
        if d.action == "fail_run":
            engine.stop.fail(d.message, dataset=job.ds.name, provider=err.provider)
            return
        if engine.stop.kind != "account":
            engine.events.add("account_limit", job.ds.name, err.provider, d.message)
            log.error("%s", d.message)
        engine.request_stop(d.message, kind="account")
    elif d.action == "shrink":
        job.shrunk_from = job.shrunk_from or job.max_tokens
        job.max_tokens = d.max_tokens or job.max_tokens
        job.body = with_max_tokens(job.body, job.max_tokens)
        engine.events.once(
            "max_tokens_shrunk",
            job.ds.name,
            None,
            f"402 weight_exceeds_budget: retrying with a smaller max_tokens "
            f"({d.message}); recorded on the sample",
        )
        engine.book.retry_later(job, 0.0)
    elif d.action == "retry":
        if d.pause is not None and (why := engine.limits.pause_endpoint(d.pause, err)):
            engine.request_stop(why, kind="unreachable")
        engine.book.retry_later(job, d.delay)
    else:
        engine.book.fail(job, err.kind, d.message or job.last_error)
