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
   that was not lost waits for that batch instead of being sent again; a batch whose intent
   was recorded without a provider id is looked up in the provider's batch list by its
   metadata (it was created, or it never was: then it is marked `lost`);
4. results are streamed line by line; each line's outcome is written to `batch_lines`, and
   a line whose answer was not stored yet (a kill while collecting) is collected again on the
   next run from the same result file.

A line the batch could not answer (an error line, a batch that expired, failed or was
cancelled) comes back to the engine as an `ApiError` and is retried like a live error: in a
later batch, or live with `batch_fallback = "live"`.
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

log = logging.getLogger("specgen.batch")

TERMINAL = ("completed", "failed", "expired", "cancelled")
INTENT_TRIES = 5  # tries to record a batch's intent before its lines are let go
# results handed over between two turns of the event loop while a result file is read: the
# file arrives faster than the answer path takes it, and each parsed answer waiting holds
# its text and ids (a whole batch of them at once without this)
HANDOVER = 64
ACTIVE = ("intent", "validating", "in_progress", "finalizing", "cancelling")
Key = tuple[str, str, int]  # (dataset, conv_id, turn): a task, stable across runs


class BatchDriver:
    def __init__(self, cfg: Any, store_path: Path, api: Any, *, session_id: int,
                 run_tag: str, live: Any = None):
        self.cfg = cfg
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
        if intents:
            await self._reconcile(intents)
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
                self._watch(bid)

    async def _reconcile(self, intents: list[str]) -> None:
        """Batches whose intent was recorded but not their provider id: find them in the
        provider's list by their metadata, or mark them lost (never created)."""
        found: dict[str, dict[str, Any]] = {}
        wanted = set(intents)
        try:
            async for b in self.api.list():
                meta = b.get("metadata") or {}
                tag = meta.get("specgen_batch") if isinstance(meta, dict) else None
                if tag in wanted:
                    found[tag] = b
                    if len(found) == len(wanted):
                        break
        except ApiError as err:
            raise ApiError(err.kind, f"listing the provider's batches to find the ones this "
                                     f"run submitted before it stopped: {err}") from None
        for bid in intents:
            b = found.get(bid)
            if b is None:
                log.info("batch %s was never created at the provider: its lines are sent "
                         "again", bid)
                self._set(bid, state="lost", detail="not in the provider's batch list")
                self.states.pop(bid, None)
            else:
                log.info("batch %s found at the provider as %s (%s)", bid, b["id"], b.get("status"))
                self.provider_id[bid] = b["id"]
                self._set(bid, provider_id=b["id"], state=b.get("status") or "validating")

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
        try:
            b = await self.api.submit(data, name=bid, metadata=meta,
                                      on_file=lambda fid: self._set(bid, input_file_id=fid))
        except ApiError as err:
            if err.kind in ("timeout", "connection"):  # it may have been created: look
                try:
                    await self._reconcile([bid])
                except ApiError:
                    pass
                if bid in self.provider_id:
                    self._watch(bid)
                    return
            self._set(bid, state="lost", detail=str(err)[:500])
            self.states.pop(bid, None)
            log.warning("batch %s could not be submitted: %s", bid, err)
            self._fail_lines(bid, cids, err)
            return
        self.provider_id[bid] = b["id"]
        self._set(bid, provider_id=b["id"], state=b.get("status") or "validating")
        self.counts["submitted"] += 1
        log.info("batch %s submitted as %s: %d line(s), %d bytes", bid, b["id"], len(lines),
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
        pid = self.provider_id.get(bid)
        if pid is None:
            return
        delay = min(self.ep.batch_poll_interval, 1.0)
        last: tuple = ()
        while True:
            try:
                b = await self.api.get(pid)
            except ApiError as err:
                if err.status == 404:
                    log.warning("batch %s (%s) is gone at the provider: its lines are sent "
                                "again", bid, pid)
                    self._set(bid, state="lost", detail=str(err)[:500])
                    self._end_lines(bid, "lost", ApiError("server", f"batch {pid} is gone"))
                    return
                log.warning("polling batch %s: %s", pid, err)
                await asyncio.sleep(self.ep.batch_poll_interval)
                continue
            status = b.get("status") or "?"
            counts = b.get("request_counts") or {}
            since = b.get("in_progress_at") or b.get("created_at")
            since = float(since) if isinstance(since, int | float) else None  # unix seconds
            seen = (status, counts.get("completed"), counts.get("failed"))
            if seen != last:  # the store holds the provider's progress (status --json, ETA)
                last = seen
                self.states[bid] = status
                self._set(bid, state=status, completed=counts.get("completed"),
                          failed=counts.get("failed"), output_file_id=b.get("output_file_id"),
                          error_file_id=b.get("error_file_id"), in_progress_at=since)
            self.progress[bid] = (time.time(), since, counts.get("total") or 0,
                                  (counts.get("completed") or 0) + (counts.get("failed") or 0))
            if status in TERMINAL:
                self.progress.pop(bid, None)
                break
            await asyncio.sleep(delay)
            delay = min(self.ep.batch_poll_interval, delay * 2)
        await self._collect(bid, b)

    async def _collect(self, bid: str, b: dict[str, Any]) -> None:
        status = b["status"]
        seen: set[str] = set()
        marks: list[tuple[str, str, str]] = []
        while True:
            try:
                async for raw in self.api.results(b):
                    cid, result = parse_line(raw)
                    if cid is None or cid in seen:
                        continue
                    seen.add(cid)
                    marks.append(("ok" if isinstance(result, ChatResponse)
                                  else f"error:{result.kind}", bid, cid))
                    self._resolve(bid, cid, result)
                    if len(seen) % HANDOVER == 0:  # let the jobs take their answers
                        await asyncio.sleep(0)
                    if len(marks) >= 500:
                        self._mark(marks)
                        marks = []
                break
            except ApiError as err:  # read again; lines already handed over are skipped
                log.warning("reading results of batch %s: %s", bid, err)
                await asyncio.sleep(self.ep.batch_poll_interval)
        self._mark(marks)
        why = {"completed": "the batch answered no line for it",
               "expired": "the batch expired before the line was answered",
               "cancelled": "the batch was cancelled",
               "failed": f"the batch failed: {_errors(b)}"}[status]
        missing = {cid: key for cid, key in self.lines_of.get(bid, {}).items() if cid not in seen}
        if missing:
            self._mark([(f"error:batch_{status}", bid, cid) for cid in missing])
            kind = "timeout" if status == "expired" else "server"
            for cid in missing:
                self._resolve(bid, cid, ApiError(kind, f"batch {b['id']}: {why}"))
        self._set(bid, detail=f"collected at {time.time():.0f}")
        # every line is handed over: forget the batch's lines, so that what the driver holds
        # is the batches in flight, not every line of the session (flat memory at 100k lines)
        self.lines_of.pop(bid, None)
        log.info("batch %s (%s) %s: %d line(s) collected, %d not answered", bid, b["id"],
                 status, len(seen), len(missing))

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
                             live=live)
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
