"""The read side of `mode = "batch"` (docs/batch.md): what `status`, the run summary and the
live view show of a run's batches, read from the store's `batches` and `batch_lines`."""

from __future__ import annotations

import sqlite3
from typing import Any

from .store import Store

BATCH_STATES = ("intent", "validating", "in_progress", "finalizing", "cancelling", "completed",
                "failed", "expired", "cancelled", "lost")


def batch_figures(store: Store, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The run's batches by state, their lines by outcome (`waiting`, `ok`, `error:<class>`),
    and what the run saved against live prices (its cost at `[budget] batch_price_factor`);
    None when the run never submitted a batch."""
    c = store.conn
    try:
        rows = c.execute("SELECT state, COUNT(*), COALESCE(SUM(lines), 0), "
                         "COALESCE(SUM(completed), 0), COALESCE(SUM(failed), 0) "
                         "FROM batches GROUP BY state").fetchall()
    except sqlite3.OperationalError:  # a store made before batch mode, opened read-only
        return None
    if not rows:
        return None
    by_state = {s: {"batches": n, "lines": lines, "completed": done, "failed": failed}
                for s, n, lines, done, failed in rows}
    outcomes = {("waiting" if o is None else o): n for o, n in c.execute(
        "SELECT outcome, COUNT(*) FROM batch_lines GROUP BY outcome")}
    factor = (cfg.get("budget") or {}).get("batch_price_factor")
    factor = 0.5 if factor is None else float(factor)
    ((cost,),) = c.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM totals")
    return {
        "batches": sum(v["batches"] for v in by_state.values()),
        "by_state": {s: by_state[s] for s in BATCH_STATES if s in by_state},
        "lines": outcomes,
        "price_factor": factor,
        "live_price_usd": round(cost / factor, 9),
        "saved_usd": round(cost / factor - cost, 9),
    }


def batch_summary_line(figures: dict[str, Any]) -> str:
    """The run summary's line about batches."""
    states = ", ".join(f"{s} {v['batches']}" for s, v in figures["by_state"].items())
    lines = figures["lines"]
    waiting = lines.get("waiting", 0)
    failed = sum(n for o, n in lines.items() if o.startswith("error:"))
    return (f"batches: {figures['batches']} ({states}); lines {lines.get('ok', 0):,} answered, "
            f"{failed:,} retried, {waiting:,} waiting; saved ${figures['saved_usd']:.4f} against "
            f"live prices (${figures['live_price_usd']:.4f} at {figures['price_factor']:g}x)")
