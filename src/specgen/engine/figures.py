"""What only the running process knows, for the live view and `specgen status` (through
`live.json`): in-flight figures, why concurrency is below its maximum, the store's trouble,
and the progress and ETA per dataset (docs/engine.md, "Status")."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import orjson

from ..display import clean_floats
from .progress import dataset_figures, plan, rows_total, run_eta

log = logging.getLogger("specgen.engine")

LIVE_FILE = "live.json"  # figures of the running session, for `specgen status`


def progress(engine) -> dict[str, Any]:
    """Planned requests and progress per dataset, and the ETA over all of them."""
    totals = {ds.name: rows_total(ds, engine.row_counters.get(ds.name))
              for ds in engine.datasets}
    plans = {ds.name: plan(dataset_figures(ds, engine.budget.datasets[ds.name],
                                           totals[ds.name])) for ds in engine.datasets}
    eta, lower = run_eta(list(plans.values()), engine.eta)
    return {"plans": plans, "eta_s": eta, "eta_lower_bound": lower, "rows_total": totals}


def progress_json(engine) -> dict[str, Any]:
    """`progress()` for live.json: per dataset and the ETA."""
    p = progress(engine)
    return {
        "eta_s": None if p["eta_s"] is None else round(p["eta_s"], 1),
        "eta_lower_bound": p["eta_lower_bound"],
        "datasets": {name: {
            "planned_requests": round(pl.requests), "planned": pl.kind,
            "fraction": None if pl.fraction is None else round(pl.fraction, 4),
            "basis": pl.basis, "label": pl.label(), "rows_total": p["rows_total"][name],
        } for name, pl in p["plans"].items()},
    }


def store_problem(writer) -> dict[str, Any] | None:
    p = writer.problem
    if p is None:
        return None
    return {"kind": p.kind, "message": p.message, "since": p.since,
            "held_answers": writer.held_results}


def live_figures(engine) -> dict[str, Any]:
    """Everything `live.json` holds."""
    rps, tps = engine.stats.rate.rates()
    limit, reason = engine.concurrency()
    return {
        "session": engine.session_id, "ts": time.time(), "stopping": engine.stopping,
        "in_flight": len(engine.inflight), "concurrency_limit": limit,
        "concurrency_reason": reason,
        "max_concurrency": engine.limit.maximum, "concurrency_backoffs": engine.limit.backoffs,
        "in_flight_budget": engine.spend_window.to_json(), "endpoint": engine.health.to_json(),
        "count_witness": engine.witness.to_json(),
        "quality": engine.quality.to_json(), "excluded_providers": engine.policy.excluded,
        "alarms_fired": engine.alarms_fired,
        "store_problem": store_problem(engine.writer),
        "retrying": len(engine.retries), "open_conversations": engine.open_convs,
        "requests_per_s": round(rps, 3), "completion_tokens_per_s": round(tps, 1),
        "errors": dict(engine.stats.errors),
        "providers": {k: v.to_json() for k, v in engine.stats.providers.items()},
        "prices": engine.budget.prices.to_json(),
        "reserved_cost_usd": round(engine.budget.reserved_cost, 6),
        "progress": progress_json(engine),
        **({"batches": engine.batch.figures()} if engine.batch is not None else {}),
    }


def write_live_file(engine, run_dir: Path) -> None:
    path = run_dir / LIVE_FILE
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_bytes(orjson.dumps(clean_floats(live_figures(engine))))
        os.replace(tmp, path)
    except OSError as exc:  # cosmetic: never stop a run for it
        log.debug("could not write %s: %s", path, exc)
