"""The conversations held in memory and their tasks: admit a source row, ask the planner for
each conversation's next request, record tasks, close conversations, and keep each dataset's
state (active, done, limit or budget reached, paused) right.

Only a window of conversations is in memory (`open`); everything else lives in the store.
"""

from __future__ import annotations

import logging
from collections import Counter

from ..client.retry import backoff_delay
from ..config import EndpointConfig
from ..conversation import AssistantMessage, Conversation
from ..records import ConversationRecord, TaskRecord
from ..render import RenderError
from ..store import pack_json
from .events import EventLog
from .jobs import JobBuilder
from .progress import tasks_of_closed
from .stages import Stages
from .state import Conv, DsRun, Job, RetryQueue
from .writer import StoreWriter

log = logging.getLogger("specgen.engine")


class Conversations:
    def __init__(self, stages: Stages, jobs: JobBuilder, writer: StoreWriter,
                 events: EventLog, retries: RetryQueue, failed_classes: Counter,
                 endpoint: EndpointConfig):
        self.stages = stages
        self.endpoint = endpoint  # max_attempts, quarantine_retries, retry delays
        self.jobs = jobs
        self.writer = writer
        self.events = events
        self.retries = retries
        self.failed_classes = failed_classes  # failed tasks by class, all sessions
        self.open = 0  # conversations held in memory
        self.next_conv = 0  # the last ids given (the store's largest at load)
        self.next_task = 0

    # -- admitting and advancing ----------------------------------------------------------
    def admit(self, ds: DsRun, conv: Conversation, row_index: int) -> None:
        """Admit a source row: its conversation, and with `n` > 1 its copies (sample k has id
        `<id>#k` and meta `sample`), each a conversation of its own with its own draws."""
        ds.prompts += 1
        for k in range(ds.cfg.n):
            copy = conv if k == 0 else Conversation(
                id=f"{conv.id}#{k}", messages=conv.messages, tools=conv.tools,
                meta={**conv.meta, "sample": k, "source_id": conv.id})
            self.next_conv += 1
            c = Conv(id=self.next_conv, ds=ds, conv=copy, row_index=row_index,
                     status="pending")
            self.writer.batch.conversations.append(ConversationRecord(
                id=c.id, dataset=ds.name, conv_id=copy.id, row_index=row_index,
                status="pending", end_reason=None, data=pack_json(copy.to_json())))
            self.writer.uncommitted_convs.add((ds.name, copy.id))
            ds.conversations += 1
            ds.admitted_session += 1
            ds.conv_bump("pending")
            self.hold(c)
            self.advance(c)

    def hold(self, c: Conv) -> None:
        """A conversation enters memory (admitted, or reopened at resume)."""
        c.ds.open += 1
        self.open += 1

    def advance(self, c: Conv, known_tasks: dict[int, tuple] | None = None) -> None:
        """Ask the planner for the conversation's next request; queue it or close the
        conversation. `known_tasks` (resume): {turn: (id, status, attempts, error)}."""
        try:
            step = self.stages.next_request(c.conv, c.answers, c.ds.cfg.turns,
                                            tool_results=c.ds.cfg.tool_results)
        except Exception as exc:  # noqa: BLE001 - a planner bug must not kill the run
            log.exception("planner failed on conversation %s", c.conv.id)
            self.close(c, "failed", f"planner_error: {exc}")
            return
        if isinstance(step, self.stages.end):
            self.close(c, "ended" if step.reason else "done", step.reason)
            return
        known = (known_tasks or {}).get(step.turn)
        if known is not None:
            task_id, status, attempts, error = known
            ended = {"failed": ("failed", f"failed: {error}"),
                     "quarantined": ("ended", error or "quarantined"),
                     # a result without its answer cannot happen; be safe
                     "done": ("failed", "inconsistent: task done without a result")}
            if status in ended:
                self.close(c, *ended[status])
                return
            new = False
        else:
            task_id, attempts, new = self.new_task_id(), 0, True
        try:
            job = self.jobs.build(c, step, task_id, attempts)
        except (RenderError, ValueError, TypeError, KeyError) as exc:
            reason = (f"render_error: {exc}" if isinstance(exc, RenderError)
                      else f"request_error: {exc}")
            self.task_row(task_id, c, step.turn, "failed", attempts, reason)
            c.ds.bump("failed")
            self.failed_classes[reason.split(":", 1)[0]] += 1
            self.close(c, "failed", reason)
            return
        if new:
            self.task_row(task_id, c, step.turn, "pending", 0, None)
            c.ds.bump("pending")
        c.ds.ready.append(job)

    def new_task_id(self) -> int:
        self.next_task += 1
        return self.next_task

    def task_row(self, task_id: int, c: Conv, turn: int, status: str, attempts: int,
                 error: str | None) -> None:
        self.writer.batch.tasks[task_id] = TaskRecord(
            id=task_id, conversation=c.id, dataset=c.ds.name, turn=turn, status=status,
            attempts=attempts, error=error)

    # -- a task's end, or its next try -------------------------------------------------------
    def task_done(self, job: Job, message: AssistantMessage) -> None:
        """The task's answer was kept: the conversation goes on to its next request (before
        new conversations start)."""
        ds, c = job.ds, job.conv
        self.task_row(job.task_id, c, job.turn, "done", job.attempts, None)
        ds.bump("pending", -1)
        ds.bump("done")
        c.answers[job.turn] = message
        self.set_status(c, "active")
        self.advance(c)
        if ds.ready and ds.ready[-1].conv is c:
            ds.ready.rotate(1)  # continue this conversation before starting new ones

    def task_quarantined(self, job: Job, reason: str) -> None:
        """An answer was quarantined: the task is tried again while its quarantine retries
        last, then it ends the conversation early."""
        if job.quarantines < self.endpoint.quarantine_retries:
            job.quarantines += 1
            job.last_error = f"quarantined: {reason}"
            self.retry_or_fail(job, "quarantined")
            return
        self.task_row(job.task_id, job.conv, job.turn, "quarantined", job.attempts,
                      f"quarantined:{reason}")
        job.ds.bump("pending", -1)
        job.ds.bump("quarantined")
        self.close(job.conv, "ended", f"quarantined:{reason}")

    def retry_or_fail(self, job: Job, kind: str) -> None:
        """Retry a rejected or quarantined answer, unless the task is out of attempts."""
        ep = self.endpoint
        if job.attempts >= ep.max_attempts:
            self.fail(job, kind, f"gave up after {job.attempts} attempts; last: {job.last_error}")
            return
        self.retry_later(job, backoff_delay(job.attempts, base=ep.retry_base_delay,
                                            cap=ep.retry_max_delay))

    def retry_later(self, job: Job, delay: float) -> None:
        self.task_row(job.task_id, job.conv, job.turn, "pending", job.attempts, job.last_error)
        self.retries.push(job, delay)

    def fail(self, job: Job, kind: str, error: str | None) -> None:
        """The task failed (`kind`: its error class), and with it the conversation."""
        self.failed_classes[kind] += 1
        reason = f"{kind}: {error}" if error and not error.startswith(kind) else (error or kind)
        self.task_row(job.task_id, job.conv, job.turn, "failed", job.attempts, reason)
        job.ds.bump("pending", -1)
        job.ds.bump("failed")
        self.close(job.conv, "failed", f"failed:{kind}")

    # -- closing ----------------------------------------------------------------------------
    def close(self, c: Conv, status: str, reason: str | None) -> None:
        """A conversation is finished: done (normally), ended (early) or failed."""
        ds = c.ds
        ds.conv_bump(c.status, -1)
        ds.conv_bump(status)
        c.status = status
        self.writer.batch.conv_status[c.id] = (status, reason)
        ds.open -= 1
        self.open -= 1
        ds.closed_convs += 1
        ds.closed_tasks += tasks_of_closed(len(c.answers), status, reason)
        self.refresh_state(ds)

    def set_status(self, c: Conv, status: str) -> None:
        if c.status != status:
            c.ds.conv_bump(c.status, -1)
            c.ds.conv_bump(status)
            c.status = status
            self.writer.batch.conv_status[c.id] = (status, None)

    def forget(self, c: Conv) -> None:
        """Let a conversation go from memory without closing it (it stays open in the store
        and is picked up again by the next session)."""
        c.ds.open -= 1
        self.open -= 1

    def drop_ready(self, ds: DsRun) -> None:
        """Forget a blocked dataset's queued jobs (they stay pending in the store) so its
        conversations stop holding the admission window."""
        while ds.ready:
            self.forget(ds.ready.popleft().conv)
        for job in self.retries.remove(ds):
            self.forget(job.conv)

    # -- dataset state ----------------------------------------------------------------------
    def refresh_state(self, ds: DsRun) -> None:
        if ds.state == "active" and ds.limit_hit():
            self.set_state(ds, "limit_reached", f"limit of {ds.cfg.limit} conversations reached")
        if ds.state in ("active", "done") and ds.exhausted:
            finished = ds.open == 0 and not ds.tasks.get("pending")
            self.set_state(ds, "done" if finished else "active", None)

    def set_state(self, ds: DsRun, state: str, why: str | None) -> None:
        if ds.state == state:
            return
        ds.state = state
        ds.dirty = True
        if why:
            self.events.add(state, ds.name, None, why)
            log.info("dataset %s: %s", ds.name, why)

    def pause(self, ds: DsRun, why: str) -> None:
        """No new requests for this dataset this session; its work stays pending."""
        ds.paused = why
        self.set_state(ds, "paused", f"paused: {why}")
        self.drop_ready(ds)

    def stage_datasets(self, datasets: list[DsRun]) -> None:
        """Queue the rows of datasets whose counters changed for the next commit."""
        for ds in datasets:
            if ds.dirty:
                self.writer.batch.datasets[ds.name] = ds.row()
                ds.dirty = False
