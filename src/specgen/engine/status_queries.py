"""Read-only questions about a run's store that the engine, `status` and the run summary
share."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ..store import Store


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
        out.setdefault(provider or "(unknown)", {})[check or "unchecked"] = n
    return out


def vouched_deltas(store: Store, per_provider: int = 50) -> list[tuple[str, int | None, int]]:
    """(provider, prompt delta, completion delta) of the latest samples each provider's own
    counts vouched for (`exact` / `repaired`): provider's count − ours."""
    try:
        rows = store.conn.execute(
            "SELECT provider, prompt_tokens - n_prompt, "
            "completion_tokens - (LENGTH(input_ids) / 4 - n_prompt) FROM ("
            "  SELECT provider, prompt_tokens, completion_tokens, n_prompt, input_ids, "
            "  ROW_NUMBER() OVER (PARTITION BY provider ORDER BY task DESC) AS k "
            "  FROM results WHERE count_check IN ('exact', 'repaired') "
            "  AND completion_tokens IS NOT NULL AND provider IS NOT NULL) WHERE k <= ?",
            (per_provider,)).fetchall()
    except sqlite3.OperationalError:
        return []
    return [(p, dp, dc) for p, dp, dc in rows]
