"""`specgen status`: a run's figures from its store, read-only, at any time.

`state` is "running" only when the last session's process is alive and heartbeating; a session
that died without recording its end (kill -9, power loss) reads as "stopped" with a reason
saying so. Figures only the running process knows (concurrency, rates) come from
`run_dir/live.json`, written at each heartbeat.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..batch_queries import batch_figures
from ..display import path as tidy
from ..judgement import invalid_row_lines, judge
from ..quality.memory import META_FIRED, cause_of, read_fired, standing
from ..queries import (
    conversation_counts,
    conversation_shapes,
    count_checks_by_provider,
    detail_text,
    early_end_note,
    failed_tasks_by_class,
    quality_events,
    quarantine_details,
    redo_totals,
    witness_sides_by_provider,
)
from ..run_outcome import session_state
from ..store import Store
from .control import heartbeat_timeout
from .figures import LIVE_FILE
from .providers import read_excluded


def _live(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = orjson.loads((run_dir / LIVE_FILE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def run_status(run_dir: str | Path) -> dict[str, Any]:
    """The status JSON of a run dir (see docs/engine.md, "Status"): the store's figures read
    once (`read_store`), the session's state (`session_state`), one entry per dataset
    (`dataset_entry`) and per provider (`provider_entries`), and what only the running process
    knows (`live_part`). `specgen status`, `status --json`, the run summary and the report's
    outcome all read this."""
    run_dir = Path(run_dir)
    now = time.time()
    with Store.open(run_dir) as store:
        r = read_store(store)
    last = r.sessions[-1] if r.sessions else None
    state, reason = session_state(last, r.heartbeat_interval, now)
    names = list(r.table) + [n for n in r.cfg_datasets if n not in r.table]
    datasets = {name: dataset_entry(name, r) for name in names}
    out: dict[str, Any] = {
        "state": state,
        "pid": last["pid"] if last and state == "running" else None,  # a current process only
        "cost_usd": round(sum(float(s.get("cost_usd", 0.0)) for s in r.spend.values()), 9),
        "stop_reason": reason,
        "datasets": datasets,
        "run_dir": tidy(run_dir),
        "model": r.meta.get("model"),
        "shard": r.meta.get("shard") or None,
        "max_cost_usd": (r.cfg.get("budget") or {}).get("max_cost_usd"),
        "prices": orjson.loads(r.meta["prices"]) if r.meta.get("prices") else None,
        "session": None,
        "sessions": len(r.sessions),
        "providers": provider_entries(r),
        "quarantined": sum(d["quarantined"] for d in datasets.values()),
        "failed": sum(d["failed"] for d in datasets.values()),
        "failures": r.failures,
        "excluded_providers": read_excluded(r.meta),
        "quality_events": r.events,
        "judgement": r.judgement.as_json(),  # the run's yield (specgen.judgement)
        "alarms": _alarms(r.meta, r.cfg),
        "redone": r.redone,
    }
    if r.batches is not None:
        out["batches"] = r.batches
    if last is not None:
        out["session"] = {
            "id": last["id"], "host": last["host"], "pid": last["pid"],
            "started_at": last["started_at"],
            "heartbeat_age_s": round(now - (last["heartbeat_at"] or now), 1),
            "ended_at": last["ended_at"],
        }
    if state == "running":
        out.update(live_part(run_dir, last, r.heartbeat_interval, now))
    return out


@dataclass(slots=True)
class StoreReads:
    """Everything `run_status` reads from the store, in one pass of one connection."""

    meta: dict[str, str]
    cfg: dict[str, Any]
    sessions: list[dict[str, Any]]
    table: dict[str, dict[str, Any]]
    tasks: dict[str, dict[str, int]]
    convs: dict[str, dict[str, int]]
    spend: dict[str, dict[str, float]]
    kept: dict[str, dict[str, float]]
    quarantine: dict[str, dict[str, int]]
    quarantine_figures: dict[str, dict[str, dict[str, Any]]]
    providers: dict[str, dict[str, Any]]
    failures: dict[str, Any]
    checks: dict[str, dict[str, int]]
    sides: dict[str, Any]
    shapes: dict[str, dict[str, Any]]
    events: list[dict[str, Any]]
    batches: dict[str, Any] | None
    judgement: Any
    invalid_first: dict[str, list[str]]
    redone: dict[str, Any] | None = None  # work of excluded providers made again (engine.redo)

    @property
    def cfg_datasets(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for d in self.cfg.get("datasets") or []}

    @property
    def heartbeat_interval(self) -> float:
        return float(self.meta.get("heartbeat_interval", "2.0"))


def read_store(store: Store) -> StoreReads:
    meta = store.meta()
    cfg = orjson.loads(meta.get("config_json", "{}"))
    table = store.datasets_table()
    return StoreReads(
        meta=meta, cfg=cfg, sessions=store.sessions(), table=table,
        tasks=store.task_counts(), convs=store.conversation_counts(), spend=store.spend(),
        kept=store.result_totals(), quarantine=store.quarantine_counts(),
        quarantine_figures=quarantine_details(store), providers=store.provider_totals(),
        failures=failed_tasks_by_class(store), checks=count_checks_by_provider(store),
        sides=witness_sides_by_provider(store), shapes=conversation_shapes(store),
        events=quality_events(store), batches=batch_figures(store, cfg), judgement=judge(store),
        invalid_first={name: invalid_row_lines(store, [name]) for name, row in table.items()
                       if row.get("rows_invalid")},
        redone=redo_totals(store.conn))


def dataset_entry(name: str, r: StoreReads) -> dict[str, Any]:
    """One dataset's figures: tasks by status, spend, kept samples, source rows, shapes."""
    t, s, k = r.tasks.get(name, {}), r.spend.get(name, {}), r.kept.get(name, {})
    row, cfg = r.table.get(name, {}), r.cfg_datasets.get(name) or {}
    done, failed = t.get("done", 0), t.get("failed", 0)
    pending, quar = t.get("pending", 0), t.get("quarantined", 0)
    return {
        "total": done + failed + pending + quar, "done": done, "failed": failed,
        "pending": pending, "quarantined": quar,
        "prompt_tokens": int(s.get("prompt_tokens", 0)),
        "completion_tokens": int(s.get("completion_tokens", 0)),
        "cost_usd": round(float(s.get("cost_usd", 0.0)), 9),
        "samples": int(k.get("samples", 0)),
        "samples_completion_tokens": int(k.get("completion_tokens", 0)),
        "attempts": int(s.get("attempts", 0)),
        "state": dataset_state(row.get("state", "active"), done, failed, pending),
        "rows_read": row.get("rows_read", 0), "rows_invalid": row.get("rows_invalid", 0),
        "invalid_reasons": r.invalid_first.get(name, []),
        "rows_duplicate": row.get("rows_duplicate", 0),
        "rows_other_shard": row.get("rows_other_shard", 0),
        "exhausted": bool(row.get("exhausted", 0)),
        "conversations": r.convs.get(name, {}),
        "turns_per_conversation": {}, "end_reasons": {}, "tool_matches": {},
        **r.shapes.get(name, {}),
        "quarantine_reasons": r.quarantine.get(name, {}),
        "quarantine_details": r.quarantine_figures.get(name, {}),
        "token_budget": cfg.get("token_budget"),
        "limit": cfg.get("limit"),
    }


def provider_entries(r: StoreReads) -> dict[str, dict[str, Any]]:
    """Per provider: attempts by outcome, tokens, cost, the samples by count check and both
    sides of the witness (docs/quality.md, "Two sides")."""
    providers = {name: dict(v) for name, v in r.providers.items()}
    for name, counts in r.checks.items():
        p = providers.setdefault(name, {"requests": 0, "outcomes": {}, "prompt_tokens": 0,
                                        "completion_tokens": 0, "cost_usd": 0.0})
        p["count_checks"] = counts
        if name in r.sides:
            p["witness_sides"] = r.sides[name]
    return providers


def live_part(run_dir: Path, last: dict[str, Any] | None, heartbeat_interval: float,
              now: float) -> dict[str, Any]:
    """What only the running process knows (live.json), when it is this session's and fresh."""
    live = _live(run_dir)
    if not live or live.get("session") != (last or {}).get("id") \
            or now - float(live.get("ts", 0)) > heartbeat_timeout(heartbeat_interval):
        return {}
    return {"live": live, "concurrency": live.get("concurrency_limit"),
            "concurrency_reason": live.get("concurrency_reason"),
            "in_flight": live.get("in_flight"), "endpoint": live.get("endpoint"),
            "store_problem": live.get("store_problem"),
            "count_witness": live.get("count_witness"), "quality": live.get("quality")}


def _alarms(meta: dict[str, str], cfg: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Fired alarms not acknowledged (quality.memory), each with `standing`: true while
    nothing it depends on changed since (a changed exclusion clears it; a changed config
    clears it when the run starts with it)."""
    if META_FIRED not in meta:
        return None  # a store from before alarms were remembered: its events tell
    now = cause_of(cfg, list(read_excluded(meta)))
    return [{**a, "standing": a.get("cause") == now}
            for a in standing(read_fired(meta.get(META_FIRED)))]


def dataset_state(state: str, done: int, failed: int, pending: int) -> str:
    """What a dataset's state means to a reader: a dataset whose work is over but whose
    tasks failed is never shown as plainly "done"."""
    if state != "done" or not failed:
        return state
    return "failed" if not done and not pending else "done_with_failures"


def conversation_lines(d: dict[str, Any]) -> list[str]:
    """Plain lines on one dataset's conversations (status JSON): conversations by status with
    the reasons of those that ended early, turns per conversation, samples reusing recorded
    tool results by their weakest match."""
    lines = []
    if d.get("conversations"):
        lines.append("conversations: " + conversation_counts(d["conversations"],
                                                           d.get("end_reasons")))
        if note := early_end_note(d.get("end_reasons")):
            lines.append(note)
    turns = d.get("turns_per_conversation") or {}
    if turns:
        n = sum(turns.values())
        mean = sum(int(k) * v for k, v in turns.items()) / n
        lines.append("turns per conversation: "
                     + ", ".join(f"{k} x{v}" for k, v in sorted(turns.items(),
                                                              key=lambda kv: int(kv[0])))
                     + f" (mean {mean:.1f})")
    if d.get("end_reasons") and not d.get("conversations"):
        lines.append("ended early: " + ", ".join(f"{k} {v:,}" for k, v in d["end_reasons"].items()))
    if d.get("tool_matches"):
        lines.append("samples reusing tool results, by weakest match: "
                     + ", ".join(f"{k} {v}" for k, v in d["tool_matches"].items()))
    if d.get("rows_invalid"):
        first = "; ".join(r.split(" ", 1)[-1] for r in d.get("invalid_reasons") or [])
        lines.append(f"invalid source rows {d['rows_invalid']:,}"
                     + (f" (first: {first})" if first else ""))
    reasons = d.get("quarantine_reasons") or {}
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        figures = (d.get("quarantine_details") or {}).get(reason)
        lines.append(f"quarantined {reason} x{n:,}"
                     + (f" (latest: {detail_text(figures)})" if figures else ""))
    return lines


def quality_cell(fig: dict | None, excluded: bool) -> str:
    """A provider's rolling quality figures in a few words (live figures; "-" when none)."""
    parts = []
    # the quarantine rate counts the reasons no other figure watches (schema, counts and
    # `length` have their own): "other quar.", so it never reads as the quarantine column
    for key, label in (("schema", "schema"), ("count", "counts"), ("quarantine", "other quar."),
                       ("mismatch", "mism.")):
        value = (fig or {}).get(key, {}).get("value")
        if value is not None:
            parts.append(f"{label} {100 * value:.0f}%")
    text = " ".join(parts) or "-"
    return f"{text} EXCLUDED" if excluded else text
