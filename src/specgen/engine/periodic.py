"""The session's periodic work, a few times a second: requests from other shells, rates and
the ETA, the heartbeat and `live.json`, and the batched commit of everything recorded since
the last one (with the store guard's verdict on it). At the end, `settle_store` commits the
last rows, waiting out a store problem as long as store_error_timeout allows."""

from __future__ import annotations

import asyncio
import logging
import time

from .figures import write_live_file
from .store_guard import rescue_note, rescue_results

STOP_RESCUE_AFTER = 3.0  # seconds of failing commits a stop waits before the rescue file

log = logging.getLogger("specgen.engine")


async def tick(engine, on_tick=None) -> None:
    """Run the periodic work until cancelled; a failure in it stops the run."""
    try:
        await _tick_forever(engine, on_tick)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.exception("periodic work failed")
        engine.stop.fail(f"internal error in the store writer: {exc!r}", event=None,
                         logged=False)
        engine.stop.now.set()


async def _tick_forever(engine, on_tick) -> None:
    eng, writer = engine.cfg.engine, engine.writer
    last_beat = 0.0
    interval = min(eng.commit_interval, 0.25)
    while True:
        asleep = time.monotonic()
        await asyncio.sleep(interval)
        now = time.monotonic()
        engine.stats.loop_stall = max(engine.stats.loop_stall, now - asleep - interval)
        engine.steering.poll()
        engine.stats.tick()
        engine.eta.sample(sum(ds.tasks.get("done", 0) + ds.tasks.get("failed", 0)
                              + ds.tasks.get("quarantined", 0) for ds in engine.datasets))
        if now - last_beat >= eng.heartbeat_interval:
            last_beat = now
            writer.batch.session = (time.time(), "running", None, None, engine.session_id)
            engine.steering.save_alarms()  # the alarm windows survive a kill -9 too
            write_live_file(engine, engine.run_dir)
        if writer.due() or writer.batch.session is not None:
            engine.book.stage_datasets(engine.datasets)
            after_commit(engine, await writer.flush_async())
        if on_tick is not None:
            on_tick()


def after_commit(engine, flushed: bool) -> None:
    verdict = engine.store_guard.check(flushed)
    if verdict.note:
        engine.events.add("store", None, None, verdict.note)
    if verdict.stop:
        engine.stop.request(verdict.stop, kind="store")
    elif verdict.halt is None and flushed:
        engine.wake()


async def settle_store(engine) -> None:
    """Commit the session's last rows, waiting out a store problem as long as
    store_error_timeout allows; what cannot be committed is written to a rescue file."""
    writer = engine.writer
    asked = time.monotonic()
    while True:
        engine.book.stage_datasets(engine.datasets)
        if await writer.flush_async():
            return
        verdict = engine.store_guard.check(False)
        if verdict.stop or engine.stop.stopping == "now":
            break
        # a stop asked for while commits fail (Ctrl-C, SIGTERM from timeout, systemd or
        # Kubernetes) does not wait out store_error_timeout: a grace period would kill the
        # process with the paid answers in memory; a few quick tries, then the rescue file
        if engine.stop.stopping and engine.stop.kind != "store" \
                and time.monotonic() - asked >= STOP_RESCUE_AFTER:
            break
        await asyncio.sleep(0.5 if engine.stop.stopping else 1.0)
    held = writer.held_results
    where = rescue_results(writer.batch, engine.run_dir, engine.session_id)
    saved = f"; {rescue_note(where, engine.run_dir)}" if where else ""
    problem = writer.problem
    what = (f"store error: {problem.message if problem else 'commit failed'}; "
            f"{held} answer(s) could not be committed{saved}")
    if engine.stop.stopping and not verdict.stop:
        # the stop stands (exit 5, or 3 for --now): what was held is in the rescue file
        engine.stop.reason = f"{engine.stop.reason}; {what}"
        log.error("%s", what)
        return
    engine.stop.fatal = what
    log.error("%s", engine.stop.fatal)
