"""Read-only questions about a run's store that the engine, `status` and the run summary
share."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import orjson

from . import witness_sides
from .conversation import REASONING_KEYS
from .display import UNKNOWN_PROVIDER
from .store import Store, unpack_ids


def failed_tasks_by_class(store: Store, datasets: Sequence[str] | None = None
                          ) -> dict[str, dict[str, Any]]:
    """Failed tasks by error class (the first word of `tasks.error`):
    {class: {"count", "last_error", "datasets": {name: count}}}, most frequent first."""
    sql = "SELECT dataset, error FROM tasks WHERE status='failed'"
    args: list[Any] = []
    if datasets:
        sql += f" AND dataset IN ({','.join('?' * len(datasets))})"
        args.extend(datasets)
    out: dict[str, dict[str, Any]] = {}
    for dataset, error in store.conn.execute(sql + " ORDER BY id", args):
        # "kind: …" or "kind HTTP 403: …" (a class name has no blanks)
        kind = ((error or "").split(":", 1)[0].split() or ["unknown"])[0]
        entry = out.setdefault(kind, {"count": 0, "last_error": None, "datasets": {}})
        entry["count"] += 1
        entry["last_error"] = error
        entry["datasets"][dataset] = entry["datasets"].get(dataset, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["count"]))


def count_checks_by_provider(store: Store) -> dict[str, dict[str, int]]:
    """Kept samples per answering provider by what its own token counts said of them
    (`results.count_check`; "unchecked" for samples stored before the check existed)."""
    out: dict[str, dict[str, int]] = {}
    try:
        rows = store.conn.execute(
            "SELECT provider, count_check, COUNT(*) FROM results GROUP BY 1, 2").fetchall()
    except sqlite3.OperationalError:  # an older store opened read-only: no such column
        return out
    for provider, check, n in rows:
        out.setdefault(provider or UNKNOWN_PROVIDER, {})[check or "unchecked"] = n
    return out


def vouched_deltas(store: Store, per_provider: int = 200
                   ) -> list[tuple[str, int | None, int, str, str]]:
    """(provider, prompt delta, completion delta, answer form, sampled form) of the latest
    samples each provider's own counts vouched for (`exact` / `repaired`): provider's count −
    ours; the sampled form is "canonical" unless a repair names another
    (`count:sampled_form:<name>`)."""
    from .quality.repairs import sampled_form

    try:
        rows = store.conn.execute(
            "SELECT provider, prompt_tokens - n_prompt, "
            "completion_tokens - (LENGTH(input_ids) / 4 - n_prompt), message, repairs FROM ("
            "  SELECT provider, prompt_tokens, completion_tokens, n_prompt, input_ids, "
            "  message, repairs, "
            "  ROW_NUMBER() OVER (PARTITION BY provider ORDER BY task DESC) AS k "
            "  FROM results WHERE count_check IN ('exact', 'repaired') "
            "  AND completion_tokens IS NOT NULL AND provider IS NOT NULL) WHERE k <= ? "
            "ORDER BY 1", (per_provider,)).fetchall()
    except sqlite3.OperationalError:
        return []
    return [(p, dp, dc, stored_form(m), sampled_form(orjson.loads(r or "[]")))
            for p, dp, dc, m, r in rows]


def stored_form(message: Any) -> str:
    """The answer form (quality.forms) of a stored message (JSON text)."""
    try:
        m = orjson.loads(message) if isinstance(message, str | bytes) else None
    except orjson.JSONDecodeError:
        m = None
    if not isinstance(m, dict):
        return "plain"
    reasoning = any(isinstance(m.get(k), str) and m.get(k) for k in REASONING_KEYS)
    calls = bool(m.get("tool_calls"))
    return ("reasoning+tools" if calls else "reasoning") if reasoning else (
        "tools" if calls else "plain")


def witness_sides_by_provider(store: Store) -> dict[str, dict[str, Any]]:
    """Per answering provider, both sides of the count witness over its kept samples
    (docs/quality.md, "Two sides"): {"prompt": {check: n}, "completion": {check: n},
    "prompt_deltas": {"+9": n, ...}} (the deltas of prompts judged its rendering or exact)."""
    out: dict[str, dict[str, Any]] = {}
    try:
        rows = store.conn.execute(
            "SELECT provider, prompt_check, completion_check, "
            "CASE WHEN prompt_check IN ('rendering', 'exact') THEN prompt_delta END, COUNT(*) "
            "FROM results WHERE completion_check IS NOT NULL GROUP BY 1, 2, 3, 4").fetchall()
    except sqlite3.OperationalError:  # an older store opened read-only: no such columns
        return out
    for provider, p_check, c_check, delta, n in rows:
        witness_sides.add(out.setdefault(provider or UNKNOWN_PROVIDER, witness_sides.empty()),
                          p_check, c_check, delta, n)
    return out


def prompt_shape_deltas(store: Store) -> list[tuple]:
    """(provider, shape, prompt delta, prompt_check, task, completion_check) of
    every sample whose prompt side was judged per request shape (docs/quality.md)."""
    try:
        return store.conn.execute(
            "SELECT provider, prompt_shape, prompt_delta, prompt_check, task, "
            "completion_check FROM results WHERE prompt_shape IS NOT NULL "
            "AND prompt_delta IS NOT NULL AND provider IS NOT NULL "
            "AND prompt_check NOT IN ('mismatch', 'unjudged', 'shortfall', 'implausible', "
            "'history') ORDER BY task").fetchall()
    except sqlite3.OperationalError:
        return []


def pending_completions(store: Store) -> list[tuple]:
    """(provider, task, prompt_check, provider's completion count, completion delta, our
    completion ids stored, its count repairs) of every sample whose completion side was
    left waiting for its provider's offset (a session that ended without settling)."""
    try:
        rows = store.conn.execute(
            "SELECT provider, task, prompt_check, completion_tokens, completion_delta, "
            "input_ids, n_prompt, repairs, message FROM results WHERE completion_check = "
            "'pending' AND provider IS NOT NULL ORDER BY task").fetchall()
    except sqlite3.OperationalError:
        return []
    return [(provider, task, p_check, theirs, dc, len(unpack_ids(ids) or ()) - n_prompt,
             [r[len("count:"):] for r in orjson.loads(repairs or "[]")
              if r.startswith("count:")], stored_form(message))
            for provider, task, p_check, theirs, dc, ids, n_prompt, repairs, message in rows]


def conversation_shapes(store: Store) -> dict[str, dict[str, Any]]:
    """Per dataset: how many samples (regenerated turns) its conversations gave
    ({"turns_per_conversation": {"n": conversations}}, conversations without one left out), why conversations ended early
    ({"end_reasons": {reason: n}}) and its samples whose prompt reuses recorded tool results,
    by the weakest match ({"tool_matches": {kind: n}}; empty for stores made before it)."""
    from .planner import weakest_match
    from .store import decode_tool_matches

    out: dict[str, dict[str, Any]] = {}

    def entry(ds: str) -> dict[str, Any]:
        return out.setdefault(ds, {"turns_per_conversation": {}, "end_reasons": {},
                                   "tool_matches": {}})

    for ds, n, convs in store.conn.execute(
            "SELECT c.dataset, r.n, COUNT(*) FROM (SELECT conversation, COUNT(*) AS n "
            "FROM results GROUP BY conversation) r JOIN conversations c ON c.id = r.conversation "
            "GROUP BY 1, 2 ORDER BY 1, 2"):
        entry(ds)["turns_per_conversation"][str(n)] = convs
    for ds, reason, n in store.conn.execute(
            "SELECT dataset, end_reason, COUNT(*) FROM conversations "
            "WHERE end_reason IS NOT NULL GROUP BY 1, 2 ORDER BY 3 DESC"):
        entry(ds)["end_reasons"][reason] = n
    try:
        rows = store.conn.execute(
            "SELECT dataset, tool_matches, COUNT(*) FROM results "
            "WHERE tool_matches IS NOT NULL GROUP BY 1, 2").fetchall()
    except sqlite3.OperationalError:  # an older store opened read-only: no such column
        rows = []
    for ds, text, n in rows:
        kind = weakest_match(decode_tool_matches(text))
        if kind is not None:
            counts = entry(ds)["tool_matches"]
            counts[kind] = counts.get(kind, 0) + n
    return out


def quality_events(store: Store, limit: int = 20) -> list[dict[str, Any]]:
    """The latest alarms and provider exclusions / re-admissions, oldest first:
    [{"ts", "session", "kind", "dataset", "provider", "detail"}]."""
    rows = store.conn.execute(
        "SELECT ts, session, kind, dataset, provider, detail FROM events WHERE kind IN "
        "('alarm', 'provider_excluded', 'provider_allowed') ORDER BY id DESC LIMIT ?",
        (limit,)).fetchall()
    names = ("ts", "session", "kind", "dataset", "provider", "detail")
    return [dict(zip(names, r, strict=True)) for r in reversed(rows)]


def conversation_counts(counts: dict[str, int], end_reasons: dict[str, int] | None = None
                        ) -> str:
    """`done 48, ended early 11 (quarantined:length 9, ...), pending 4`: conversations by
    status, in words ("ended" = ended early: the planner stopped before the dataset's last
    turn, or an answer was quarantined), the reasons right after the count they explain."""
    words = {"ended": "ended early"}
    order = ("done", "ended", "failed", "active", "pending")
    keys = [k for k in order if counts.get(k)] + sorted(k for k in counts if k not in order)

    def one(k: str) -> str:
        text = f"{words.get(k, k)} {counts[k]:,}"
        if k == "ended" and end_reasons:
            text += " (" + ", ".join(f"{r} {n:,}" for r, n in sorted(
                end_reasons.items(), key=lambda kv: -kv[1])) + ")"
        return text
    return ", ".join(one(k) for k in keys)


def early_end_note(end_reasons: dict[str, int] | None) -> str | None:
    """One line on whether a dataset's early conversation ends are expected: those where the
    model's answer left the recorded tool loop are (on-policy regeneration; the samples up to
    there are kept), the others (quarantines, failures) are named; None without early ends."""
    from .planner import TOOL_LOOP_ENDS

    if not end_reasons:
        return None
    loop = sum(n for r, n in end_reasons.items() if r in TOOL_LOOP_ENDS)
    other = {r: n for r, n in end_reasons.items() if r not in TOOL_LOOP_ENDS}
    parts = []
    if loop:
        parts.append(f"{loop:,} expected: the model's tool calls left the dataset's recorded "
                     "tool loop, the samples up to there kept")
    if other:
        parts.append(f"{sum(other.values()):,} not expected ("
                     + ", ".join(f"{r} {n:,}" for r, n in other.items())
                     + "): see the quarantine and failure lines")
    return "ended early: " + "; ".join(parts) + " (docs/datasets.md, \"Tool loops\")"


def quarantine_details(store: Store) -> dict[str, dict[str, dict[str, Any]]]:
    """{dataset: {reason: the figures of its latest quarantine}} (the `detail` JSON: both
    counts of a count_mismatch, ...). Reasons stored without figures, or a store from before
    the column, give none."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        rows = store.conn.execute(
            "SELECT COALESCE(dataset, '?'), reason, detail FROM quarantine WHERE id IN "
            "(SELECT MAX(id) FROM quarantine WHERE detail IS NOT NULL GROUP BY dataset, reason)"
        ).fetchall()
    except sqlite3.OperationalError:  # a read-only store from before the column
        return out
    for dataset, reason, detail in rows:
        try:
            value = json.loads(detail)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.setdefault(dataset, {})[reason] = value
    return out


def detail_text(detail: dict[str, Any]) -> str:
    """A quarantine's figures in one line: `prompt: ours 209, provider 218; completion: ...`."""
    parts = []
    for key, value in detail.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        if value not in ("", None):
            parts.append(f"{key}: {value}")
    return "; ".join(parts)


def redo_totals(conn: sqlite3.Connection) -> dict[str, Any] | None:
    """What the run redid (engine.redo): conversations, tasks reset, samples superseded, and the attempts
    made for them since (their tokens and cost). None when nothing was redone."""
    try:
        convs, tasks, samples = conn.execute(
            "SELECT COUNT(DISTINCT conversation), COALESCE(SUM(tasks), 0), "
            "COALESCE(SUM(samples), 0) FROM redone").fetchone()
    except sqlite3.OperationalError:  # a store made before redo existed
        return None
    if not convs:
        return None
    attempts, pt, ct, cost, done = conn.execute(
        "SELECT COUNT(a.id), COALESCE(SUM(a.prompt_tokens), 0), "
        "COALESCE(SUM(a.completion_tokens), 0), COALESCE(SUM(a.cost_usd), 0), "
        "COUNT(DISTINCT CASE WHEN t.status = 'done' THEN t.id END) FROM attempts a "
        "JOIN tasks t ON t.id = a.task JOIN (SELECT conversation, MIN(turn) AS turn, "
        "MIN(attempt_floor) AS floor FROM redone GROUP BY conversation) r "
        "ON r.conversation = t.conversation AND t.turn >= r.turn AND a.id > r.floor"
    ).fetchone()
    return {"conversations": convs, "tasks": tasks, "samples_superseded": samples,
            "tasks_done_again": done, "attempts": attempts, "prompt_tokens": pt,
            "completion_tokens": ct, "cost_usd": round(cost, 9)}


def redo_line(t: dict[str, Any]) -> str:
    """One line for the summary, status and report."""
    return (f"redone: {t['tasks']:,} task(s) of {t['conversations']:,} conversation(s) whose "
            f"samples came from excluded providers ({t['samples_superseded']:,} sample(s) "
            f"superseded, kept in the store, never exported); {t['tasks_done_again']:,} done "
            f"again in {t['attempts']:,} attempt(s), {t['completion_tokens']:,} completion "
            f"tokens, ${t['cost_usd']:.4f}")
