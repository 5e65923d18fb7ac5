"""The report's batch timeline (`mode = "batch"`, docs/batch.md): every batch the run
submitted, when, its state, its lines and how long it took; and what the run saved against
live prices. Added to the "Budget and stops" section when the run has batches."""

from __future__ import annotations

from typing import Any

from ..batch_queries import batch_figures, batch_rows, running_batches
from .sections import Section, Table, ts, usd


def add_batch_timeline(sections: list[Section], store: Any, config: dict[str, Any]) -> None:
    figures = batch_figures(store, config)
    if figures is None:
        return
    etas = {b["id"]: b["eta_s"] for b in running_batches(store)}
    # lines as the run judged them (as `status` counts them), then the provider's own counts
    table = Table("Batches (timeline)", ["batch", "provider id", "session", "state", "lines",
                                          "answered", "retried", "waiting",
                                          "provider: completed/failed", "submitted",
                                          "last seen", "took", "ETA"],
                  [[b["id"], b["provider_id"] or "—", str(b["session"]), b["state"],
                    b["lines"], b["answered"], b["errors"], b["waiting"],
                    f"{b['provider_completed']}/{b['provider_failed']}",
                    ts(b["created_at"]), ts(b["updated_at"]),
                    f"{b['updated_at'] - b['created_at']:,.0f}s"
                    if b["updated_at"] and b["created_at"] else "—",
                    "—" if etas.get(b["id"]) is None else f"{etas[b['id']]:,.0f}s"]
                   for b in batch_rows(store) or []])
    target = next((s for s in sections if s.id == "budget-stop"), sections[-1])
    target.tables.append(table)
    target.notes.append(
        f"batch mode: {figures['batches']} batch(es); saved {usd(figures['saved_usd'])} "
        f"against live prices ({usd(figures['live_price_usd'])} at "
        f"{figures['price_factor']:g}x the live price)")
