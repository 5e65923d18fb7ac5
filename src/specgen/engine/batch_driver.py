"""`mode = "batch"`: the engine's requests sent through the provider's Batch API
(docs/batch.md).

The driver stands where the chat client stands for a live run: the scheduler hands it a job
(`answer(job)`) and gets back the job's answer as a `ChatResponse`, or an `ApiError`, which
then go through the same answer path and retry policy as a live answer. Jobs are gathered
into batches (at most `batch_max_requests` lines and `batch_max_bytes`, or what arrived within
`batch_linger_s`); each line's body is the live non-stream body of the job.

Never submitted twice, never lost:

1. the intent (our batch id, every line's `custom_id` and its task as `(dataset, conv_id,
   turn)`) is committed to the store (`batches`, `batch_lines`) before anything is uploaded;
2. the batch is created with `metadata.specgen_batch` = our id, and its provider id is
   committed as soon as it is known;
3. on start the driver reads the batches of the run: a job whose task has a line in a batch
   that was not lost waits for that batch instead of being sent again; a batch recorded
   `intent` was never sent (marked `lost`, its lines sent anew); one recorded `sending`
   without a provider id may exist: it is looked up in the provider's batch list by its
   metadata, and never sent again blindly;
4. results are streamed line by line; each line's outcome is written to `batch_lines`, and
   a line whose answer was not stored yet (a kill while collecting) is collected again on the
   next run from the same result file.

A line the batch could not answer (an error line, a batch that expired, failed or was
cancelled) comes back to the engine as an `ApiError` and is retried like a live error: in a
later batch, or live with `batch_fallback = "live"`. Every wait on the provider is bounded
(docs/batch.md, "When the provider misbehaves").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import orjson

from ..batch_config import fixed_sampling
from ..batch_queries import batch_eta
from ..batch_shape import line_body, line_bytes, record, submission
from ..client.errors import error_from_response
from ..client.parse import parse_completion
from ..client.types import ApiError, ChatResponse
from ..display import printable

log = logging.getLogger("specgen.batch")

TERMINAL = ("completed", "failed", "expired", "cancelled")
STATES = ("validating", "in_progress", "finalizing", "cancelling", *TERMINAL)  # a provider's
INTENT_TRIES = 5  # tries to record a batch's intent before its lines are let go
# results handed over between two turns of the event loop while a result file is read: the
# file arrives faster than the answer path takes it, and each parsed answer waiting holds
# its text and ids (a whole batch of them at once without this)
HANDOVER = 64
ACTIVE = ("intent", "sending", "validating", "in_progress", "finalizing", "cancelling")
Key = tuple[str, str, int]  # (dataset, conv_id, turn): a task, stable across runs
# When the provider misbehaves (docs/batch.md), every wait is bounded:
LOST_POLLS = 5  # polls in a row answering 404 (batch_poll_interval apart) before "lost"
POLL_TRIES = 8  # other failed polls in a row (400, 401, malformed) before giving up on it
RESULT_TRIES = 5  # failed reads of a finished batch's results before its lines are let go
LIST_LOOKS = 5  # looks in the provider's list for a batch that may have been sent
OUTAGE = frozenset({"unreachable", "timeout", "connection", "server", "overloaded",
                    "rate_limit"})  # the path or the API is down: bounded by outage_timeout


class BatchDriver:
    def __init__(self, cfg: Any, store_path: Path, api: Any, *, session_id: int,
                 run_tag: str, live: Any = None, stop: Any = None):
        self.cfg = cfg
        # stop(why): end the session, its work left pending (an outage past outage_timeout,
        # a batch that may be running but cannot be found): the next run picks it up
        self.stop = stop or (lambda why: None)
        self.outage_timeout = float(getattr(getattr(cfg, "engine", None), "outage_timeout",
                                            1800.0))
        self.ep = cfg.endpoint
        self.fixed = fixed_sampling(cfg)  # body keys the batch API fixes: never sent
        self.api = api
        self.live = live  # the chat client, for batch_fallback = "live"
        self.session_id = session_id
        self.run_tag = run_tag
        self.db = sqlite3.connect(store_path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA busy_timeout=10000")
        self.waiting: dict[Key, asyncio.Future] = {}
        self.resume: dict[Key, tuple[str, str]] = {}  # key -> (batch, custom_id) to collect
        self.early: dict[Key, Any] = {}  # results of resumed lines whose job is not here yet
        self.lines_of: dict[str, dict[str, Key]] = {}  # batch -> cid -> key, till collected
        self.provider_id: dict[str, str] = {}
        self.watchers: dict[str, asyncio.Task] = {}
        self.to_live: set[Key] = set()  # lines a batch could not answer (batch_fallback)
        self.buffer: list[tuple[Key, bytes]] = []
        self.buffer_bytes = 0
        self.buffer_model: Any = None  # one model per batch
        self._linger: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self.counts: dict[str, int] = {"submitted": 0, "resumed": 0, "lines": 0,
                                       "lines_ok": 0, "lines_failed": 0, "cancelled": 0}
        self.states: dict[str, str] = {}
        # batch -> (polled at, in progress since, lines, lines done): the provider's progress
        self.progress: dict[str, tuple[float, Any, int, int]] = {}

    # -- start: what earlier sessions left -------------------------------------------------
    async def start(self) -> None:
        rows = self.db.execute(
            "SELECT id, state, provider_id FROM batches WHERE state != 'lost'").fetchall()
        for bid, state, pid in rows:
            self.states[bid] = state
            if pid:
                self.provider_id[bid] = pid
        intents = [bid for bid, state, pid in rows if pid is None]
        unsent = [bid for bid, state, pid in rows if pid is None and state == "intent"]
        if unsent:  # recorded, never sent (a kill before the request): sent anew, no look
            for bid in unsent:
                self._set(bid, state="lost", detail="never sent (stopped before submission)")
                self.states.pop(bid, None)
            intents = [bid for bid in intents if bid not in unsent]
        self._revive_lost()
        for bid, cid, ds, conv, turn in self.db.execute(
                "SELECT bl.batch, bl.custom_id, bl.dataset, bl.conv_id, bl.turn "
                "FROM batch_lines bl JOIN batches b ON b.id = bl.batch "
                "LEFT JOIN conversations c ON c.dataset = bl.dataset AND c.conv_id = bl.conv_id "
                "LEFT JOIN tasks t ON t.conversation = c.id AND t.turn = bl.turn "
                "WHERE b.state != 'lost' AND (bl.outcome IS NULL OR bl.outcome = 'ok') "
                "AND (t.status IS NULL OR t.status = 'pending') ORDER BY bl.rowid"):
            key = (ds, conv, int(turn))
            self.resume[key] = (bid, cid)
            self.lines_of.setdefault(bid, {})[cid] = key
        if self.resume:
            log.info("batch mode: %d line(s) of %d earlier batch(es) to collect",
                     len(self.resume), len({b for b, _ in self.resume.values()}))
            for bid in {b for b, _ in self.resume.values()}:
                self.counts["resumed"] += 1
                if bid in intents:  # sent, its provider id never stored: look for it first
                    self._spawn(self._confirm(bid), bid)
                else:
                    self._watch(bid)
        for bid in intents:  # nothing left to collect of it
            if bid not in {b for b, _ in self.resume.values()}:
                self._set(bid, state="lost", detail="unconfirmed, every line done since")
                self.states.pop(bid, None)

    def _revive_lost(self) -> None:
        """A batch declared lost (404 polls) with lines still to answer is followed again:
        if the provider shows it after all, its answers are collected, not bought again."""
        for bid, pid in self.db.execute(
                "SELECT DISTINCT b.id, b.provider_id FROM batches b "
                "JOIN batch_lines bl ON bl.batch = b.id "
                "LEFT JOIN conversations c ON c.dataset = bl.dataset AND c.conv_id = bl.conv_id "
                "LEFT JOIN tasks t ON t.conversation = c.id AND t.turn = bl.turn "
                "WHERE b.state = 'lost' AND b.provider_id IS NOT NULL "
                "AND bl.outcome = 'error:lost' AND (t.status IS NULL OR t.status = 'pending') "
                "AND NOT EXISTS (SELECT 1 FROM batch_lines b2 JOIN batches bb ON "
                "bb.id = b2.batch WHERE b2.dataset = bl.dataset AND b2.conv_id = bl.conv_id "
                "AND b2.turn = bl.turn AND bb.state != 'lost' AND b2.rowid > bl.rowid)"
                ).fetchall():
            log.info("batch %s (%s) was lost: looking for it again", bid, _show(pid))
            self.db.execute("UPDATE batch_lines SET outcome = NULL WHERE batch = ? AND "
                            "outcome = 'error:lost'", (bid,))
            self._set(bid, state="validating", detail="lost, looked for again")
            self.states[bid] = "validating"
            self.provider_id[bid] = pid

    async def _find(self, wanted: set[str]) -> dict[str, dict[str, Any]]:
        """Our batches (by `metadata.specgen_batch`) in the provider's list."""
        found: dict[str, dict[str, Any]] = {}
        async for b in self.api.list():
            meta = b.get("metadata")
            tag = meta.get("specgen_batch") if isinstance(meta, dict) else None
            if tag in wanted and isinstance(b.get("id"), str):
                found[tag] = b
                if len(found) == len(wanted):
                    break
        return found

    async def _confirm(self, bid: str) -> None:
        """A batch that was sent but whose provider id was never stored (a kill, a lost
        answer): find it in the provider's list, then follow it. While the API is down (or
        its list fails) this is retried up to outage_timeout, then the session stops with
        the lines pending; a batch the list does not show after LIST_LOOKS looks is never
        sent again blindly: the session stops and says so (a rerun looks again)."""
        looks, since = 0, time.monotonic()
        while True:
            try:
                b = (await self._find({bid})).get(bid)
            except ApiError as err:
                b = None
                if time.monotonic() - since >= self.outage_timeout:
                    self._give_up(bid, f"the provider's batch list failed for "
                                       f"{self.outage_timeout:g}s (last: {err})")
                    return
                log.warning("looking for batch %s in the provider's list: %s (retrying up "
                            "to outage_timeout %gs)", bid, err, self.outage_timeout)
            else:
                looks += 1
                if b is not None:
                    log.info("batch %s found at the provider as %s (%s)", bid, _show(b["id"]),
                             _show(b.get("status")))
                    self.provider_id[bid] = b["id"]
                    self._set(bid, provider_id=b["id"], state=_state(b) or "validating")
                    self.states[bid] = _state(b) or "validating"
                    self._watch(bid)
                    return
                if looks >= LIST_LOOKS:
                    self._give_up(bid, f"not in the provider's batch list after {looks} looks "
                                       "(it may be running and billed: never sent again "
                                       "blindly)")
                    return
            await asyncio.sleep(self.ep.batch_poll_interval)

    def _give_up(self, bid: str, why: str) -> None:
        """Stop the session with the lines of `bid` pending (never resubmitted): what it
        waited for and why it stopped are said; the next run looks again."""
        message = (f"batch {bid}: {why}; its lines stay pending, not sent again; rerun to "
                   "look for it again")
        log.error("%s", message)
        self._set(bid, detail=message[:500])
        self.stop(message)

    # -- the engine's side ----------------------------------------------------------------
    async def answer(self, job: Any) -> ChatResponse:
        """The answer to `job` from a batch (or live, for a line a batch could not answer
        with batch_fallback = "live"); raises ApiError as the chat client does."""
        key: Key = (job.ds.name, job.conv.conv.id, job.turn)
        if key in self.early:
            return _result(self.early.pop(key))
        if key in self.to_live and self.live is not None:
            self.to_live.discard(key)
            return await self.live.chat(job.body)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[key] = fut
        try:
            if key not in self.resume:
                self._add(key, job.body)
            return _result(await fut)
        finally:
            if self.waiting.get(key) is fut:
                del self.waiting[key]

    def goes_live(self, job: Any) -> bool:
        """Whether `job`'s next attempt is sent live (batch_fallback = "live"): it is then
        reserved and charged at the live price."""
        return self.live is not None and (job.ds.name, job.conv.conv.id, job.turn) in self.to_live

    def _add(self, key: Key, body: dict[str, Any]) -> None:
        body = line_body(body, self.fixed)
        # the size; the real custom_id is set at submission
        data = line_bytes("{cid}", body, api=self.ep.batch_api)
        if self.buffer and (len(self.buffer) >= self.ep.batch_max_requests
                            or self.buffer_bytes + len(data) > self.ep.batch_max_bytes
                            or body.get("model") != self.buffer_model):
            self._flush()
        self.buffer_model = body.get("model")
        self.buffer.append((key, orjson.dumps(body)))
        self.buffer_bytes += len(data) + 1
        if len(self.buffer) >= self.ep.batch_max_requests:
            self._flush()
        elif self._linger is None:
            self._linger = asyncio.get_running_loop().call_later(
                self.ep.batch_linger_s, self._flush)

    def _flush(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if not self.buffer:
            return
        lines, self.buffer, self.buffer_bytes = self.buffer, [], 0
        # a job let go meanwhile (a stop) is not submitted: nobody waits for its answer
        lines = [(key, body) for key, body in lines if key in self.waiting]
        if lines:
            self._spawn(self._submit(lines))

    def _spawn(self, coro, bid: str | None = None) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._ended(t, bid))
        return task

    def _ended(self, task: asyncio.Task, bid: str | None) -> None:
        """A submission or a watcher that died of a bug: its lines are let go with the error
        (retried like a failed line), never left waiting forever."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("internal error in batch mode: %r", exc, exc_info=exc)
        if bid is not None:
            self._end_lines(bid, "error", ApiError("server", f"internal error: {exc!r}"))

    # -- submission -----------------------------------------------------------------------
    async def _submit(self, lines: list[tuple[Key, bytes]]) -> None:
        bid = f"sg-{uuid.uuid4().hex[:20]}"
        cids = {f"{bid}-{i}": key for i, (key, _) in enumerate(lines)}
        try:
            await self._send(bid, cids, lines)
        except Exception as exc:  # noqa: BLE001 - a bug: let the lines go, never hang
            log.error("internal error submitting batch %s: %r", bid, exc, exc_info=exc)
            self._fail_lines(bid, cids, ApiError("server", f"internal error: {exc!r}"))

    async def _send(self, bid: str, cids: dict[str, Key], lines: list[tuple[Key, bytes]]
                    ) -> None:
        api = self.ep.batch_api
        first = orjson.loads(lines[0][1])  # one model (and routing) per batch
        meta = {"specgen_batch": bid, "specgen_run": self.run_tag}
        data = submission(api, [record(api, cid, body) for cid, (_, body)
                                in zip(cids, lines, strict=True)],
                          model=first.get("model"), window=self.ep.completion_window,
                          metadata=meta, provider=first.get("provider"))
        for attempt in range(INTENT_TRIES):  # 1. the intent, before anything is sent
            try:
                self._intent(bid, cids, len(data))
                break
            except sqlite3.Error as exc:
                if attempt + 1 == INTENT_TRIES:
                    log.error("could not record batch %s in the store (%s): not submitted",
                              bid, exc)
                    self._fail_lines(bid, cids, ApiError(
                        "server", f"the batch could not be recorded in the store: {exc}"))
                    return
                await asyncio.sleep(1.0)
        self.lines_of[bid] = cids
        self.states[bid] = "intent"
        self.counts["lines"] += len(lines)
        def sending(fid: str | None = None) -> None:  # from here on it may exist
            self._set(bid, input_file_id=fid, state="sending")
            self.states[bid] = "sending"

        if api == "openrouter":
            sending()
        try:
            b = await self.api.submit(data, name=bid, metadata=meta, on_file=sending)
        except ApiError as err:
            if err.kind in ("timeout", "connection") and self.states.get(bid) == "sending":
                # the request may have reached the provider: look for it before resending
                log.warning("batch %s: %s; looking for it in the provider's list", bid, err)
                await self._confirm(bid)
                return
            self._set(bid, state="lost", detail=str(err)[:500])
            self.states.pop(bid, None)
            log.warning("batch %s could not be submitted: %s", bid, err)
            self._fail_lines(bid, cids, err)
            return
        self.provider_id[bid] = b["id"]
        self.states[bid] = _state(b) or "validating"
        self._set(bid, provider_id=b["id"], state=self.states[bid])
        self.counts["submitted"] += 1
        log.info("batch %s submitted as %s: %d line(s), %d bytes", bid, _show(b["id"]), len(lines),
                 len(data))
        self._watch(bid)

    def _intent(self, bid: str, cids: dict[str, Key], size: int) -> None:
        now = time.time()
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute(
                "INSERT INTO batches(id, session, created_at, state, lines, bytes, updated_at) "
                "VALUES (?,?,?,?,?,?,?)", (bid, self.session_id, now, "intent", len(cids),
                                           size, now))
            self.db.executemany(
                "INSERT INTO batch_lines(batch, custom_id, dataset, conv_id, turn) "
                "VALUES (?,?,?,?,?)", [(bid, cid, *key) for cid, key in cids.items()])

    def _fail_lines(self, bid: str, cids: dict[str, Key], err: ApiError) -> None:
        for key in cids.values():
            fut = self.waiting.get(key)
            if fut is not None and not fut.done():
                fut.set_result(ApiError(err.kind, str(err), status=err.status,
                                        retry_after=err.retry_after))

    # -- waiting and collecting -----------------------------------------------------------
    def _watch(self, bid: str) -> None:
        if bid not in self.watchers or self.watchers[bid].done():
            self.watchers[bid] = self._spawn(self._follow(bid), bid)

    async def _follow(self, bid: str) -> None:
        """Poll the batch till it ends, then collect it. A failed poll is an error of that
        poll, never of the watcher: 404s make it lost only after LOST_POLLS in a row, an
        outage is waited out up to outage_timeout (then the session stops, the lines
        pending), other failures (400, 401, a malformed answer) end it after POLL_TRIES."""
        pid = self.provider_id.get(bid)
        if pid is None:
            return
        delay = min(self.ep.batch_poll_interval, 1.0)
        last: tuple = ()
        gone = fails = 0
        down: float | None = None
        warned = False
        while True:
            try:
                b = await self.api.get(pid)
                status, counts, since, bad = _poll(b)
            except ApiError as err:
                if err.status == 404:
                    gone += 1
                    if gone >= LOST_POLLS:
                        self._lost(bid, pid, f"{gone} polls in a row answered 404 ({err})")
                        return
                    log.warning("polling batch %s: not found (%d of %d before it is taken as "
                                "lost): %s", _show(pid), gone, LOST_POLLS, err)
                elif err.kind in OUTAGE:
                    down = time.monotonic() if down is None else down
                    if time.monotonic() - down >= self.outage_timeout:
                        self._give_up(bid, f"polling it failed for {self.outage_timeout:g}s "
                                           f"(outage_timeout; last: {err})")
                        return
                    log.warning("polling batch %s: %s (retrying up to outage_timeout %gs)",
                                _show(pid), err, self.outage_timeout)
                else:
                    gone, fails = 0, fails + 1
                    if fails >= POLL_TRIES:
                        self._unreadable(bid, err, f"{fails} polls in a row failed")
                        return
                    log.warning("polling batch %s (%d of %d tries): %s", _show(pid), fails,
                                POLL_TRIES, err)
                await asyncio.sleep(self.ep.batch_poll_interval)
                continue
            gone = fails = 0
            down = None
            if bad and not warned:
                warned = True
                log.warning("polling batch %s: malformed field(s) ignored: %s", _show(pid),
                            "; ".join(bad))
            done, failed, total = counts
            seen = (status, done, failed)
            if seen != last:  # the store holds the provider's progress (status --json, ETA)
                last = seen
                self.states[bid] = status
                self._set(bid, state=status, completed=done, failed=failed,
                          output_file_id=_text(b.get("output_file_id")),
                          error_file_id=_text(b.get("error_file_id")), in_progress_at=since)
            self.progress[bid] = (time.time(), since, total or 0, (done or 0) + (failed or 0))
            if status in TERMINAL:
                self.progress.pop(bid, None)
                break
            await asyncio.sleep(delay)
            delay = min(self.ep.batch_poll_interval, delay * 2)
        await self._collect(bid, {**b, "status": status})

    def _lost(self, bid: str, pid: str, why: str) -> None:
        log.warning("batch %s (%s) is gone at the provider: %s; its lines are sent again "
                    "(a rerun collects it if it shows up after all)", bid, _show(pid), why)
        self._set(bid, state="lost", detail=why[:500])
        self.states.pop(bid, None)
        self.progress.pop(bid, None)
        self._mark([("error:lost", bid, cid) for cid in self.lines_of.get(bid, {})])
        self._end_lines(bid, "lost", ApiError("server", f"batch {_show(pid)} is gone"))

    def _unreadable(self, bid: str, err: ApiError, why: str) -> None:
        """A batch whose state or results cannot be read: its unanswered lines are let go
        with the error (retried like a failed line), and no later run waits on it."""
        message = f"batch {bid}: {why}; giving up on it (last: {err})"
        log.error("%s", message)
        self._set(bid, state="unreadable", detail=message[:500])
        self.states.pop(bid, None)
        self.progress.pop(bid, None)
        unread = list(self.lines_of.get(bid, {}))
        # the batch failed its lines, not the lines themselves (a 404 here is a file, not
        # "no endpoint"): retried like a failed line; a refused key stays what it is
        kind = err.kind if err.kind in ("auth", "credits", "spend_limit") else "server"
        self._mark([(f"error:{kind}", bid, cid) for cid in unread])
        for cid in unread:
            self._resolve(bid, cid, ApiError(kind, message))
        self.lines_of.pop(bid, None)

    async def _collect(self, bid: str, b: dict[str, Any]) -> None:
        """Read a finished batch's results. A line's paid answer always beats an error line
        for the same custom_id (errors are handed over only once every line was read); a
        read that fails is tried again, RESULT_TRIES times (an outage: up to
        outage_timeout), then the unread lines are let go."""
        status = b["status"]
        seen: set[str] = set()  # answered
        errors: dict[str, ApiError] = {}
        marks: list[tuple[str, str, str]] = []
        tries = 0
        down: float | None = None
        while True:
            try:
                async for raw in self.api.results(b):
                    cid, result = parse_line(raw)
                    if cid is None or cid in seen:
                        continue
                    if not isinstance(result, ChatResponse):
                        errors.setdefault(cid, result)
                        continue
                    # the metadata masked before anything reads it, as live answers are
                    self.api.mask_metadata(result)
                    seen.add(cid)
                    errors.pop(cid, None)
                    marks.append(("ok", bid, cid))
                    self._resolve(bid, cid, result)
                    if len(seen) % HANDOVER == 0:  # let the jobs take their answers
                        await asyncio.sleep(0)
                    if len(marks) >= 500:
                        self._mark(marks)
                        marks = []
                break
            except ApiError as err:  # read again; lines already handed over are skipped
                self._mark(marks)
                marks = []
                if err.kind in OUTAGE:
                    down = time.monotonic() if down is None else down
                    if time.monotonic() - down >= self.outage_timeout:
                        self._give_up(bid, f"reading its results failed for "
                                           f"{self.outage_timeout:g}s (outage_timeout; last: "
                                           f"{err})")
                        return
                else:
                    tries += 1
                    if tries >= RESULT_TRIES:
                        for cid in seen:
                            self.lines_of.get(bid, {}).pop(cid, None)
                        self._unreadable(bid, err, f"its results could not be read "
                                                   f"({tries} tries)")
                        return
                log.warning("reading results of batch %s (try %d of %d): %s", bid, tries,
                            RESULT_TRIES, err)
                await asyncio.sleep(self.ep.batch_poll_interval)
        marks.extend((f"error:{err.kind}", bid, cid) for cid, err in errors.items())
        self._mark(marks)
        for cid, err in errors.items():
            self._resolve(bid, cid, err)
        why = {"completed": "the batch answered no line for it",
               "expired": "the batch expired before the line was answered",
               "cancelled": "the batch was cancelled",
               "failed": f"the batch failed: {_errors(b)}"}[status]
        missing = {cid: key for cid, key in self.lines_of.get(bid, {}).items()
                   if cid not in seen and cid not in errors}
        if missing:
            self._mark([(f"error:batch_{status}", bid, cid) for cid in missing])
            kind = "timeout" if status == "expired" else "server"
            for cid in missing:
                self._resolve(bid, cid, ApiError(kind, f"batch {_show(b['id'])}: {why}"))
        self._set(bid, detail=f"collected at {time.time():.0f}")
        # every line is handed over: forget the batch's lines, so that what the driver holds
        # is the batches in flight, not every line of the session (flat memory at 100k lines)
        self.lines_of.pop(bid, None)
        log.info("batch %s (%s) %s: %d line(s) collected, %d failed, %d not answered", bid,
                 _show(b["id"]), status, len(seen), len(errors), len(missing))

    def _resolve(self, bid: str, cid: str, result: Any) -> None:
        key = self.lines_of.get(bid, {}).get(cid)
        if key is None:
            return
        if isinstance(result, ChatResponse):
            self.counts["lines_ok"] += 1
        else:
            self.counts["lines_failed"] += 1
            if self.ep.batch_fallback == "live":
                self.to_live.add(key)
        resumed = self.resume.get(key) == (bid, cid)
        if resumed:
            del self.resume[key]
        fut = self.waiting.get(key)
        if fut is not None and not fut.done():
            fut.set_result(result)
        elif resumed and isinstance(result, ChatResponse):
            self.early[key] = result  # its job has not asked yet (a resumed task)

    def _end_lines(self, bid: str, status: str, err: ApiError) -> None:
        for cid in self.lines_of.get(bid, {}):
            self._resolve(bid, cid, err)

    # -- the store ------------------------------------------------------------------------
    # A write below that fails (disk full, store gone) is logged and the batch goes on in
    # memory: the intent is in the store, so the next run still finds the batch (by its
    # metadata) and collects the lines whose answers were not stored.
    def _set(self, bid: str, **cols: Any) -> None:
        cols = {k: v for k, v in cols.items() if v is not None}
        cols["updated_at"] = time.time()
        sets = ", ".join(f"{k}=?" for k in cols)
        try:
            self.db.execute(f"UPDATE batches SET {sets} WHERE id=?", (*cols.values(), bid))
        except sqlite3.Error as exc:
            log.warning("could not record batch %s's %s in the store: %s", bid,
                        ", ".join(cols), exc)

    def _mark(self, marks: Iterable[tuple[str, str, str]]) -> None:
        marks = list(marks)
        if not marks:
            return
        try:
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                self.db.executemany(
                    "UPDATE batch_lines SET outcome=? WHERE batch=? AND custom_id=?", marks)
        except sqlite3.Error as exc:
            log.warning("could not record the outcome of %d batch line(s): %s", len(marks), exc)

    # -- the end of the session -----------------------------------------------------------
    async def close(self, *, cancel: bool = False) -> None:
        """Stop waiting. With `cancel` (stop --now), the batches still running are cancelled
        at the provider; otherwise they keep running and the next run collects them."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if cancel:
            for bid, pid in self.provider_id.items():
                if self.states.get(bid) in ACTIVE:
                    try:
                        await self.api.cancel(pid)
                        self.counts["cancelled"] += 1
                        self._set(bid, state="cancelling")
                        log.warning("batch %s (%s) cancelled at the provider", bid, pid)
                    except ApiError as err:
                        log.warning("could not cancel batch %s: %s", pid, err)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.db.close()

    def figures(self) -> dict[str, Any]:
        by_state: dict[str, int] = {}
        for state in self.states.values():
            by_state[state] = by_state.get(state, 0) + 1
        etas = self.etas()
        known = [e for e in etas.values() if e is not None]
        return {**self.counts, "by_state": by_state, "buffered": len(self.buffer),
                "waiting": len(self.waiting), "eta_s": max(known) if known else None,
                "eta_by_batch": etas}

    def etas(self) -> dict[str, float | None]:
        """Each running batch's ETA (`batch_queries.batch_eta`: from the provider's progress,
        its lines done since it went in progress); None while it has done none."""
        now = time.time()
        return {bid: batch_eta(total, done, since, polled, now)
                for bid, (polled, since, total, done) in self.progress.items()}

    def progress_text(self) -> str:
        f = self.figures()
        states = " ".join(f"{s} {n}" for s, n in sorted(f["by_state"].items())) or "none yet"
        each = ", ".join(f"{bid} {e:.0f}s" for bid, e in f["eta_by_batch"].items()
                         if e is not None)
        eta = "" if f["eta_s"] is None else f"; batch ETA {f['eta_s']:.0f}s ({each})"
        return (f"batches: {states}; lines {f['waiting']:,} waiting, {f['buffered']:,} "
                f"to submit, {f['lines_ok']:,} answered, {f['lines_failed']:,} retried{eta}")


def parse_line(raw: bytes | dict[str, Any]) -> tuple[str | None, Any]:
    """(custom_id, a ChatResponse or an ApiError) of one result line: a line of a result file
    (bytes) or an item of a results page (parsed); both `{custom_id, response: {status_code,
    body}, error}`."""
    try:
        obj = raw if isinstance(raw, dict) else orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, None
    if not isinstance(obj, dict) or not isinstance(obj.get("custom_id"), str):
        return None, None
    cid = obj["custom_id"]
    resp = obj.get("response")
    if isinstance(resp, dict) and resp.get("status_code") == 200:
        try:
            answer = parse_completion(orjson.dumps(resp.get("body")))
        except ApiError as err:
            return cid, err
        answer.http_status = 200
        answer.started_at = answer.ended_at = time.time()
        return cid, answer
    if isinstance(resp, dict) and isinstance(resp.get("status_code"), int):
        return cid, error_from_response(resp["status_code"], {}, orjson.dumps(resp.get("body")))
    err = obj.get("error") or {}
    code = err.get("code") if isinstance(err, dict) else None
    message = err.get("message") if isinstance(err, dict) else str(err)
    kind = "timeout" if code == "batch_expired" else "server"
    return cid, ApiError(kind, f"batch line failed: {code or 'error'}: {message}")


def _show(value: Any) -> str:
    """A provider's id or word for a message: printable, short (a hostile id cannot move
    the terminal's cursor or fill the log)."""
    text = printable(str(value))
    return text if len(text) <= 80 else text[:79] + "…"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _state(b: dict[str, Any]) -> str | None:
    status = b.get("status")
    return status if isinstance(status, str) and status in STATES else None


def _count(value: Any) -> int | None:
    ok = value.__class__ is not bool and isinstance(value, int) and 0 <= value < 2**53
    return value if ok else None


def _poll(b: dict[str, Any]) -> tuple[str, tuple[Any, Any, Any], float | None, list[str]]:
    """(status, (completed, failed, total), in progress since, what was malformed) of a
    polled batch object. A status that is not a string is an `invalid_response` of that
    poll; progress figures of the wrong type are dropped (unknown), named in the list."""
    status = b.get("status")
    if not isinstance(status, str):
        raise ApiError("invalid_response", f"batch poll: status is {_show(status)[:40]}")
    if status not in STATES:
        status = "in_progress"  # a provider's own word for "not done yet"
    bad: list[str] = []
    counts = b.get("request_counts")
    if counts is not None and not isinstance(counts, dict):
        bad.append(f"request_counts = {_show(counts)[:40]}")
        counts = None
    figures = []
    for key in ("completed", "failed", "total"):
        value = (counts or {}).get(key)
        figures.append(_count(value))
        if value is not None and figures[-1] is None:
            bad.append(f"request_counts.{key} = {_show(value)[:40]}")
    since = b.get("in_progress_at") or b.get("created_at")
    ok = isinstance(since, int | float) and since.__class__ is not bool and 0 < since < 1e11
    if since is not None and not ok:
        bad.append(f"in_progress_at = {_show(since)[:40]}")
    return status, (figures[0], figures[1], figures[2]), float(since) if ok else None, bad


def _result(value: Any) -> ChatResponse:
    if isinstance(value, ApiError):
        raise value
    return value


def _errors(b: dict[str, Any]) -> str:
    errs = b.get("errors")
    if isinstance(errs, dict) and isinstance(errs.get("data"), list) and errs["data"]:
        first = errs["data"][0]
        if isinstance(first, dict):
            return str(first.get("message") or first.get("code") or first)[:300]
    return "no reason given"


@contextlib.asynccontextmanager
async def attached(engine: Any, cfg: Any, *, base_url: str, store: Any, session_id: int,
                   live: Any) -> AsyncIterator[BatchDriver]:
    """The session's batch driver, answering `engine`'s jobs until the block ends. A stop
    (`specgen stop`, Ctrl-C) leaves the submitted batches running: the jobs waiting on them
    are cancelled at once (they stay pending; the next run collects their batches);
    `stop --now` also cancels the batches at the provider."""
    from ..client.batch import BatchHttp

    ep = cfg.endpoint
    headers = dict(ep.headers)
    if ep.return_token_ids:
        headers.setdefault("X-Specgen-Return-Token-Ids", "1")
    tag = f"{store.path.parent.name}@{store.get_meta('created_at') or '?'}"
    async with BatchHttp(base_url, api_key_env=ep.api_key_env, headers=headers,
                         connect_timeout=ep.connect_timeout, files_path=ep.batch_files_path,
                         batches_path=ep.batch_batches_path,
                         purpose=ep.batch_file_purpose, proxy=ep.proxy, api=ep.batch_api,
                         completion_window=ep.completion_window) as api:
        driver = BatchDriver(cfg, store.path, api, session_id=session_id, run_tag=tag,
                             live=live, stop=lambda why: engine.stop.request(
                                 why, kind="unreachable"))
        await driver.start()
        engine.batch = driver
        watch = asyncio.get_running_loop().create_task(_on_stop(engine))
        try:
            yield driver
        finally:
            watch.cancel()
            now = engine.stop.stopping == "now"
            await driver.close(cancel=now)
            if now and driver.counts["cancelled"]:
                log.warning("stop --now: %d batch(es) cancelled at the provider (what they "
                            "answered before is collected by the next run)",
                            driver.counts["cancelled"])


async def _on_stop(engine: Any) -> None:
    """Once a stop is asked, the jobs waiting on batches are let go (their batches run on)."""
    while not engine.stop.stopping:
        await asyncio.sleep(0.1)
    for task in list(engine.inflight):
        task.cancel()
