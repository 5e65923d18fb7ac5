"""Whether a run produced samples, judged over the whole run from its store (docs/engine.md,
"Exit codes": exit 6, `unproductive`).

A run whose work is over but that kept no sample, or kept less than `[quality]
min_kept_share` of the tasks that were answered, did not succeed: the judgement names the
cause (invalid source rows, the largest quarantine reason) and the change that fixes it. It
reads only the store, so a rerun without a change reaches the same verdict; the engine, the
run summary, `status` and the report share it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .store import Store

DEFAULT_MIN_KEPT_SHARE = 0.5
FIRST_REASONS = 3  # invalid-row reasons quoted in a message

# What to change for the commonest quarantine reasons (docs/quality.md, "Quarantine").
_FIXES = {
    "length": "raise `max_tokens` ([sampling] or the dataset's), or keep cut answers with "
              "the dataset's `on_length = \"keep\"`",
    "truncated": "raise `max_tokens`, or try another provider",
    "count_mismatch": "the providers' token counts contradict ours: check `[target] tokenizer` "
                      "/ `renderer`, allow another provider, or set `[quality] count_witness = "
                      "false` (or `on_count_mismatch = \"flag\"`)",
    "no_witness": "no provider count backs the samples: set `[quality] require_witness = "
                  "false`, or allow a provider that reports usage",
    "unverified": "set `[quality] require_witness = false`, or allow a provider that reports "
                  "usage",
}
_PROVIDER_FIX = ("the answers are malformed: run `specgen probe` and allow a provider that "
                 "passes it (`[endpoint.provider] only` / `ignore`, or `specgen provider "
                 "--exclude NAME`)")


@dataclass(slots=True)
class Judgement:
    """The run's yield. `verdict` is None when the run is productive (or nothing was asked
    of it yet); otherwise the cause and the fix in one line."""

    kept: int = 0
    quarantined: int = 0
    invalid_rows: int = 0
    rows_read: int = 0
    min_kept_share: float = DEFAULT_MIN_KEPT_SHARE
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    invalid_reasons: list[str] = field(default_factory=list)  # the first ones, with lines
    formats: dict[str, str] = field(default_factory=dict)  # dataset -> format declared
    verdict: str | None = None

    @property
    def answered(self) -> int:
        return self.kept + self.quarantined

    def as_json(self) -> dict[str, Any]:
        return {"kept": self.kept, "answered": self.answered, "quarantined": self.quarantined,
                "invalid_rows": self.invalid_rows, "rows_read": self.rows_read,
                "min_kept_share": self.min_kept_share,
                "quarantine_reasons": self.quarantine_reasons,
                "invalid_reasons": self.invalid_reasons, "verdict": self.verdict}


def stored_min_kept_share(store: Store) -> float:
    """`[quality] min_kept_share` of the config the store was last run with."""
    try:
        cfg = json.loads(store.meta().get("config_json") or "{}")
        value = (cfg.get("quality") or {}).get("min_kept_share", DEFAULT_MIN_KEPT_SHARE)
        return float(value)
    except (ValueError, TypeError, AttributeError):
        return DEFAULT_MIN_KEPT_SHARE


def invalid_row_lines(store: Store, datasets: Sequence[str] | None = None,
                      limit: int = FIRST_REASONS) -> list[str]:
    """The first invalid source rows as "dataset line N: reason"."""
    sql = "SELECT dataset, row_index, line, reason FROM invalid_rows"
    args: list[Any] = []
    if datasets:
        sql += f" WHERE dataset IN ({','.join('?' * len(datasets))})"
        args.extend(datasets)
    rows = store.conn.execute(sql + " ORDER BY dataset, row_index LIMIT ?",
                              [*args, limit]).fetchall()
    return [f"{ds} {'line ' + str(line) if line else 'row ' + str(idx + 1)}: {reason}"
            for ds, idx, line, reason in rows]


def judge(store: Store, datasets: Sequence[str] | None = None,
          min_kept_share: float | None = None) -> Judgement:
    """The run's yield over every session in `store` (the configured `datasets`, or all)."""
    share = stored_min_kept_share(store) if min_kept_share is None else min_kept_share
    where, args = "", []
    if datasets:
        where = f" WHERE dataset IN ({','.join('?' * len(datasets))})"
        args = list(datasets)
    j = Judgement(min_kept_share=share)
    for status, n in store.conn.execute(
            f"SELECT status, COUNT(*) FROM tasks{where} GROUP BY status", args):
        if status == "done":
            j.kept = n
        elif status == "quarantined":
            j.quarantined = n
    for reason, n in store.conn.execute(
            f"SELECT reason, COUNT(*) FROM quarantine{where} GROUP BY reason "
            "ORDER BY COUNT(*) DESC, reason", args):
        j.quarantine_reasons[reason] = n
    where_name = where.replace("dataset IN", "name IN")
    for name, fmt, read, invalid in store.conn.execute(
            f"SELECT name, format, rows_read, rows_invalid FROM datasets{where_name}", args):
        j.formats[name] = fmt or "auto"
        j.rows_read += read or 0
        j.invalid_rows += invalid or 0
    stored_invalid = store.conn.execute(f"SELECT COUNT(*) FROM invalid_rows{where}",
                                        args).fetchone()[0]
    j.invalid_rows = max(j.invalid_rows, stored_invalid)
    j.invalid_reasons = invalid_row_lines(store, datasets)
    j.verdict = _verdict(j)
    return j


def _verdict(j: Judgement) -> str | None:
    if j.kept and j.kept >= j.min_kept_share * j.answered:
        return None
    if not j.answered and not j.invalid_rows:
        return None  # nothing read or nothing asked yet (an empty source, a limit of 0)
    if not j.answered:
        return (f"no sample: all {j.invalid_rows:,} source row(s) read were invalid "
                f"({'; '.join(j.invalid_reasons)}); {_format_fix(j)}")
    head = (f"no sample kept of {j.answered:,} answered task(s)" if not j.kept else
            f"only {j.kept:,} of {j.answered:,} answered task(s) kept "
            f"({j.kept / j.answered:.0%} < [quality] min_kept_share {j.min_kept_share:g})")
    parts = [head]
    if j.quarantine_reasons:
        reason, n = next(iter(j.quarantine_reasons.items()))
        parts.append(f"largest quarantine reason {reason} x{n:,}: "
                     f"{_FIXES.get(reason, _PROVIDER_FIX)}")
    if j.invalid_rows:
        parts.append(f"{j.invalid_rows:,} invalid source row(s) ({'; '.join(j.invalid_reasons)}"
                     f"): {_format_fix(j)}")
    return "; ".join(parts)


def _format_fix(j: Judgement) -> str:
    declared = ", ".join(f"{name}: format = {fmt!r}" for name, fmt in j.formats.items())
    return (f"check the dataset's `format` ({declared}; `specgen preview CONFIG` shows the "
            f"fields it found and the format they fit)")
