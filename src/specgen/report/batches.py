"""The report's batch timeline (`mode = "batch"`, docs/batch.md): every batch the run
submitted, when, its state, its lines and how long it took; and what the run saved against
live prices. Added to the "Budget and stops" section when the run has batches."""

from __future__ import annotations

import sqlite3
from typing import Any

from ..batch_queries import batch_figures, running_batches
from .sections import Section, Table, ts, usd


def add_batch_timeline(sections: list[Section], store: Any, config: dict[str, Any]) -> None:
    figures = batch_figures(store, config)
    if figures is None:
        return
    try:
        rows = store.conn.execute(
            "SELECT id, provider_id, session, state, lines, completed, failed, created_at, "
            "updated_at FROM batches ORDER BY created_at").fetchall()
    except sqlite3.OperationalError:
        return
    etas = {b["id"]: b["eta_s"] for b in running_batches(store)}
    table = Table("Batches (timeline)", ["batch", "provider id", "session", "state", "lines",
                                          "completed", "failed", "submitted", "last seen",
                                          "took", "ETA"],
                  [[bid, pid or "—", str(session), state, lines, completed or 0, failed or 0,
                    ts(created), ts(updated),
                    f"{updated - created:,.0f}s" if updated and created else "—",
                    "—" if etas.get(bid) is None else f"{etas[bid]:,.0f}s"]
                   for bid, pid, session, state, lines, completed, failed, created, updated
                   in rows])
    target = next((s for s in sections if s.id == "budget-stop"), sections[-1])
    target.tables.append(table)
    target.notes.append(
        f"batch mode: {figures['batches']} batch(es); saved {usd(figures['saved_usd'])} "
        f"against live prices ({usd(figures['live_price_usd'])} at "
        f"{figures['price_factor']:g}x the live price)")
