"""The numbers of a run report, read from the store with SQL (no sample blobs are decoded)."""

from __future__ import annotations

import math
import sqlite3
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..display import UNKNOWN_PROVIDER
from ..judgement import judge
from ..queries import (
    conversation_shapes,
    quarantine_details,
    redo_totals,
    witness_sides_by_provider,
)

TIME_BUCKETS = 40
UNK = (UNKNOWN_PROVIDER,)  # the one label for a provider that was not named (a parameter)


@dataclass
class RunStats:
    meta: dict[str, str]
    config: dict[str, Any]
    sessions: list[dict[str, Any]]
    datasets: list[dict[str, Any]]
    providers: list[dict[str, Any]]
    conversations: Counter
    end_reasons: Counter
    tasks: Counter
    lengths: dict[str, list[int]]  # dataset -> completion lengths (our ids)
    finish_reasons: dict[str, Counter]  # dataset -> finish_reason -> n
    native_finish_reasons: Counter
    error_classes: Counter
    errors_over_time: dict[str, Any]  # {"t0", "width", "buckets", "series": {class: [n...]}}
    events: Counter
    recent_events: list[dict[str, Any]]
    latency: dict[str, dict[str, list[float]]]  # provider ("all") -> {"first_token", "total"}
    repairs: Counter
    flags: Counter  # `flag:` observations on kept samples (nothing was changed)
    quarantine: Counter
    quarantine_by: list[tuple[str, str, str, int]]  # (reason, dataset, provider, n)
    quarantine_details: dict[str, dict[str, dict[str, Any]]]  # {dataset: {reason: figures}}
    task_errors: Counter
    invalid_rows: int
    totals: dict[str, Any] = field(default_factory=dict)
    # dataset -> turns per conversation, early ends, samples by weakest tool-result match
    shapes: dict[str, dict[str, Any]] = field(default_factory=dict)
    judgement: Any = None  # specgen.judgement.Judgement: the run's yield over every session
    redone: dict[str, Any] | None = None  # excluded providers' work made again (engine.redo)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of unsorted values; None when empty."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def error_class(outcome: str) -> str:
    """`retry:rate_limited` -> `rate_limited`; `rejected:provider` -> `rejected:provider`."""
    kind, _, rest = outcome.partition(":")
    if kind in ("retry", "fatal") and rest:
        return rest
    return outcome


def collect(store) -> RunStats:
    """All report numbers from an open store (call inside `read_snapshot`)."""
    q = store.conn.execute
    meta = store.meta()
    try:
        config = orjson.loads(meta.get("config_json") or "{}")
    except orjson.JSONDecodeError:
        config = {}

    sessions = [dict(zip(("id", "pid", "host", "started_at", "heartbeat_at", "ended_at", "state",
                          "stop_reason"), r, strict=True))
                for r in q("SELECT id, pid, host, started_at, heartbeat_at, ended_at, state, "
                           "stop_reason FROM sessions ORDER BY id")]

    per_ds: dict[str, dict[str, Any]] = {}
    for r in q("SELECT name, position, rows_read, rows_invalid, rows_duplicate, rows_other_shard,"
               " exhausted, state FROM datasets ORDER BY position"):
        per_ds[r[0]] = {"dataset": r[0], "rows_read": r[2], "rows_invalid": r[3],
                        "rows_duplicate": r[4], "rows_other_shard": r[5],
                        "exhausted": bool(r[6]), "state": r[7]}
    blank = {"samples": 0, "prompt_tokens": 0, "completion_tokens": 0, "reasoning_tokens": 0,
             "sample_tokens": 0, "trained_tokens": 0, "cost_usd": 0.0, "billed_usd": 0.0,
             "attempts": 0, "failed_attempts": 0, "conversations": 0}
    for d in per_ds.values():
        d.update(blank)
    for r in q("SELECT dataset, COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), "
               "SUM(reasoning_tokens), SUM(length(input_ids) / 4), "
               "SUM(length(input_ids) / 4 - n_prompt), SUM(cost_usd) FROM results "
               "GROUP BY dataset"):
        d = per_ds.setdefault(r[0], {"dataset": r[0], **blank})
        d.update(samples=r[1], prompt_tokens=r[2] or 0, completion_tokens=r[3] or 0,
                 reasoning_tokens=r[4] or 0, sample_tokens=r[5] or 0, trained_tokens=r[6] or 0,
                 cost_usd=r[7] or 0.0)
    # attempts and what they cost: the store's totals, as `specgen status` reads them
    kept = store.result_totals()
    for ds, spent in store.spend().items():
        if ds is None:
            continue
        d = per_ds.setdefault(ds, {"dataset": ds, **blank})
        attempts = int(spent["attempts"])
        d.update(attempts=attempts, billed_usd=spent["cost_usd"],
                 failed_attempts=attempts - int((kept.get(ds) or {}).get("samples", 0)))
    for r in q("SELECT dataset, COUNT(*) FROM conversations GROUP BY dataset"):
        if r[0] in per_ds:
            per_ds[r[0]]["conversations"] = r[1]

    providers: dict[str, dict[str, Any]] = defaultdict(lambda: {
        "samples": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0,
        "attempts": 0, "failed_attempts": 0, "billed_usd": 0.0})
    for r in q("SELECT COALESCE(provider, ?), COUNT(*), SUM(prompt_tokens), "
               "SUM(completion_tokens), SUM(cost_usd) FROM results GROUP BY 1", UNK):
        providers[r[0]].update(samples=r[1], prompt_tokens=r[2] or 0,
                               completion_tokens=r[3] or 0, cost_usd=r[4] or 0.0)
    for name, v in store.provider_totals().items():  # as `specgen status` reads them
        providers[name].update(attempts=v["requests"], billed_usd=v["cost_usd"],
                               failed_attempts=v["requests"] - v["outcomes"].get("ok", 0))
    try:  # what each provider's own token counts said of its kept samples
        checks = q("SELECT COALESCE(provider, ?), COALESCE(count_check, 'unchecked'), "
                   "COUNT(*) FROM results GROUP BY 1, 2 ORDER BY 1, 2", UNK).fetchall()
    except sqlite3.OperationalError:  # an older store opened read-only: no such column
        checks = []
    for provider, check, n in checks:
        providers[provider].setdefault("count_checks", {})[check] = n
    for provider, sides in witness_sides_by_provider(store).items():  # both sides
        if provider in providers:
            providers[provider]["witness_sides"] = sides

    lengths: dict[str, list[int]] = defaultdict(list)
    finish: dict[str, Counter] = defaultdict(Counter)
    native: Counter = Counter()
    repairs: Counter = Counter()
    flags: Counter = Counter()
    for ds, n, fr, nfr, rep in q(
            "SELECT dataset, length(input_ids) / 4 - n_prompt, finish_reason, "
            "native_finish_reason, repairs FROM results"):
        lengths[ds].append(n)
        finish[ds][fr or "?"] += 1
        if nfr:
            native[nfr] += 1
        if rep and rep != "[]":
            try:
                for name in map(str, orjson.loads(rep)):
                    if name.startswith("flag:"):
                        flags[name[5:]] += 1
                    else:
                        repairs[name] += 1
            except orjson.JSONDecodeError:
                repairs["(unreadable repairs field)"] += 1

    errors: Counter = Counter()
    times: list[tuple[float, str]] = []
    latency: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"first_token": [],
                                                                       "total": []})
    have = {row[1] for row in q("PRAGMA table_info(attempts)")}
    first_token = "first_token_at" if "first_token_at" in have else "NULL"  # older stores
    for outcome, provider, started, first, ended in q(
            f"SELECT outcome, COALESCE(provider, ?), started_at, {first_token}, ended_at "
            "FROM attempts", UNK):
        if outcome == "ok":
            for key in ("all", provider):
                if started is not None and first is not None:
                    latency[key]["first_token"].append(first - started)
                if started is not None and ended is not None:
                    latency[key]["total"].append(ended - started)
            continue
        cls = error_class(outcome)
        errors[cls] += 1
        ts = ended if ended is not None else started
        if ts is not None:
            times.append((ts, cls))

    events: Counter = Counter(dict(q("SELECT kind, COUNT(*) FROM events GROUP BY kind")))
    recent = [dict(zip(("ts", "session", "kind", "dataset", "provider", "detail"), r, strict=True))
              for r in q("SELECT ts, session, kind, dataset, provider, detail FROM events "
                         "WHERE kind NOT LIKE 'retry:%' ORDER BY ts DESC, id DESC LIMIT 30")]

    quarantine = Counter(dict(q("SELECT reason, COUNT(*) FROM quarantine GROUP BY reason")))
    quarantine_by = [tuple(r) for r in q(
        "SELECT reason, COALESCE(dataset, '?'), COALESCE(provider, ?), COUNT(*) "
        "FROM quarantine GROUP BY 1, 2, 3 ORDER BY 4 DESC, 1, 2, 3", UNK)]
    stats = RunStats(
        meta=meta, config=config, sessions=sessions, datasets=list(per_ds.values()),
        providers=[{"provider": k, **v} for k, v in sorted(providers.items())],
        conversations=Counter(dict(q("SELECT status, COUNT(*) FROM conversations GROUP BY 1"))),
        end_reasons=Counter(dict(q("SELECT end_reason, COUNT(*) FROM conversations "
                                   "WHERE end_reason IS NOT NULL GROUP BY 1"))),
        tasks=sum((Counter(v) for v in store.task_counts().values()), Counter()),
        lengths=dict(lengths), finish_reasons=dict(finish), native_finish_reasons=native,
        error_classes=errors, errors_over_time=_buckets(times), events=events,
        recent_events=recent, latency=dict(latency), repairs=repairs, flags=flags,
        quarantine=quarantine,
        quarantine_by=quarantine_by,
        quarantine_details=quarantine_details(store),
        task_errors=Counter(dict(q("SELECT COALESCE(error, '?'), COUNT(*) FROM tasks "
                                   "WHERE status = 'failed' GROUP BY 1"))),
        invalid_rows=q("SELECT COUNT(*) FROM invalid_rows").fetchone()[0],
    )
    stats.totals = _totals(stats)
    stats.shapes = conversation_shapes(store)
    stats.judgement = judge(store)
    stats.redone = redo_totals(store.conn)
    return stats


def _buckets(times: list[tuple[float, str]]) -> dict[str, Any]:
    if not times:
        return {"t0": None, "width": 0.0, "buckets": 0, "series": {}}
    t0 = min(t for t, _ in times)
    span = max(t for t, _ in times) - t0
    n = TIME_BUCKETS if span > 0 else 1
    width = span / n if span > 0 else 1.0
    series: dict[str, list[int]] = defaultdict(lambda: [0] * n)
    for t, cls in times:
        series[cls][min(n - 1, int((t - t0) / width))] += 1
    return {"t0": t0, "width": width, "buckets": n, "series": dict(sorted(series.items()))}


def _totals(s: RunStats) -> dict[str, Any]:
    keys = ("samples", "prompt_tokens", "completion_tokens", "reasoning_tokens", "sample_tokens",
            "trained_tokens", "cost_usd", "billed_usd", "attempts", "failed_attempts")
    out = {k: sum(d.get(k) or 0 for d in s.datasets) for k in keys}
    budget = (s.config.get("budget") or {}).get("max_cost_usd")
    out["max_cost_usd"] = budget
    starts = [x["started_at"] for x in s.sessions if x["started_at"]]
    ends = [x["ended_at"] or x["heartbeat_at"] for x in s.sessions if x["ended_at"] or x["heartbeat_at"]]
    out["started_at"] = min(starts) if starts else None
    out["last_activity_at"] = max(ends) if ends else None
    return out
