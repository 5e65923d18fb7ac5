"""The scheduler: one asyncio loop keeping `concurrency` requests in flight.

Work flows dataset by dataset (in listed order, or interleaved by weight): rows are read lazily
and admitted as conversations only while fewer than `admit_window x concurrency` are open, each
conversation yields one task at a time (its next turn, from the planner), and a task is tried
until it is done, failed or quarantined. Everything is recorded through the batched writer;
see docs/engine.md for the whole story (retries, budgets, policy, stopping, resume).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import time
from array import array
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson

from ..client.retry import backoff_delay
from ..client.types import ApiError, ChatResponse
from ..config import RunConfig
from ..conversation import AssistantMessage, Conversation
from ..display import UNKNOWN_PROVIDER, clean_floats
from ..quality.alarms import Alarm
from ..quality.monitor import QualityMonitor
from ..quality.observe import Observation
from ..quality.policing import Exclusion
from ..quality.repairs import candidates as repair_candidates
from ..quality.repairs import count_repair, dedup_repair, prompt_repair
from ..quality.witness import CountWitness, Verdict
from ..render import Renderer, RenderError
from ..render.serving import history_as_served, may_be_served_differently, reserialized_history
from ..request import request_dialect, with_max_tokens
from ..sampling import sample_settings
from ..store import Store, encode_tool_matches, pack_ids, pack_json, unpack_json
from .budget import Budget
from .concurrency import AdaptiveLimit
from .control import clear_control, read_control
from .inflight_budget import InFlightBudget
from .model_check import ModelCheck
from .outage import EndpointHealth
from .outcome import Outcome, decide
from .policy import ProviderPolicy
from .progress import (
    EtaEstimator,
    RowCounter,
    dataset_figures,
    plan,
    rows_total,
    run_eta,
    tasks_of_closed,
)
from .providers import META_KEY, encode_excluded, pending_requests, read_excluded
from .retry import RetryPolicy
from .shard import Shard
from .stages import Stages
from .state import Conv, DsRun, Job
from .stats import RunStats
from .status_queries import failed_tasks_by_class, vouched_deltas
from .store_guard import StoreGuard, rescue_results
from .writer import StoreWriter

log = logging.getLogger("specgen.engine")

LIVE_FILE = "live.json"  # figures of the running session, for `specgen status`
REJECTION_BREAKER = 100  # consecutive policy rejections that stop the run (a bad policy)
SEEN_CAP = 500_000  # conversation ids remembered per dataset and session for dedupe
ADMIT_CHUNK = 64  # conversations admitted per pass (keeps the loop responsive)
READ_CHUNK = 2048  # rows read per pass at most (rows of other shards, duplicates...)


_END = object()  # the source has no (more) rows


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
        self.cfg = cfg
        self.store = store
        self.reader = reader or store  # a second connection for reads during threaded commits
        self.client = client
        self.renderer = renderer
        # the renderer of a thinking mode (a dataset's reasoning mix may turn it off or on)
        self.renderer_for = renderer_for or (lambda _thinking: renderer)
        self.stages = stages
        self.policy = policy
        self.budget = budget
        self.session_id = session_id
        self.shard = shard
        # build_request picks its dialect from a base URL; None = the configured first URL
        self.dialect_url = dialect_url
        ep = cfg.endpoint
        self.tokens_mode = ep.tokens_mode and stages.build_token_request is not None
        self.token_api = ep.token_api_name
        self.drain_timeout = cfg.engine.drain_timeout if drain_timeout is None else drain_timeout
        self.limit = AdaptiveLimit(ep.concurrency, ep.min_concurrency,
                                   enabled=ep.adaptive_concurrency)
        eng = cfg.engine
        self.retry_policy = RetryPolicy(ep, retry_after_cap=eng.retry_after_cap,
                                        shrink_max_tokens=cfg.budget.shrink_max_tokens)
        self.health = EndpointHealth(outage_timeout=eng.outage_timeout,
                                     probe_max=ep.outage_probe_max)
        self.spend_window = InFlightBudget("usd" if budget.prices.known else "tokens")
        self.model_check = ModelCheck(cfg.target.model, ep.accept_models)
        self.witness = CountWitness()
        self.quality = QualityMonitor(cfg.quality)  # policing and alarms (they decide)
        self.alarms_fired: list[dict[str, Any]] = []
        # exclusions reach the API as provider.ignore (OpenRouter's routing, the simulator's)
        self.routes_providers = (not self.tokens_mode
                                 and request_dialect(cfg, dialect_url) == "openrouter")
        self.inflight_weight = 0.0
        self.stop_kind: str | None = None  # user | account | unreachable | store
        self.failed_classes: Counter[str] = Counter()  # failed tasks by class, all sessions
        self.window = max(1, int(cfg.engine.admit_window * ep.concurrency))
        self.writer = StoreWriter(store, interval=cfg.engine.commit_interval,
                                  max_rows=cfg.engine.commit_rows, threaded=threaded_commits)
        self.store_guard = StoreGuard(self.writer, store, ballast=ballast,
                                      timeout=cfg.engine.store_error_timeout)
        self.stats = RunStats()
        self.eta = EtaEstimator()  # fed the tasks ended so far at every tick
        self.row_counters: dict[str, RowCounter] = {}  # dataset -> its source's row count
        self.datasets: list[DsRun] = []
        self.by_name: dict[str, DsRun] = {}
        self.weighted = any(d.weight is not None for d in cfg.datasets)
        self.inflight: dict[asyncio.Task, Job] = {}
        self._bg: set[asyncio.Task] = set()  # source openers
        self.retries: list[tuple[float, int, Job]] = []  # heap of (due, seq, job)
        self._seq = itertools.count()
        self.open_convs = 0
        self._next_conv = 0
        self._next_task = 0
        self._wake = asyncio.Event()
        self._stop_now = asyncio.Event()
        self.stopping: str | None = None  # None | "drain" | "now"
        self.stop_reason: str | None = None
        self.fatal: str | None = None  # why the run must stop (fatal error, bad row)
        self.events_logged: set[tuple[str, str]] = set()
        self.rejected_in_a_row = 0
        self.final_state: str | None = None  # set when the session ends
        self._running = False  # dispatching (finished attempts top up the slots)
        self.started_at = time.time()

    # ---------------------------------------------------------------------------------------
    # loading (resume)
    def load(self, *, retry_failed: bool = False) -> None:
        """Rebuild the in-memory state from the store: cursors, counters, open conversations."""
        store, cfg = self.store, self.cfg
        if retry_failed:
            n = store.reset_failed_tasks([d.name for d in cfg.datasets])
            if n:
                log.info("--retry-failed: %d failed task(s) made pending again", n)
        table = store.datasets_table()
        self.failed_classes.update({k: v["count"] for k, v in failed_tasks_by_class(
            store, [d.name for d in cfg.datasets]).items()})
        for provider, dp, dc in vouched_deltas(store):
            self.witness.seed(provider, dp, dc)
        for name, info in read_excluded(store.meta()).items():
            self.policy.exclude(name, info)
            self.quality.policing.mark(name, True)
        if self.policy.excluded:
            log.warning("excluded providers (from earlier sessions): %s; `specgen provider %s "
                        "--allow NAME` puts one back", ", ".join(self.policy.excluded),
                        store.path.parent)
            self._check_routable()
        task_counts = store.task_counts()
        conv_counts = store.conversation_counts()
        spend = store.spend()
        for pos, dcfg in enumerate(cfg.datasets):
            old = table.get(dcfg.name, {})
            ds = DsRun(cfg=dcfg, position=pos, max_tokens=cfg.max_tokens_for(dcfg),
                       config_hash=cfg.dataset_result_hash(dcfg))
            ds.rows_read = old.get("rows_read", 0)
            ds.rows_invalid = old.get("rows_invalid", 0)
            ds.rows_duplicate = old.get("rows_duplicate", 0)
            ds.rows_other_shard = old.get("rows_other_shard", 0)
            # A source read to its end before is read again from its cursor: rows appended
            # since then are picked up (skipping the rows read costs little, in a thread).
            ds.exhausted = False
            ds.tasks = dict(task_counts.get(dcfg.name, {}))
            ds.convs_by_status = dict(conv_counts.get(dcfg.name, {}))
            ds.conversations = sum(ds.convs_by_status.values())
            ds.prompts = (ds.conversations if dcfg.n == 1
                          else store.prompts_admitted(dcfg.name))
            ds.stored_at_start = ds.conversations > 0
            s = spend.get(dcfg.name, {})
            self.budget.add_dataset(
                dcfg.name, dcfg.token_budget, prompt_tokens=int(s.get("prompt_tokens", 0)),
                completion_tokens=int(s.get("completion_tokens", 0)),
                cost_usd=float(s.get("cost_usd", 0.0)))
            self.datasets.append(ds)
            self.by_name[dcfg.name] = ds
        # Spend of datasets no longer in the config still counts against the run's dollar cap.
        for name, s in spend.items():
            if name not in self.by_name and name is not None:
                self.budget.cost_usd += float(s.get("cost_usd", 0.0))
        self._next_conv = store.max_id("conversations")
        self._next_task = store.max_id("tasks")
        for cid, dsname, _conv_id, row_index, status, data in store.open_conversations():
            ds = self.by_name.get(dsname)
            if ds is None:
                continue  # dataset removed from the config: left as it is
            conv = Conv(id=cid, ds=ds, conv=Conversation.from_json(unpack_json(data)),
                        row_index=row_index, status=status)
            conv.answers = {t: AssistantMessage.from_openai(m)
                            for t, m in store.answers_of(cid).items()}
            self.open_convs += 1
            ds.open += 1
            self._advance(conv, known_tasks=store.tasks_of(cid))
        for ds in self.datasets:
            self._refresh_state(ds)
            self.row_counters[ds.name] = RowCounter(ds.cfg.path, ds.cfg.split)

    def progress(self) -> dict[str, Any]:
        """Planned requests and progress per dataset, and the ETA over all of them."""
        plans = {ds.name: plan(dataset_figures(ds, self.budget.datasets[ds.name], rows_total(
            ds, self.row_counters.get(ds.name)))) for ds in self.datasets}
        eta, lower = run_eta(list(plans.values()), self.eta)
        return {"plans": plans, "eta_s": eta, "eta_lower_bound": lower,
                "rows_total": {ds.name: rows_total(ds, self.row_counters.get(ds.name))
                               for ds in self.datasets}}

    # ---------------------------------------------------------------------------------------
    # admission
    def _admissible(self) -> list[DsRun]:
        """Datasets that may take new conversations now, in the order to take them."""
        live = [d for d in self.datasets if d.can_admit()]
        if not live:
            return []
        if self.weighted:
            return sorted(live, key=lambda d: (d.admitted_session / d.weight, d.position))
        return live[:1]

    def _fill(self) -> bool:
        """Admit conversations until the window is full or no dataset can take more, a few
        chunks per call. True when more could be admitted right away (call again soon)."""
        if self.stopping or self.fatal:
            return False
        for _ in range(4):
            if self.open_convs >= self.window:
                return False
            candidates = self._admissible()
            if not candidates:
                return False
            ds = candidates[0]
            self._admit(ds, min(ADMIT_CHUNK, self.window - self.open_convs))
            if self.fatal or ds.opening:
                return False  # the opener wakes the loop when the source is ready
        return self.open_convs < self.window and bool(self._admissible())

    def _admit(self, ds: DsRun, want: int) -> int:
        """Read rows of `ds` until `want` conversations are admitted (or READ_CHUNK rows)."""
        if ds.limit_hit():
            self._set_state(ds, "limit_reached", f"limit of {ds.cfg.limit} conversations reached")
            return 0
        if ds.rows is None:
            if not ds.opening:
                ds.opening = True
                opener = asyncio.get_running_loop().create_task(self._open_rows(ds))
                self._bg.add(opener)
                opener.add_done_callback(self._bg.discard)
            return 0
        admitted = 0
        writer = self.writer
        for _ in range(READ_CHUNK):
            try:
                if ds.lookahead is not None:
                    row, ds.lookahead = ds.lookahead, None
                    if row is _END:
                        raise StopIteration
                else:
                    row = next(ds.rows)
            except StopIteration:
                ds.exhausted = True
                ds.dirty = True
                self._refresh_state(ds)
                break
            except Exception as exc:  # noqa: BLE001 - an unreadable source stops the run
                self.fatal = f"dataset {ds.name!r}: cannot read {ds.cfg.path}: {exc}"
                log.error("%s", self.fatal)
                break
            if row.error is not None:
                err = row.error
                where = f"{err.file}:{err.line}" if err.line is not None else f"{err.file}"
                if not ds.cfg.skip_invalid:
                    self.fatal = (
                        f"invalid row in dataset {ds.name!r} at {where} (row {row.index}): "
                        f"{err.reason} — fix the row or set skip_invalid = true for this dataset"
                    )
                    self._event("invalid_row", ds.name, None, self.fatal)
                    break
                ds.rows_read = row.index + 1
                ds.rows_invalid += 1
                ds.dirty = True
                writer.batch.invalid_rows.append((ds.name, row.index, err.line, err.reason))
                continue
            ds.rows_read = row.index + 1
            ds.dirty = True
            conv: Conversation = row.conversation
            if self.shard is not None and not self.shard.owns(conv.id):
                ds.rows_other_shard += 1
            elif self._seen_before(ds, conv.id):
                ds.rows_duplicate += 1
            else:
                self._new_conversation(ds, conv, row.index)
                admitted += 1
            if ds.limit_hit():
                self._set_state(ds, "limit_reached",
                                f"limit of {ds.cfg.limit} conversations reached")
                break
            if admitted >= want:
                break
        return admitted

    async def _open_rows(self, ds: DsRun) -> None:
        """Open the dataset's source at its cursor in a worker thread: skipping millions of
        rows already read must not stall the loop (or the heartbeat)."""
        def open_source():
            rows = iter(self.stages.iter_rows(ds.cfg, start=ds.rows_read,
                                              renderer=self.cfg.target.renderer))
            return rows, next(rows, _END)

        try:
            ds.rows, ds.lookahead = await asyncio.to_thread(open_source)
        except Exception as exc:  # noqa: BLE001 - a source that cannot be opened stops the run
            self.fatal = self.fatal or f"dataset {ds.name!r}: cannot read {ds.cfg.path}: {exc}"
            log.error("%s", self.fatal)
        finally:
            ds.opening = False
            self._wake.set()

    def _seen_before(self, ds: DsRun, conv_id: str) -> bool:
        """Dedupe: is (dataset, conv_id) already admitted? Conversations of this session are
        remembered in a set (no query per row); earlier sessions' are looked up in the store.
        A very large session falls back to the store for everything."""
        seen = ds.seen
        if seen is not None:
            if conv_id in seen:
                return True
            if ds.stored_at_start and self.reader.has_conversation(ds.name, conv_id):
                return True
            if len(seen) >= SEEN_CAP:
                ds.seen = None  # from now on: uncommitted ones + the store
            else:
                seen.add(conv_id)
            return False
        return (self.writer.has_uncommitted_conv(ds.name, conv_id)
                or self.reader.has_conversation(ds.name, conv_id))

    def _new_conversation(self, ds: DsRun, conv: Conversation, row_index: int) -> None:
        """Admit a source row: its conversation, and with `n` > 1 its copies (sample k has id
        `<id>#k` and meta `sample`), each a conversation of its own with its own draws."""
        ds.prompts += 1
        for k in range(ds.cfg.n):
            copy = conv if k == 0 else Conversation(
                id=f"{conv.id}#{k}", messages=conv.messages, tools=conv.tools,
                meta={**conv.meta, "sample": k, "source_id": conv.id})
            self._next_conv += 1
            c = Conv(id=self._next_conv, ds=ds, conv=copy, row_index=row_index,
                     status="pending")
            self.writer.batch.conversations.append(
                (c.id, ds.name, copy.id, row_index, "pending", None, pack_json(copy.to_json())))
            self.writer.uncommitted_convs.add((ds.name, copy.id))
            ds.conversations += 1
            ds.admitted_session += 1
            ds.conv_bump("pending")
            ds.open += 1
            self.open_convs += 1
            self._advance(c)

    # ---------------------------------------------------------------------------------------
    # conversation progress
    def _advance(self, c: Conv, known_tasks: dict[int, tuple] | None = None) -> None:
        """Ask the planner for the conversation's next request; queue it or close the
        conversation. `known_tasks` (resume): {turn: (id, status, attempts, error)}."""
        try:
            step = self.stages.next_request(c.conv, c.answers, c.ds.cfg.turns,
                                            tool_results=c.ds.cfg.tool_results)
        except Exception as exc:  # noqa: BLE001 - a planner bug must not kill the run
            log.exception("planner failed on conversation %s", c.conv.id)
            self._close(c, "failed", f"planner_error: {exc}")
            return
        if isinstance(step, self.stages.end):
            self._close(c, "ended" if step.reason else "done", step.reason)
            return
        known = (known_tasks or {}).get(step.turn)
        if known is not None:
            task_id, status, attempts, error = known
            if status == "failed":
                self._close(c, "failed", f"failed: {error}")
                return
            if status == "quarantined":
                self._close(c, "ended", error or "quarantined")
                return
            if status == "done":  # a result without its answer cannot happen; be safe
                self._close(c, "failed", "inconsistent: task done without a result")
                return
        else:
            task_id, attempts = None, 0
        try:
            settings = sample_settings(self.cfg, c.ds.cfg, c.conv.id, step.turn,
                                       sample=int(c.conv.meta.get("sample", 0)))
            renderer = self.renderer_for(settings.thinking)
            # the history as the serving stack renders it (render.serving); the request body
            # still carries the messages as given: the server does this itself
            serving = self.cfg.target.serving
            served = history_as_served(step.messages, serving,
                                       renderer.content_format(serving))
            history = step.messages if served is None else served
            prompt_ids = array("I", renderer.prompt_ids(history, step.tools))
            if self.tokens_mode:  # the prompt travels as our ids: no template on the server
                body = self.stages.build_token_request(self.cfg, c.ds.cfg, prompt_ids,
                                                       renderer.stop_token_ids,
                                                       settings=settings)
            else:
                body = self.stages.build_request(self.cfg, c.ds.cfg, step,
                                                 base_url=self.dialect_url, settings=settings)
        except (RenderError, ValueError, TypeError, KeyError) as exc:
            reason = f"render_error: {exc}" if isinstance(exc, RenderError) else f"request_error: {exc}"
            if task_id is None:
                task_id = self._new_task_id()
            self._task_row(task_id, c, step.turn, "failed", attempts, reason)
            c.ds.bump("failed")
            self.failed_classes[reason.split(":", 1)[0]] += 1
            self._close(c, "failed", reason)
            return
        if task_id is None:
            task_id = self._new_task_id()
            self._task_row(task_id, c, step.turn, "pending", 0, None)
            c.ds.bump("pending")
        job = Job(task_id=task_id, conv=c, turn=step.turn, messages=list(history),
                  tools=step.tools, body=body, prompt_ids=prompt_ids, attempts=attempts,
                  max_tokens=c.ds.max_tokens, tool_matches=step.tool_matches,
                  settings=settings, renderer=renderer)
        c.ds.ready.append(job)

    def _new_task_id(self) -> int:
        self._next_task += 1
        return self._next_task

    def _task_row(self, task_id: int, c: Conv, turn: int, status: str, attempts: int,
                  error: str | None) -> None:
        self.writer.batch.tasks[task_id] = (task_id, c.id, c.ds.name, turn, status, attempts,
                                            error)

    def _close(self, c: Conv, status: str, reason: str | None) -> None:
        """A conversation is finished: done (normally), ended (early) or failed."""
        ds = c.ds
        ds.conv_bump(c.status, -1)
        ds.conv_bump(status)
        c.status = status
        self.writer.batch.conv_status[c.id] = (status, reason)
        ds.open -= 1
        self.open_convs -= 1
        ds.closed_convs += 1
        ds.closed_tasks += tasks_of_closed(len(c.answers), status, reason)
        self._refresh_state(ds)

    def _set_status(self, c: Conv, status: str) -> None:
        if c.status != status:
            c.ds.conv_bump(c.status, -1)
            c.ds.conv_bump(status)
            c.status = status
            self.writer.batch.conv_status[c.id] = (status, None)

    def _refresh_state(self, ds: DsRun) -> None:
        if ds.state == "active" and ds.limit_hit():
            self._set_state(ds, "limit_reached", f"limit of {ds.cfg.limit} conversations reached")
        if ds.state in ("active", "done") and ds.exhausted:
            finished = ds.open == 0 and not ds.tasks.get("pending")
            self._set_state(ds, "done" if finished else "active", None)

    def _set_state(self, ds: DsRun, state: str, why: str | None) -> None:
        if ds.state == state:
            return
        ds.state = state
        ds.dirty = True
        if why:
            self._event(state, ds.name, None, why)
            log.info("dataset %s: %s", ds.name, why)

    def _drop_ready(self, ds: DsRun) -> None:
        """Forget a blocked dataset's queued jobs (they stay pending in the store) so its
        conversations stop holding the admission window."""
        while ds.ready:
            job = ds.ready.popleft()
            self._forget(job.conv)
        keep = []
        for item in self.retries:
            if item[2].ds is ds:
                self._forget(item[2].conv)
            else:
                keep.append(item)
        if len(keep) != len(self.retries):
            self.retries = keep
            heapq.heapify(self.retries)

    def _forget(self, c: Conv) -> None:
        c.ds.open -= 1
        self.open_convs -= 1

    # ---------------------------------------------------------------------------------------
    # dispatch
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
                    self._drop_ready(ds)  # answers that arrived since: they wait, pending
                continue
            if not ds.ready:
                continue
            job = ds.ready[0]
            verdict = self.budget.check(ds.name, len(job.prompt_ids), job.max_tokens)
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
                self._set_state(ds, "budget_reached",
                                f"token budget of {ds.cfg.token_budget:,} completion tokens "
                                "reached")
            else:
                ds.blocked = "cost"
                self._set_state(ds, "budget_reached",
                                f"run cost cap of ${self.budget.max_cost_usd:g} reached")
            self._drop_ready(ds)
        return None

    def _release_due(self) -> float | None:
        """Move retries whose backoff is over back to the front of their queues; returns the
        time until the next one is due (None when there is none)."""
        now = time.monotonic()
        while self.retries and self.retries[0][0] <= now:
            _, _, job = heapq.heappop(self.retries)
            job.ds.ready.appendleft(job)
        return self.retries[0][0] - now if self.retries else None

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
        job.reservation = self.budget.reserve(ds.name, len(job.prompt_ids), job.max_tokens)
        job.epoch = self.limit.epoch
        job.attempts += 1
        job.probe = probe
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
            self.fatal = self.fatal or f"internal error: {exc!r}"
        if self._running:
            self._top_up()
        self._wake.set()

    def _has_work(self) -> bool:
        if self.retries:
            return True
        if any(ds.ready and ds.blocked is None and ds.paused is None for ds in self.datasets):
            return True
        return bool(self._admissible())

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
                self._fill()  # the ready queues ran dry: admit more conversations
                job = self._pick()
                if job is None:
                    return
            self._launch(job, probe=gate == 1)

    def _halted(self) -> bool:
        """No new requests: stopping, failing, or the store cannot take answers now."""
        return bool(self.stopping or self.fatal or self.writer.problem
                    or self.store_guard.holding)

    async def _dispatch(self) -> None:
        """Keep the limit's worth of requests in flight until there is nothing left to do,
        a stop was asked, or a fatal error happened."""
        self._running = True
        try:
            await self._dispatch_loop()
        finally:
            self._running = False

    async def _dispatch_loop(self) -> None:
        while not (self.stopping or self.fatal):
            if self.health.expired():
                self.request_stop(self.health.stop_reason(), kind="unreachable")
                break
            due_in = self._release_due()
            more = self._fill()
            self._top_up()
            if self.stopping or self.fatal:
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

    # ---------------------------------------------------------------------------------------
    # one attempt
    async def _attempt(self, job: Job) -> None:
        started = time.time()
        try:
            if self.tokens_mode:
                resp = await self.client.complete_tokens(job.body, self.token_api)
            else:
                resp = await self.client.chat(job.body)
        except ApiError as err:
            self._on_error(job, err)
        except asyncio.CancelledError:
            self._attempt_row(job, "cancelled", started=started, error="cancelled by stop --now")
            raise
        except Exception as exc:  # noqa: BLE001 - a client bug: count it and retry
            log.exception("unexpected client failure")
            self._on_error(job, ApiError("connection", f"unexpected client failure: {exc!r}"))
        else:
            self._on_answer(job, resp)

    def _charge(self, job: Job, usage: dict[str, Any]) -> tuple[int, int, float | None]:
        pt = int(usage.get("prompt_tokens") or 0)
        ct = int(usage.get("completion_tokens") or 0)
        reported = usage.get("cost")
        reported = float(reported) if isinstance(reported, int | float) else None
        cost = self.budget.attempt_cost(pt, ct, reported)
        self.budget.charge(job.ds.name, pt, ct, cost)
        self.stats.completion_tokens += ct
        return pt, ct, cost

    def _attempt_row(self, job: Job, outcome: str, *, started: float, base_url=None,
                     provider=None, model=None, first_byte=None, ended=None, status=None,
                     error=None, pt=None, ct=None, cost=None, gen_id=None,
                     first_token=None) -> None:
        self.stats.attempts += 1
        self.writer.batch.attempts.append((
            job.task_id, self.session_id, base_url, provider, model, started, first_byte,
            ended if ended is not None else time.time(), outcome, status, error, pt, ct, cost,
            gen_id, job.ds.name, first_token))

    def _on_error(self, job: Job, err: ApiError) -> None:
        pt, ct, cost = self._charge(job, err.usage)
        kind = err.kind
        d = self.retry_policy.decide(
            err, attempts=job.attempts, max_tokens=job.max_tokens,
            prompt_cost=self.budget.prices.cost(len(job.prompt_ids), 0) or 0.0,
            endpoint_down=self.health.down)
        if not d.counts:
            job.attempts -= 1  # an outage or a full in-flight budget says nothing of the task
        outcome = f"retry:{kind}" if d.action in ("retry", "shrink") else f"fatal:{kind}"
        self._attempt_row(
            job, outcome, started=err.started_at or time.time(), base_url=err.base_url,
            provider=err.provider, model=err.model, first_byte=err.first_byte_at,
            ended=err.ended_at or None, status=err.status, error=str(err)[:2000], pt=pt,
            ct=ct, cost=cost, gen_id=err.generation_id)
        self.stats.errors[kind] += 1
        p = self.stats.provider(err.provider)
        p.requests += 1
        p.errors[kind] += 1
        p.prompt_tokens += pt
        p.completion_tokens += ct
        p.cost_usd += cost or 0.0
        note = self.health.on_failure(kind, job.task_id, str(err)[:300],
                                      responded=err.status is not None, probe=job.probe)
        if note:
            self._event("endpoint", None, err.provider, note)
            log.warning("%s", note)
        if kind == "in_flight_budget":
            if self.spend_window.on_refused(job.weight_before, job.weight):
                self._event("concurrency", None, err.provider, self._budget_note())
                self._log_budget_note()
        elif self.limit.on_error(kind, job.epoch):
            self._event("concurrency", None, err.provider,
                        f"{kind}: concurrency lowered to {self.limit.limit}")
        job.last_error = str(err)[:500]
        if d.action in ("stop_run", "fail_run"):
            self._task_row(job.task_id, job.conv, job.turn, "pending", job.attempts, job.last_error)
            job.ds.ready.appendleft(job)  # stays pending: a later run sends it again
            if d.action == "stop_run":
                if self.stop_kind != "account":
                    self._event("account_limit", job.ds.name, err.provider, d.message)
                    log.error("%s", d.message)
                self.request_stop(d.message, kind="account")
            elif not self.fatal:
                self.fatal = d.message
                self._event("fatal", job.ds.name, err.provider, self.fatal)
                log.error("%s", self.fatal)
            return
        if d.action == "shrink":
            job.shrunk_from = job.shrunk_from or job.max_tokens
            job.max_tokens = d.max_tokens or job.max_tokens
            job.body = with_max_tokens(job.body, job.max_tokens)
            self._event_once("max_tokens_shrunk", job.ds.name, None,
                             f"402 weight_exceeds_budget: retrying with a smaller max_tokens "
                             f"({d.message}); recorded on the sample")
            self._schedule(job, 0.0)
        elif d.action == "retry":
            if d.pause is not None:
                self._pause_endpoint(d.pause, err)
            self._schedule(job, d.delay)
        else:
            self._fail(job, kind, d.message or job.last_error)

    def _budget_note(self) -> str:
        w = self.spend_window
        cap = (f"${w.cap:.4f}" if w.unit == "usd" else f"{w.cap:,.0f} tokens") if w.cap else "-"
        return (f"402 in_flight_budget_exhausted: the account's in-flight budget holds about "
                f"{w.limit_for(self.limit.maximum)} requests like these (estimated cost in "
                f"flight kept under {cap}); concurrency follows it")

    def _log_budget_note(self) -> None:
        now = time.monotonic()
        if now - getattr(self, "_budget_logged", -1e9) >= 30:
            self._budget_logged = now
            log.warning("%s", self._budget_note())

    def _pause_endpoint(self, seconds: float, err: ApiError) -> None:
        """A Retry-After above retry_after_cap: every request waits, visibly."""
        until = time.strftime("%H:%M:%S", time.localtime(time.time() + seconds))
        why = (f"{err.kind} with Retry-After {seconds:.0f}s (above retry_after_cap = "
               f"{self.cfg.engine.retry_after_cap:g}s): all requests paused until {until}")
        if not self.health.pause(seconds, why):
            return
        self._event("endpoint", None, err.provider, why)
        log.warning("%s", why)
        if seconds > self.cfg.engine.outage_timeout:
            self.request_stop(f"the API asks to wait {seconds:.0f}s (until {until}), longer "
                              f"than outage_timeout = {self.cfg.engine.outage_timeout:g}s; "
                              "rerun after then to resume", kind="unreachable")

    def _retry_or_fail(self, job: Job, kind: str) -> None:
        """Retry a rejected or quarantined answer, unless the task is out of attempts."""
        if job.attempts >= self.cfg.endpoint.max_attempts:
            self._fail(job, kind, f"gave up after {job.attempts} attempts; last: {job.last_error}")
            return
        ep = self.cfg.endpoint
        self._schedule(job, backoff_delay(job.attempts, base=ep.retry_base_delay,
                                          cap=ep.retry_max_delay))

    def _schedule(self, job: Job, delay: float) -> None:
        self._task_row(job.task_id, job.conv, job.turn, "pending", job.attempts, job.last_error)
        job.not_before = time.monotonic() + delay
        heapq.heappush(self.retries, (job.not_before, next(self._seq), job))

    def _fail(self, job: Job, kind: str, error: str | None) -> None:
        self.failed_classes[kind] += 1
        reason = f"{kind}: {error}" if error and not error.startswith(kind) else (error or kind)
        self._task_row(job.task_id, job.conv, job.turn, "failed", job.attempts, reason)
        job.ds.bump("pending", -1)
        job.ds.bump("failed")
        self._close(job.conv, "failed", f"failed:{kind}")

    def _on_answer(self, job: Job, resp: ChatResponse) -> None:
        ds = job.ds
        pt, ct, cost = self._charge(job, resp.usage)
        note = self.health.on_answer(probe=job.probe)
        if note:
            self._event("endpoint", None, resp.provider, note)
            log.warning("%s", note)
        provider = resp.provider
        pstats = self.stats.provider(provider)
        pstats.requests += 1
        pstats.prompt_tokens += pt
        pstats.completion_tokens += ct
        pstats.cost_usd += cost or 0.0
        latency = (resp.ended_at - resp.started_at) if resp.ended_at else None
        common = dict(started=resp.started_at or time.time(), base_url=resp.base_url,
                      provider=provider, model=resp.model, first_byte=resp.first_byte_at,
                      first_token=resp.first_token_at, ended=resp.ended_at or None, status=getattr(resp, "http_status", None),
                      pt=pt, ct=ct, cost=cost, gen_id=resp.id)
        rejection = self.policy.rejection(provider, resp.quantization)
        if rejection is None:
            rejection = self.model_check.rejection(resp.model)
        if rejection is not None:
            self._observe(job, resp, "rejected", reason=rejection)
            pstats.rejected += 1
            self.stats.rejections[rejection] += 1
            self.rejected_in_a_row += 1
            what = (f"model {resp.model!r} (asked: {self.cfg.target.model!r})"
                    if rejection == "wrong_model" else f"provider {provider!r}")
            if self.rejected_in_a_row >= REJECTION_BREAKER and not self.fatal:
                fix = ("[endpoint] accept_models, or route to providers that serve the model"
                       if rejection == "wrong_model"
                       else "[endpoint.provider] against the endpoint list")
                self.fatal = (
                    f"the last {self.rejected_in_a_row} answers were all rejected (latest: "
                    f"{what}, {rejection}); every answer is paid for, so the run stops — "
                    f"check {fix}")
                self._event("fatal", ds.name, provider, self.fatal)
                log.error("%s", self.fatal)
            self._attempt_row(job, f"rejected:{rejection}", error=what, **common)
            job.last_error = f"answer from {what} rejected: {rejection}"
            self._event_once("rejected", ds.name, provider, job.last_error)
            self._retry_or_fail(job, "rejected")
            return
        try:
            if self.tokens_mode:
                norm = self.stages.normalize_ids(resp, tools=job.tools, renderer=job.renderer,
                                                 prompt_ids=job.prompt_ids,
                                                 on_length=ds.cfg.on_length)
            else:
                norm = self.stages.normalize(resp, tools=job.tools, renderer=job.renderer,
                                             on_length=ds.cfg.on_length, messages=job.messages)
            message = norm.message
            if getattr(norm, "ids", None) is not None:
                completion = norm.ids  # token-in: the sampled ids are the sample
            elif getattr(norm, "truncated", False) and self.stages.truncated_ids is not None:
                # kept at max_tokens (on_length = "keep"): no stop token was sampled
                completion = self.stages.truncated_ids(job.renderer, norm,
                                                       context=job.messages, tools=job.tools)
            else:
                completion = job.renderer.completion_ids(message, context=job.messages,
                                                          tools=job.tools)
        except self.stages.quarantined as q:
            self._quarantine(job, resp, getattr(q, "reason", None) or str(q), common, pstats,
                             detail=getattr(q, "detail", "") or str(q))
            return
        except RenderError as exc:
            self._quarantine(job, resp, "render_error", common, pstats, detail=str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - one odd answer must not stop the run
            log.exception("normalising an answer from %s failed", provider)
            self._quarantine(job, resp, "normalize_error", common, pstats,
                             detail=f"{type(exc).__name__}: {exc}")
            return
        repairs = list(norm.repairs)
        if self.tokens_mode:
            # exact by construction: the prompt was ours, the ids are the server's. The
            # re-render of the parsed message is what the next turn's history holds.
            resp.prompt_token_ids = list(job.prompt_ids)
            resp.completion_token_ids = completion
            verdict = Verdict("true_ids", "token-in")
            if not getattr(norm, "truncated", False) and job.renderer.completion_ids(
                    message, context=job.messages, tools=job.tools) != completion:
                repairs.append("flag:rerender_differs")
        else:
            verdict = self._witness(job, resp, message, completion,
                                    truncated=bool(getattr(norm, "truncated", False)))
        count_check = verdict.check
        prompt_ids = job.prompt_ids
        if count_check == "repaired":
            if verdict.message is not None:
                message, completion = verdict.message, verdict.ids
            if verdict.prompt_ids is not None:  # the model saw another prompt: that one
                prompt_ids = array("I", verdict.prompt_ids)
            repairs += [f"count:{name}" for name in verdict.repairs]
        if (not self.tokens_mode and resp.prompt_token_ids is not None
                and resp.completion_token_ids is not None):
            # the backend's own ids are the sample; the witness's verdict on ours is kept
            # so that verify can measure the witness against the truth
            repairs.append(f"witness:{count_check}")
            count_check = "true_ids"
        elif count_check == "mismatch" or (count_check == "unverified"
                                           and self.cfg.quality.require_witness):
            reason = "count_mismatch" if count_check == "mismatch" else "no_witness"
            if count_check == "unverified" or self.cfg.quality.on_count_mismatch == "quarantine":
                self._quarantine(job, resp, reason, common, pstats, detail=verdict.detail,
                                 count_check=count_check if verdict.settled else None)
                return
            if self.cfg.quality.on_count_mismatch == "flag":
                self._event_once("count_mismatch", ds.name, provider,
                                 f"answers of {provider!r} contradict its own token counts "
                                 f"({verdict.detail}); kept as count_check = mismatch, left "
                                 "out of exports")
        pstats.checks[count_check] += 1
        self._observe(job, resp, "ok", message=message, repairs=repairs,
                      count_check=count_check if verdict.settled else None)
        self.rejected_in_a_row = 0
        pstats.ok += 1
        if latency is not None:
            pstats.latency.add(latency)
        request = {"messages": job.messages, "tools": job.tools}
        if prompt_ids is not job.prompt_ids:  # the history as the serving stack rendered it
            request["messages"] = verdict.prompt_messages
        if job.shrunk_from is not None:  # sent smaller than configured: say so on the sample
            repairs.append(f"max_tokens_shrunk:{job.shrunk_from}->{job.max_tokens}")
            request["max_tokens"] = job.max_tokens
        pstats.repairs.update(repairs)
        self.limit.on_success()
        self.spend_window.on_success(self.inflight_weight, len(self.inflight))
        self._attempt_row(job, "ok", **common)
        msg_json = message.to_openai()
        usage = resp.usage or {}
        details = usage.get("completion_tokens_details") or {}
        input_ids = prompt_ids + array("I", completion)
        self.writer.batch.results.append((
            job.task_id, job.conv.id, ds.name, job.turn, provider, resp.model,
            resp.finish_reason, resp.native_finish_reason,
            pack_json(request),
            orjson.dumps(msg_json).decode(), pack_ids(input_ids), len(prompt_ids),
            pack_ids(resp.prompt_token_ids) if resp.prompt_token_ids is not None else None,
            pack_ids(resp.completion_token_ids) if resp.completion_token_ids is not None else None,
            pt, ct, details.get("reasoning_tokens") if isinstance(details, dict) else None,
            cost, orjson.dumps(repairs).decode(), latency, time.time(), count_check,
            encode_tool_matches(job.tool_matches),
            resp.quantization or self.policy.declared_quantization(provider),
            orjson.dumps(job.settings.to_json()).decode() if job.settings else None))
        self._task_row(job.task_id, job.conv, job.turn, "done", job.attempts, None)
        ds.bump("pending", -1)
        ds.bump("done")
        self.stats.answers += 1
        c = job.conv
        c.answers[job.turn] = message
        self._set_status(c, "active")
        self._advance(c)
        if c.ds.ready and c.ds.ready[-1].conv is c:
            # continue this conversation before starting new ones
            c.ds.ready.rotate(1)

    def _witness(self, job: Job, resp: ChatResponse, message, completion, *, truncated: bool):
        """What the provider's own counts say of this sample (quality.witness)."""
        if not self.cfg.quality.count_witness:
            return Verdict("unverified", "count witness off ([quality] count_witness)")
        repair = None
        restyled = repair_candidates(message)
        if truncated or not (restyled or resp.duplicates):
            # nothing a provider could have transformed (or a cut answer): a plain answer
            if truncated:
                return Verdict("unverified", "cut at max_tokens: counts not judged")
        else:
            def render(m):
                return job.renderer.completion_ids(m, context=job.messages, tools=job.tools)

            def rebuild(candidate):
                try:
                    m = self.stages.normalize(candidate, tools=job.tools, renderer=job.renderer,
                                              on_length=job.ds.cfg.on_length,
                                              messages=job.messages).message
                except Exception:  # noqa: BLE001 - quarantined, unrenderable or a normaliser
                    return None  # bug: no candidate (the answer itself was normalised fine)
                return m, render(m)

            def repair(target: int):
                fits = [fix for fix in (
                    count_repair(message, target, render) if restyled else None,
                    dedup_repair(resp, target, rebuild) if resp.duplicates else None)
                    if fix is not None]
                if fits and all(f[1] == fits[0][1] for f in fits):
                    return fits[0]  # one result, however it is reached
                return None  # none, or two that fit with other ids: ambiguous
        prompt_fix = None
        chosen: list = []
        candidates = self._served_candidates(job)
        if candidates:  # a history a serving stack would render otherwise: not a plain prompt
            def prompt_fix(target: int):
                fit = prompt_repair(candidates, target,
                                    lambda msgs: job.renderer.prompt_ids(msgs, job.tools))
                if fit is None:
                    return None
                chosen.append(fit[2])
                return fit[0], fit[1]
        key = resp.provider or resp.base_url or UNKNOWN_PROVIDER
        verdict = self.witness.judge(key, prompt=len(job.prompt_ids), completion=len(completion),
                                     usage=resp.usage or {}, repair=repair,
                                     prompt_repair=prompt_fix)
        if chosen and verdict.prompt_ids is not None:
            verdict.prompt_messages = chosen[-1]
        if verdict.check == "exact" and resp.duplicates and dedup_repair(
                resp, len(completion), rebuild) is not None:
            # a repeated event whose text does not change the count: with it or without it
            # the counts agree, so they cannot vouch for either
            return Verdict("unverified", "a repeated stream event the counts cannot judge "
                                         "(they agree with and without it)")
        if verdict.check == "unverified" and self.witness.unusable(key):
            self._event_once("counts_unusable", job.ds.name, resp.provider,
                             f"{key}'s token counts never settle on a constant offset against "
                             "ours: they are no witness, its samples are unverified")
        return verdict

    def _served_candidates(self, job: Job) -> list[tuple[str, list]]:
        """The histories a hosted provider's stack may have rendered instead of ours (render.
        serving), each named as its repair, when it renders other text than ours."""
        messages = job.messages
        if not may_be_served_differently(messages):
            return []
        out = []
        if (args := reserialized_history(messages)) is not None:
            out.append(("history_reserialized", args))
        for stack in ("vllm", "sglang"):
            served = history_as_served(messages, stack, job.renderer.content_format(stack))
            if served is not None:
                out.append((f"history_served_{stack}", served))
        if not out:
            return []
        text = job.renderer.render_text
        ours = text(messages, job.tools, add_generation_prompt=True)
        return [(n, m) for n, m in out
                if text(m, job.tools, add_generation_prompt=True) != ours]

    def _quarantine(self, job: Job, resp: ChatResponse, reason: str, common: dict,
                    pstats, detail: str = "", count_check: str | None = None) -> None:
        ds = job.ds
        self._observe(job, resp, "quarantined", reason=reason, count_check=count_check)
        pstats.quarantined += 1
        self.stats.quarantines[reason.split(":", 1)[0]] += 1
        self._attempt_row(job, f"quarantined:{reason}", error=detail[:2000] or None, **common)
        self.writer.batch.quarantine.append((
            job.task_id, ds.name, resp.provider, reason, pack_json(_response_json(resp)),
            time.time()))
        if job.quarantines < self.cfg.endpoint.quarantine_retries:
            job.quarantines += 1
            job.last_error = f"quarantined: {reason}"
            self._retry_or_fail(job, "quarantined")
            return
        self._task_row(job.task_id, job.conv, job.turn, "quarantined", job.attempts,
                       f"quarantined:{reason}")
        ds.bump("pending", -1)
        ds.bump("quarantined")
        self._close(job.conv, "ended", f"quarantined:{reason}")

    # ---------------------------------------------------------------------------------------
    # quality: the monitor decides, the engine carries it out
    def _observe(self, job: Job, resp: ChatResponse, outcome: str, *, reason: str | None = None,
                 message: AssistantMessage | None = None, repairs: list[str] = (),
                 count_check: str | None = None) -> None:
        obs = Observation.of_answer(
            provider=resp.provider, dataset=job.ds.name, task=job.task_id, outcome=outcome,
            reason=reason, tools_offered=bool(job.tools), content=resp.content,
            reasoning=resp.reasoning, api_calls=bool(resp.tool_calls),
            message_calls=None if message is None else bool(message.tool_calls),
            repairs=repairs, count_check=count_check, finish_reason=resp.finish_reason,
            quantization_mismatch=self.policy.quantization_mismatch(resp.provider,
                                                                    resp.quantization),
            after_tool_result=bool(job.messages) and job.messages[-1].get("role") == "tool")
        for decision in self.quality.observe(obs):
            if isinstance(decision, Exclusion):
                self._exclude(decision.provider, "auto", decision.message, decision.to_json())
            elif isinstance(decision, Alarm):
                self._alarm(decision)

    def _exclude(self, name: str, by: str, reason: str,
                 figures: dict[str, Any] | None = None) -> None:
        """Leave a provider out from now on: provider.ignore on every request, its answers
        rejected, recorded in the store (a resumed run keeps it out)."""
        if self.policy.is_excluded(name):
            return
        info: dict[str, Any] = {"by": by, "reason": reason, "at": time.time()}
        if figures:
            info["figures"] = figures
        self.policy.exclude(name, info)
        self.quality.policing.mark(name, True)
        self.writer.batch.meta[META_KEY] = encode_excluded(self.policy.excluded)
        self._event("provider_excluded", None, name, reason)
        log.warning("%s; `specgen provider %s --allow %s` puts it back", reason,
                    self.store.path.parent, name)
        self._check_routable()

    def _allow(self, name: str) -> None:
        key = self.policy.allow(name)
        if key is None:
            log.warning("specgen provider --allow %s: no such provider is excluded", name)
            return
        self.quality.policing.mark(key, False)
        self.writer.batch.meta[META_KEY] = encode_excluded(self.policy.excluded)
        self._event("provider_allowed", None, key, "specgen provider --allow")
        log.warning("provider %r allowed back (specgen provider --allow)", key)
        self._wake.set()

    def _check_routable(self) -> None:
        """Stop when the exclusions leave no endpoint the policy allows."""
        if self.policy.endpoints and not self.policy.allowed_endpoints():
            self.request_stop(
                f"every provider the policy allows is excluded ({', '.join(self.policy.excluded)}"
                f"); `specgen provider {self.store.path.parent} --allow NAME` puts one back",
                kind="quality")

    def _alarm(self, alarm: Alarm) -> None:
        action = self.cfg.quality.on_alarm
        self.alarms_fired.append({**alarm.to_json(), "action": action, "at": time.time()})
        self._event("alarm", alarm.dataset, None, f"{alarm.message} (on_alarm = {action})")
        if action == "warn":
            log.warning("%s (on_alarm = warn: the run goes on)", alarm.message)
        elif action == "pause_dataset":
            log.error("%s: dataset paused (on_alarm = pause_dataset)", alarm.message)
            self._pause(self.by_name[alarm.dataset], alarm.message)
        else:
            log.error("%s: stopping (on_alarm = stop)", alarm.message)
            self.request_stop(f"{alarm.message} (on_alarm = stop)", kind="alarm")

    def _pause(self, ds: DsRun, why: str) -> None:
        """No new requests for this dataset this session; its work stays pending."""
        ds.paused = why
        self._set_state(ds, "paused", f"paused: {why}")
        self._drop_ready(ds)

    # ---------------------------------------------------------------------------------------
    # events, control, periodic work
    def _event(self, kind: str, dataset: str | None, provider: str | None, detail: str) -> None:
        self.writer.batch.events.append(
            (time.time(), self.session_id, kind, dataset, provider, detail))

    def _event_once(self, kind: str, dataset: str | None, provider: str | None,
                    detail: str) -> None:
        key = (kind, f"{dataset}|{provider}")
        if key not in self.events_logged:
            self.events_logged.add(key)
            self._event(kind, dataset, provider, detail)
            log.warning("%s", detail)

    def request_stop(self, why: str, now: bool = False, kind: str = "user") -> None:
        """First call: stop dispatching and drain. A second call (or now=True): cancel.
        `kind`: who stops it — user, account (a spent budget), unreachable, store."""
        if self.stopping is not None and kind != "user":
            return  # already stopping; only the user escalates a drain to a cancel
        self.stop_kind = self.stop_kind or kind
        if now or self.stopping == "drain":
            if self.stopping != "now":
                self.stopping = "now"
                self.stop_reason = self.stop_reason or why
                self._event("stop_now", None, None, why)
                log.warning("stopping now (%s): cancelling %d request(s) in flight",
                            why, len(self.inflight))
            self._stop_now.set()
        elif self.stopping is None:
            self.stopping = "drain"
            self.stop_reason = why
            self._event("stop", None, None, why)
            log.warning("stopping (%s): no new requests; waiting up to %gs for %d in flight "
                        "(stop again to cancel them)", why, self.drain_timeout, len(self.inflight))
        self._wake.set()

    def _poll_control(self) -> None:
        for path, req in pending_requests(self.store.path.parent):
            path.unlink(missing_ok=True)
            name = req["name"].strip()
            if req["action"] == "exclude":
                self._exclude(name, "user", "specgen provider --exclude")
            else:
                self._allow(name)
        ctl = read_control(self.store.path.parent)
        if ctl is None:
            return
        clear_control(self.store.path.parent)
        if ctl.get("session") not in (None, self.session_id):
            return
        action = ctl.get("action")
        if action == "now":
            self.request_stop("specgen stop --now", now=True)
        elif action == "drain":
            self.request_stop("specgen stop")

    def live_figures(self) -> dict[str, Any]:
        """What only the running process knows (for `specgen status`, via live.json)."""
        rps, tps = self.stats.rate.rates()
        return {
            "session": self.session_id, "ts": time.time(), "stopping": self.stopping,
            "in_flight": len(self.inflight), "concurrency_limit": self.concurrency()[0],
            "concurrency_reason": self.concurrency()[1],
            "max_concurrency": self.limit.maximum, "concurrency_backoffs": self.limit.backoffs,
            "in_flight_budget": self.spend_window.to_json(), "endpoint": self.health.to_json(),
            "count_witness": self.witness.to_json(),
            "quality": self.quality.to_json(), "excluded_providers": self.policy.excluded,
            "alarms_fired": self.alarms_fired,
            "store_problem": self.store_problem(),
            "retrying": len(self.retries), "open_conversations": self.open_convs,
            "requests_per_s": round(rps, 3), "completion_tokens_per_s": round(tps, 1),
            "errors": dict(self.stats.errors),
            "providers": {k: v.to_json() for k, v in self.stats.providers.items()},
            "prices": self.budget.prices.to_json(),
            "reserved_cost_usd": round(self.budget.reserved_cost, 6),
            "progress": self.progress_json(),
        }

    def progress_json(self) -> dict[str, Any]:
        """`progress()` for live.json: per dataset and the ETA (docs/engine.md, "Status")."""
        p = self.progress()
        return {
            "eta_s": None if p["eta_s"] is None else round(p["eta_s"], 1),
            "eta_lower_bound": p["eta_lower_bound"],
            "datasets": {name: {
                "planned_requests": round(pl.requests), "planned": pl.kind,
                "fraction": None if pl.fraction is None else round(pl.fraction, 4),
                "basis": pl.basis, "label": pl.label(), "rows_total": p["rows_total"][name],
            } for name, pl in p["plans"].items()},
        }

    def concurrency(self) -> tuple[int, str | None]:
        """The in-flight limit now, and why it is below the configured one (None if not)."""
        limit, why = self.limit.limit, None
        if limit < self.limit.maximum:
            why = f"adaptive: {self.limit.last_reason or 'congestion'} answers"
        fits = self.spend_window.limit_for(self.limit.maximum)
        if fits < limit:
            limit, why = fits, "the account's in-flight spending budget (402 in_flight_budget)"
        state = self.health.to_json()
        if state["state"] == "down":
            limit, why = 1, f"endpoint down ({state.get('reason')}): one probe at a time"
        elif state["state"] == "paused":
            limit, why = 0, f"paused: {state.get('reason')}"
        if self.store_guard.holding:
            limit, why = 0, f"store: {self.store_guard.holding}"
        return limit, why

    def store_problem(self) -> dict[str, Any] | None:
        p = self.writer.problem
        if p is None:
            return None
        return {"kind": p.kind, "message": p.message, "since": p.since,
                "held_answers": self.writer.held_results}

    def write_live_file(self) -> None:
        path = self.store.path.parent / LIVE_FILE
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(orjson.dumps(clean_floats(self.live_figures())))
            os.replace(tmp, path)
        except OSError as exc:  # cosmetic: never stop a run for it
            log.debug("could not write %s: %s", path, exc)

    def stage_datasets(self) -> None:
        for ds in self.datasets:
            if ds.dirty:
                self.writer.batch.datasets[ds.name] = ds.row()
                ds.dirty = False

    async def _ticker(self, on_tick=None) -> None:
        try:
            await self._tick_forever(on_tick)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("periodic work failed")
            self.fatal = self.fatal or f"internal error in the store writer: {exc!r}"
            self._wake.set()
            self._stop_now.set()

    async def _tick_forever(self, on_tick) -> None:
        eng = self.cfg.engine
        last_beat = 0.0
        while True:
            await asyncio.sleep(min(eng.commit_interval, 0.25))
            now = time.monotonic()
            self._poll_control()
            self.stats.tick()
            self.eta.sample(sum(ds.tasks.get("done", 0) + ds.tasks.get("failed", 0)
                                + ds.tasks.get("quarantined", 0) for ds in self.datasets))
            if now - last_beat >= eng.heartbeat_interval:
                last_beat = now
                self.writer.batch.session = (time.time(), "running", None, None, self.session_id)
                self.write_live_file()
            if self.writer.due() or self.writer.batch.session is not None:
                self.stage_datasets()
                self._after_commit(await self.writer.flush_async())
            if on_tick is not None:
                on_tick()

    def _after_commit(self, flushed: bool) -> None:
        verdict = self.store_guard.check(flushed)
        if verdict.note:
            self._event("store", None, None, verdict.note)
        if verdict.stop:
            self.request_stop(verdict.stop, kind="store")
        elif verdict.halt is None and flushed:
            self._wake.set()

    async def _settle_store(self) -> None:
        """Commit the session's last rows, waiting out a store problem as long as
        store_error_timeout allows; what cannot be committed is written to a rescue file."""
        while True:
            self.stage_datasets()
            if await self.writer.flush_async():
                return
            verdict = self.store_guard.check(False)
            if verdict.stop or self.stopping == "now":
                break
            await asyncio.sleep(1.0)
        held = self.writer.held_results
        where = rescue_results(self.writer.batch, self.store.path.parent, self.session_id)
        saved = f"; they were written to {where}" if where else ""
        problem = self.writer.problem
        self.fatal = (f"store error: {problem.message if problem else 'commit failed'}; "
                      f"{held} answer(s) could not be committed{saved}")
        log.error("%s", self.fatal)

    # ---------------------------------------------------------------------------------------
    # the session
    async def run(self, on_tick=None) -> Outcome:
        self._event("session_start", None, None, ", ".join(
            f"{d.name} at row {d.rows_read}" for d in self.datasets))
        ticker = asyncio.get_running_loop().create_task(self._ticker(on_tick))
        try:
            await self._dispatch()
            await self._drain()
        finally:
            ticker.cancel()
            try:
                await ticker
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            await self.writer.wait_idle()
        await self._settle_store()
        return self._finish()

    async def _drain(self) -> None:
        if not self.inflight:
            return
        timeout = self.drain_timeout
        if self.stopping is None and not self.fatal:
            timeout = None  # finished normally: the loop only ends once nothing is in flight
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.inflight and not self._stop_now.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.stop_reason = (self.stop_reason or "stop") + (
                    f"; drain timeout ({self.drain_timeout:g}s) hit, in-flight requests cancelled")
                break
            waiter = asyncio.ensure_future(self._stop_now.wait())
            await asyncio.wait([*self.inflight, waiter], timeout=left,
                               return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        if self.inflight:
            tasks = list(self.inflight)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _finish(self) -> Outcome:
        for ds in self.datasets:
            self._refresh_state(ds)
        reached = []
        for state, label in (("budget_reached", "budget reached"),
                             ("limit_reached", "limit reached")):
            names = [ds.name for ds in self.datasets if ds.state == state]
            if names:
                reached.append(f"{label}: {', '.join(names)}")
        outcome = decide(
            fatal=self.fatal, stopping=self.stopping, stop_reason=self.stop_reason,
            pending=sum(ds.tasks.get("pending", 0) for ds in self.datasets),
            failed=self.failed_by_class(), done_note="; ".join(reached),
            paused={ds.name: ds.paused for ds in self.datasets if ds.paused is not None})
        self.final_state = outcome.state
        self._event("session_end", None, None, f"{outcome.state}: {outcome.stop_reason}")
        self.stage_datasets()
        self.writer.batch.session = (time.time(), outcome.state, outcome.stop_reason,
                                     time.time(), self.session_id)
        if not self.writer.flush():
            log.error("could not record the end of the session in the store")
        self.write_live_file()
        return outcome

    def failed_by_class(self) -> dict[str, int]:
        """Failed tasks of the configured datasets by error class (every session's)."""
        return {k: v for k, v in self.failed_classes.items() if v > 0}


def _response_json(resp: ChatResponse) -> dict[str, Any]:
    return {
        "content": resp.content, "reasoning": resp.reasoning,
        "reasoning_field": resp.reasoning_field,
        "tool_calls": [{"index": c.index, "id": c.id, "name": c.name, "arguments": c.arguments}
                       for c in resp.tool_calls],
        "finish_reason": resp.finish_reason, "native_finish_reason": resp.native_finish_reason,
        "provider": resp.provider, "model": resp.model, "id": resp.id, "usage": resp.usage,
    }
