"""The scheduler: one asyncio loop keeping `concurrency` requests in flight.

It schedules and decides nothing about an answer. Conversations come from the admission
(`admission`: rows read lazily, a window of conversations in memory) and each yields one task
at a time (`conversations`: the planner's next request, built by `jobs`); the dispatch loop
below sends ready jobs within the limits (concurrency, budgets, the account's in-flight
budget, an endpoint that is down or paused, a store that refuses commits). Every answer goes
through the answer path (`answer.pipeline`: accept → normalise → witness → quality → record)
and the engine carries out its outcome; every error through the retry policy (`retry`), whose
decision `failures` carries out. Everything is recorded through the batched writer;
docs/engine.md tells the whole story, docs/design.md "How an answer travels" the answer path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..client.types import ApiError, ChatResponse
from ..config import RunConfig
from ..judgement import judge
from ..quality.monitor import QualityMonitor
from ..quality.witness import CountWitness
from ..records import AttemptRecord
from ..render import Renderer
from ..request import request_dialect
from ..store import Store, StoreWriteError
from . import attempts, failures, figures, loading, periodic
from .admission import Admission
from .answer.attempt import AnswerContext
from .answer.outcomes import Fatal, Kept, Quarantined, Rejected
from .answer.pipeline import AnswerPipeline, Processed, uncancelled
from .answer.record import quarantine_record
from .budget import Budget, Charge
from .conversations import Conversations
from .events import EventLog
from .jobs import JobBuilder
from .limits import Limits
from .model_check import ModelCheck
from .outcome import Outcome, judged, session_outcome
from .policy import ProviderPolicy
from .progress import EtaEstimator, RowCounter
from .retry import RetryPolicy
from .shard import Shard
from .stages import Stages
from .state import DsRun, Job, RetryQueue
from .stats import ProviderStats, RunStats
from .steering import Steering
from .stop import StopState
from .store_guard import StoreGuard
from .writer import StoreWriter

log = logging.getLogger("specgen.engine")


class Engine:
    """Runs one session over an opened store. Build it with `specgen.engine.runner`."""

    def __init__(
        self, cfg: RunConfig, *, store: Store, client: Any, renderer: Renderer,
        stages: Stages, policy: ProviderPolicy, budget: Budget, session_id: int,
        reader: Store | None = None,
        shard: Shard | None = None, drain_timeout: float | None = None,
        dialect_url: str | None = None,
        threaded_commits: bool = True,
        ballast=None,
        renderer_for: Callable[[bool], Renderer] | None = None,
    ):
        self.cfg, self.store, self.client, self.renderer = cfg, store, client, renderer
        self.reader = reader or store  # a second connection for reads during threaded commits
        self.stages, self.policy, self.budget = stages, policy, budget
        self.session_id, self.shard = session_id, shard
        self.run_dir = store.path.parent
        ep, eng = cfg.endpoint, cfg.engine
        self.tokens_mode = ep.tokens_mode and stages.build_token_request is not None
        self.token_api = ep.token_api_name
        self.retry_policy = RetryPolicy(ep, retry_after_cap=eng.retry_after_cap,
                                        shrink_max_tokens=cfg.budget.shrink_max_tokens)
        self.witness = CountWitness()
        # policing and alarms (they decide; quality.blame: whose fault an alarm is)
        self.quality = QualityMonitor(cfg.quality, run_dir=str(self.run_dir),
                                      routable=policy.routable_without)
        self.threaded_commits = threaded_commits
        # exclusions reach the API as provider.ignore (OpenRouter's routing, the simulator's)
        self.routes_providers = (not self.tokens_mode
                                 and request_dialect(cfg, dialect_url) == "openrouter")
        self._assemble(ballast=ballast, dialect_url=dialect_url, drain_timeout=drain_timeout,
                       renderer_for=renderer_for or (lambda _thinking: renderer))
        self.final_state: str | None = None  # set when the session ends
        self.batch = None  # mode = "batch": the batch driver answers jobs (engine.batch_driver)
        self._running = False  # dispatching (finished attempts top up the slots)
        self.started_at = time.time()
        self._redone: set[int] = set()  # conversations redone this session (engine.redo)

    def _assemble(self, *, ballast, dialect_url: str | None, drain_timeout: float | None,
                  renderer_for: Callable[[bool], Renderer]) -> None:
        """The session's parts, each with what it needs of the others."""
        cfg, store, stages = self.cfg, self.store, self.stages
        ep, eng = cfg.endpoint, cfg.engine
        self.writer = StoreWriter(store, interval=eng.commit_interval,
                                  max_rows=eng.commit_rows, threaded=self.threaded_commits)
        self.store_guard = StoreGuard(self.writer, store, ballast=ballast,
                                      timeout=eng.store_error_timeout)
        self.stats = RunStats()
        self.eta = EtaEstimator()  # fed the tasks ended so far at every tick
        self.row_counters: dict[str, RowCounter] = {}  # dataset -> its source's row count
        self.datasets: list[DsRun] = []
        self.by_name: dict[str, DsRun] = {}
        self.weighted = any(d.weight is not None for d in cfg.datasets)
        self.inflight: dict[asyncio.Task, Job] = {}
        self.inflight_weight = 0.0
        self.retries = RetryQueue()
        self.failed_classes: Counter[str] = Counter()  # failed tasks by class, all sessions
        self._wake = asyncio.Event()
        self.events = EventLog(self.writer, self.session_id)
        self.limits = Limits(cfg, self.events, prices_known=self.budget.prices.known)
        self.limit, self.health = self.limits.adaptive, self.limits.health
        self.spend_window = self.limits.spend_window
        self.stop = StopState(
            self.events, drain_timeout=eng.drain_timeout if drain_timeout is None
            else drain_timeout, in_flight=lambda: len(self.inflight), wake=self.wake)
        jobs = JobBuilder(cfg, stages, tokens_mode=self.tokens_mode, dialect_url=dialect_url,
                          renderer_for=renderer_for)
        self.book = Conversations(stages, jobs, self.writer, self.events, self.retries,
                                  self.failed_classes, ep)
        self.admission = Admission(
            cfg, stages, self.book, self.writer, self.reader, self.events, self.stop,
            self.datasets, window=max(1, int(eng.admit_window * ep.concurrency)),
            shard=self.shard, wake=self.wake)
        self.steering = Steering(
            self.run_dir, session_id=self.session_id, quality_cfg=cfg.quality,
            policy=self.policy, monitor=self.quality, book=self.book, datasets=self.by_name, writer=self.writer,
            events=self.events, stop=self.stop, wake=self.wake)
        model_check = ModelCheck(cfg.target.model, ep.accept_models)
        self.answers = AnswerPipeline(AnswerContext(
            cfg, stages, self.policy, model_check, self.witness, self.tokens_mode,
            secrets=getattr(self.client, "secrets", None)), self.quality,
            store=store)

    # -- what the live view, status and tests read ----------------------------------------------
    @property
    def stopping(self) -> str | None:
        return self.stop.stopping

    @property
    def fatal(self) -> str | None:
        return self.stop.fatal

    @property
    def open_convs(self) -> int:
        return self.book.open

    @property
    def alarms_fired(self) -> list[dict[str, Any]]:
        return self.steering.alarms_fired

    def wake(self) -> None:
        self._wake.set()

    def load(self, *, retry_failed: bool = False, ack_alarms: tuple[str, ...] = ()) -> None:
        """Rebuild the in-memory state from the store (`loading`)."""
        loading.load(self, retry_failed=retry_failed, ack_alarms=ack_alarms)

    def progress(self) -> dict[str, Any]:
        return figures.progress(self)

    def note_redo(self, done) -> None:
        """Say that a redo (engine.redo) was made: the events, the log."""
        self.events.add("redo", None, ", ".join(done.providers), done.message)
        log.warning("%s", done.message)

    def concurrency(self) -> tuple[int, str | None]:
        """The in-flight limit now, and why it is below the configured one (None if not)."""
        return self.limits.now(self.store_guard.holding)

    def store_problem(self) -> dict[str, Any] | None:
        return figures.store_problem(self.writer)

    def live_figures(self) -> dict[str, Any]:
        return figures.live_figures(self)

    def request_stop(self, why: str, now: bool = False, kind: str = "user") -> None:
        """First call: stop dispatching and drain. A second call (or now=True): cancel."""
        self.stop.request(why, now=now, kind=kind)

    # -- dispatch -----------------------------------------------------------------------------
    def _order(self) -> list[DsRun]:
        if self.weighted:
            return sorted(self.datasets, key=lambda d: (d.tasks.get("done", 0) / d.weight,
                                                        d.position))
        return self.datasets

    def _pick(self) -> Job | None:
        """The next job to send, honouring dataset order and budgets."""
        for ds in self._order():
            if ds.paused is not None:
                if ds.ready:
                    self.book.drop_ready(ds)  # answers that arrived since: they wait, pending
                continue
            if not ds.ready:
                continue
            job = ds.ready[0]
            verdict = self.budget.check(ds.name, len(job.prompt_ids), job.max_tokens,
                                        live=self.batch is not None and self.batch.goes_live(job))
            if verdict == "ok":
                ds.blocked = None
                weight = self._weight(job)
                if not self.spend_window.admits(weight, self.inflight_weight,
                                                len(self.inflight)):
                    return None  # the account's in-flight budget is full: wait for answers
                job.weight = weight
                return ds.ready.popleft()
            if verdict == "wait":
                continue
            if verdict == "tokens_exhausted":
                ds.blocked = "tokens"
                why = f"token budget of {ds.cfg.token_budget:,} completion tokens reached"
            else:
                ds.blocked = "cost"
                why = f"run cost cap of ${self.budget.max_cost_usd:g} reached"
            self.book.set_state(ds, "budget_reached", why)
            self.book.drop_ready(ds)
        return None

    def _release_due(self) -> float | None:
        """Move retries whose backoff is over back to the front of their queues; returns the
        time until the next one is due (None when there is none)."""
        due, next_in = self.retries.pop_due()
        for job in due:
            job.ds.ready.appendleft(job)
        return next_in

    def _weight(self, job: Job) -> float:
        """A request's estimated cost as the API estimates it (prompt + max_tokens at the
        known prices; tokens when no prices are known)."""
        n_prompt = len(job.prompt_ids)
        if self.budget.prices.known:
            return self.budget.worst_cost(n_prompt, job.max_tokens)
        return float(n_prompt + job.max_tokens)

    def _launch(self, job: Job, probe: bool = False) -> None:
        ds = job.ds
        if self.policy.excluded and self.routes_providers:
            job.body = {**job.body, "provider": self.policy.provider_object(
                self.cfg.endpoint.provider)}
        job.live = self.batch is not None and self.batch.goes_live(job)
        job.reservation = self.budget.reserve(ds.name, len(job.prompt_ids), job.max_tokens,
                                              live=job.live)
        job.epoch = self.limit.epoch
        job.attempts += 1
        job.probe = probe
        job.sent_at = self.health.clock()
        if probe:
            self.health.probe_sent()
        job.weight_before = self.inflight_weight
        self.inflight_weight += job.weight
        ds.in_flight += 1
        task = asyncio.get_running_loop().create_task(self._attempt(job))
        self.inflight[task] = job
        task.add_done_callback(self._attempt_done)

    def _attempt_done(self, task: asyncio.Task) -> None:
        job = self.inflight.pop(task, None)
        if job is not None:
            job.ds.in_flight -= 1
            self.inflight_weight = max(0.0, self.inflight_weight - job.weight)
            if job.reservation is not None:
                self.budget.release(job.reservation)
                job.reservation = None
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("internal error while handling an answer: %r", exc, exc_info=exc)
            self.stop.fail(f"internal error: {exc!r}", event=None, logged=False)
        if self._running:
            self._top_up()
        self.wake()

    def _has_work(self) -> bool:
        if self.retries:
            return True
        if any(ds.ready and ds.blocked is None and ds.paused is None for ds in self.datasets):
            return True
        return bool(self.admission.admissible())

    def _top_up(self) -> None:
        """Launch jobs while there is room under the limit. Called by the dispatch loop and
        after every finished attempt, so a burst of answers is replaced by new requests
        straight away rather than after the whole burst has been processed."""
        while len(self.inflight) < self.limit.limit and not self._halted():
            gate = self.health.gate()  # None: no limit; 0: paused or down; 1: one probe
            if gate == 0:
                return
            job = self._pick()
            if job is None:
                self.admission.fill()  # the ready queues ran dry: admit more conversations
                job = self._pick()
                if job is None:
                    return
            self._launch(job, probe=gate == 1)

    def _halted(self) -> bool:
        """No new requests: stopping, failing, or the store cannot take answers now."""
        return self.stop.halted or bool(self.writer.problem or self.store_guard.holding)

    async def _dispatch(self) -> None:
        """Keep the limit's worth of requests in flight until there is nothing left to do,
        a stop was asked, or a fatal error happened."""
        self._running = True
        try:
            await self._dispatch_loop()
        finally:
            self._running = False

    async def _dispatch_loop(self) -> None:
        while not self.stop.halted:
            if self.health.expired():
                self.request_stop(self.health.stop_reason(), kind="unreachable")
                break
            due_in = self._release_due()
            more = self.admission.fill()
            self._top_up()
            if self.stop.halted:
                break
            if not self.inflight and not self._has_work():
                break
            if more:
                await asyncio.sleep(0)  # let sockets run, then read more rows
                continue
            self._wake.clear()
            timeout = 1.0 if due_in is None else min(1.0, max(due_in, 0.001))
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    # -- one attempt ----------------------------------------------------------------------------
    async def _attempt(self, job: Job) -> None:
        started = time.time()
        try:
            if self.batch is not None:
                resp = await self.batch.answer(job)
            elif self.tokens_mode:
                resp = await self.client.complete_tokens(job.body, self.token_api)
            else:
                resp = await self.client.chat(job.body)
        except ApiError as err:
            failures.on_error(self, job, err)
        except asyncio.CancelledError:
            self.record_attempt(attempts.cancelled(self.session_id, job, started))
            raise
        except Exception as exc:  # noqa: BLE001 - a client bug: count it and retry
            log.exception("unexpected client failure")
            failures.on_error(self, job, ApiError("connection",
                                                  f"unexpected client failure: {exc!r}"))
        else:
            charge, pstats = self._charged(job, resp)
            if self.answers.at_once(resp):
                done = self.answers.process(job, resp, charge)
            else:  # judged off the loop, or after the answer that is
                done = await uncancelled(self.answers.judge(job, resp, charge))
            self._on_answer(job, resp, charge, pstats, done)

    def record_attempt(self, record: AttemptRecord) -> None:
        self.stats.attempts += 1
        self.writer.batch.attempts.append(record)

    # -- answers: the pipeline decides, the engine carries it out --------------------------------
    def _charged(self, job: Job, resp: ChatResponse) -> tuple[Charge, ProviderStats]:
        charge = self.budget.charge_usage(job.ds.name, resp.usage, bad=bool(resp.usage_warnings),
                                          worst_case=job.max_tokens, live=job.live)
        pstats = self.stats.billed(resp.provider, charge.prompt_tokens,
                                   charge.completion_tokens, charge.cost_usd)
        self.limits.on_answer(job, resp.provider)
        return charge, pstats

    def _on_answer(self, job: Job, resp: ChatResponse, charge: Charge, pstats: ProviderStats,
                   done: Processed) -> None:
        for n in done.answer.notes:
            (self.events.once if n.once else self.events.counted)(
                n.kind, job.ds.name, resp.provider, n.message)
        for decision in done.decisions:
            self.steering.carry_out(decision)
        self._rejudged(done.rejudged)  # samples stored pending, now judged
        outcome = done.outcome
        if isinstance(outcome, Kept):
            self._keep(job, resp, charge, outcome, pstats)
        elif isinstance(outcome, Quarantined):
            self._quarantine(job, resp, charge, outcome, pstats)
        elif isinstance(outcome, Fatal):
            self.stop.fail(outcome.message, dataset=job.ds.name, provider=resp.provider)
            if outcome.rejected is not None:
                self._reject(job, resp, charge, outcome.rejected, pstats)
        else:
            self._reject(job, resp, charge, outcome, pstats)

    def _rejudged(self, changes) -> None:
        """Carry out the final verdicts of samples stored pending (`answer.rejudge`): the
        store's rows, and the live counts that follow them."""
        for c in changes:
            if c.quarantine is None:
                self.writer.batch.verdicts[c.task] = c.verdict
            else:
                self.writer.batch.moved[c.task] = c.quarantine
            if c.this_session:  # the session's own figures counted it as it was stored
                self.stats.rejudged(c.provider, c.before, c.after,
                                    c.quarantine.reason if c.quarantine else None)
            ds = self.by_name.get(c.dataset)
            if c.quarantine is None:
                continue
            if ds is not None:  # (loaded from the store, earlier sessions' too)
                ds.bump("done", -1)
                ds.bump("quarantined")

    def _keep(self, job: Job, resp: ChatResponse, charge: Charge, kept: Kept,
              pstats: ProviderStats) -> None:
        pstats.checks[kept.count_check] += 1
        pstats.ok += 1
        if resp.ended_at:
            pstats.latency.add(resp.ended_at - resp.started_at)
        pstats.repairs.update(kept.repairs)
        self.limits.on_kept(self.inflight_weight, len(self.inflight))
        self.record_attempt(attempts.answered(self.session_id, job, resp, charge, "ok"))
        self.writer.batch.results.append(kept.record)
        self.stats.answers += 1
        self.book.task_done(job, kept.message)

    def _quarantine(self, job: Job, resp: ChatResponse, charge: Charge, q: Quarantined,
                    pstats: ProviderStats) -> None:
        pstats.quarantined += 1
        self.stats.quarantines[q.reason.split(":", 1)[0]] += 1
        self.record_attempt(attempts.answered(
            self.session_id, job, resp, charge, f"quarantined:{q.reason}",
            error=q.message[:2000] or None))
        self.writer.batch.quarantine.append(quarantine_record(job, resp, q))
        self.book.task_quarantined(job, q.reason)

    def _reject(self, job: Job, resp: ChatResponse, charge: Charge, r: Rejected,
                pstats: ProviderStats) -> None:
        pstats.rejected += 1
        self.stats.rejections[r.reason] += 1
        self.record_attempt(attempts.answered(self.session_id, job, resp, charge,
                                               f"rejected:{r.reason}", error=r.what))
        job.last_error = f"answer from {r.what} rejected: {r.reason}"
        self.events.once("rejected", job.ds.name, resp.provider, job.last_error)
        self.book.retry_or_fail(job, "rejected")

    # -- the session ----------------------------------------------------------------------------
    async def run(self, on_tick=None) -> Outcome:
        self.events.add("session_start", None, None, ", ".join(
            f"{d.name} at row {d.rows_read}" for d in self.datasets))
        ticker = asyncio.get_running_loop().create_task(periodic.tick(self, on_tick))
        try:
            await self._dispatch()
            while not self.stop.halted and await self._redo():
                await self._dispatch()  # the redo's tasks, by the providers that remain
            await self.stop.drain(self.inflight)
        finally:
            ticker.cancel()
            try:
                await ticker
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            await self.writer.wait_idle()
        changes, decisions = self.answers.settle()  # no sample left pending
        self._rejudged(changes)
        for decision in decisions:
            self.steering.carry_out(decision)
        await periodic.settle_store(self)
        return self._finish()

    async def _redo(self) -> bool:
        """The work is done: the samples of providers excluded meanwhile are made again
        (engine.redo, `[quality] redo_excluded`); False when there is none to redo. Each
        conversation is redone at most once a session."""
        if (self.cfg.quality.redo_excluded is False or self.cfg.endpoint.mode == "batch"
                or not self.policy.excluded or self.inflight):
            return False
        await self.writer.wait_idle()
        if not self.writer.flush():  # every answer in the store before it is judged
            return False
        try:
            return loading.redo_in_session(self, self._redone)
        except StoreWriteError as exc:  # nothing of it was written: the next start makes it
            log.error("the redo of excluded providers' work could not be written (%s); the "
                      "next run makes it", exc)
            return False

    def _finish(self) -> Outcome:
        for ds in self.datasets:
            self.book.refresh_state(ds)
        outcome = session_outcome(self.datasets, self.stop, self.failed_by_class())
        outcome = judged(outcome, judge(self.store, [d.name for d in self.datasets],
                                        self.cfg.quality.min_kept_share).verdict)
        self.final_state = outcome.state
        self.events.add("session_end", None, None, f"{outcome.state}: {outcome.stop_reason}")
        self.book.stage_datasets(self.datasets)
        self.steering.save_alarms()  # the alarm windows run across sessions (quality.memory)
        self.writer.batch.session = (time.time(), outcome.state, outcome.stop_reason,
                                     time.time(), self.session_id)
        if not self.writer.flush():
            log.error("could not record the end of the session in the store")
        figures.write_live_file(self, self.run_dir)
        return outcome

    def failed_by_class(self) -> dict[str, int]:
        """Failed tasks of the configured datasets by error class (every session's)."""
        return {k: v for k, v in self.failed_classes.items() if v > 0}
