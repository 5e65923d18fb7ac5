"""The read side of `mode = "batch"` (docs/batch.md): what `status`, the run summary and the
live view show of a run's batches, read from the store's `batches` and `batch_lines`."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from .store import Store

RUNNING = ("validating", "in_progress", "finalizing", "cancelling")
BATCH_STATES = ("intent", "sending", "validating", "in_progress", "finalizing", "cancelling",
                "completed", "failed", "expired", "cancelled", "lost", "unreadable")


def batch_rows(store: Store) -> list[dict[str, Any]] | None:
    """Every batch of the run, oldest first, with its lines by our outcome (`answered`: a
    line whose answer went through the answer stages; `errors`: one that came back as an error
    and was retried; `waiting`: not collected yet) beside the provider's own counts
    (`provider_completed`, `provider_failed`: a line the provider counts completed can still be
    an error to us, e.g. an error in a 200 body). The one source of every batch figure that
    `status`, the summary and the report show. None for a store from before batch mode."""
    c = store.conn
    try:
        rows = c.execute(
            "SELECT id, provider_id, session, state, lines, completed, failed, created_at, "
            "updated_at FROM batches ORDER BY created_at").fetchall()
        ours: dict[str, dict[str, int]] = {}
        for batch, outcome, n in c.execute(
                "SELECT batch, outcome, COUNT(*) FROM batch_lines GROUP BY 1, 2"):
            kind = ("waiting" if outcome is None else
                    "errors" if outcome.startswith("error:") else "answered")
            d = ours.setdefault(batch, {"answered": 0, "errors": 0, "waiting": 0})
            d[kind] += n
    except sqlite3.OperationalError:  # a store made before batch mode, opened read-only
        return None
    return [{"id": bid, "provider_id": pid, "session": session, "state": state,
             "lines": _count(lines), **ours.get(bid, {"answered": 0, "errors": 0, "waiting": 0}),
             # a provider's counts as stored: junk a hostile poll left is no count
             "provider_completed": _count(done), "provider_failed": _count(failed),
             "created_at": created, "updated_at": updated}
            for bid, pid, session, state, lines, done, failed, created, updated in rows]


def batch_figures(store: Store, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The run's batches by state, their lines by outcome (`waiting`, `ok`, `error:<class>`),
    and what the run saved against live prices (its cost at `[budget] batch_price_factor`);
    None when the run never submitted a batch. Per state, `completed` / `failed` count the
    lines as the run judged them (as `lines` does: answered / came back as errors), and
    `provider_completed` / `provider_failed` the provider's own counts."""
    c = store.conn
    rows = batch_rows(store)
    if not rows:
        return None
    by_state: dict[str, dict[str, int]] = {}
    for b in rows:
        v = by_state.setdefault(b["state"], {"batches": 0, "lines": 0, "completed": 0,
                                             "failed": 0, "provider_completed": 0,
                                             "provider_failed": 0})
        v["batches"] += 1
        v["lines"] += b["lines"]
        v["completed"] += b["answered"]
        v["failed"] += b["errors"]
        v["provider_completed"] += b["provider_completed"]
        v["provider_failed"] += b["provider_failed"]
    outcomes = {("waiting" if o is None else o): n for o, n in c.execute(
        "SELECT outcome, COUNT(*) FROM batch_lines GROUP BY outcome")}
    running = running_batches(store)
    etas = [b["eta_s"] for b in running if b["eta_s"] is not None]
    factor = (cfg.get("budget") or {}).get("batch_price_factor")
    factor = 0.5 if factor is None else float(factor)
    ((cost,),) = c.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM totals")
    return {
        "batches": len(rows),
        "by_state": {s: by_state[s] for s in BATCH_STATES if s in by_state},
        "lines": outcomes,
        "running": running,
        "eta_s": max(etas) if etas else None,
        "price_factor": factor,
        "live_price_usd": round(cost / factor, 9),
        "saved_usd": round(cost / factor - cost, 9),
    }


def batch_eta(total: int, done: int, since: Any, polled: float | None,
              now: float) -> float | None:
    """Seconds until a running batch is done: its `total - done` lines at the rate the
    provider answered `done` lines from `since` (in progress) to `polled` (when those counts
    were seen), less the time since; None until it has done some lines."""
    if not since or not done or not total or not polled:
        return None
    rate = done / max(polled - float(since), 1e-3)
    return round(max((total - done) / rate - (now - polled), 0.0), 1)


def running_batches(store: Store) -> list[dict[str, Any]]:
    """The batches not ended yet, each with its provider's progress and its ETA."""
    marks = ",".join("?" * len(RUNNING))
    try:
        rows = store.conn.execute(
            "SELECT id, provider_id, state, lines, completed, failed, in_progress_at, "
            f"updated_at FROM batches WHERE state IN ({marks}) ORDER BY created_at",
            RUNNING).fetchall()
    except sqlite3.OperationalError:  # an older store, opened read-only
        return []
    now = time.time()
    out = []
    for bid, pid, state, lines, done, failed, since, polled in rows:
        # a store written by an older version may hold a provider's junk: never a crash
        lines, done, failed = _count(lines), _count(done), _count(failed)
        since = since if isinstance(since, int | float) else None
        polled = polled if isinstance(polled, int | float) else None
        out.append({"id": bid, "provider_id": pid, "state": state, "lines": lines,
                    "completed": done, "failed": failed,
                    "eta_s": batch_eta(lines, done + failed, since, polled, now)})
    return out


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def batch_summary_line(figures: dict[str, Any]) -> str:
    """The run summary's line about batches."""
    states = ", ".join(f"{s} {v['batches']}" for s, v in figures["by_state"].items())
    lines = figures["lines"]
    waiting = lines.get("waiting", 0)
    failed = sum(n for o, n in lines.items() if o.startswith("error:"))
    eta = "" if figures.get("eta_s") is None else f"; ETA {figures['eta_s']:.0f}s"
    return (f"batches: {figures['batches']} ({states}); lines {lines.get('ok', 0):,} answered, "
            f"{failed:,} retried, {waiting:,} waiting{eta}; saved ${figures['saved_usd']:.4f} against "
            f"live prices (${figures['live_price_usd']:.4f} at {figures['price_factor']:g}x)")
