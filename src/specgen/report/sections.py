"""Report content as sections of tables and charts, shared by the HTML and text renderings."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from .. import witness_sides
from ..exclusions import read_excluded
from ..planner import TOOL_LOOP_ENDS
from ..queries import conversation_counts, detail_text, early_end_note, redo_line
from . import svg
from .stats import RunStats, percentile

SECTION_IDS = ("summary", "tokens-cost", "completion-lengths", "finish-reasons", "errors",
               "latency", "repairs-quarantine", "budget-stop", "data-quality")


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[Any]]


@dataclass
class Histogram:
    title: str
    x_label: str
    bins: list[tuple[float, float, int]]


@dataclass
class Section:
    id: str
    title: str
    tables: list[Table] = field(default_factory=list)
    charts: list[str] = field(default_factory=list)  # inline SVG (HTML only)
    histograms: list[Histogram] = field(default_factory=list)  # drawn in both renderings
    notes: list[str] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)  # shown highlighted (above a threshold)


def usd(v: float | None) -> str:
    return "—" if v is None else f"${v:,.4f}"


def ts(v: float | None) -> str:
    return "—" if v is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(v)) + "Z"


def secs(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}s"


def nice_bins(values: list[int], n: int = 20) -> list[tuple[float, float, int]]:
    """Equal-width bins of a round width covering min..max."""
    if not values:
        return []
    vmin, vmax = min(values), max(values)
    raw = max(1.0, (vmax - vmin + 1) / n)
    mag = 10 ** math.floor(math.log10(raw))
    width = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    width = max(1, int(math.ceil(width)))
    start = (vmin // width) * width
    counts = [0] * (int((vmax - start) // width) + 1)
    for v in values:
        counts[int((v - start) // width)] += 1
    return [(start + i * width, start + (i + 1) * width, c) for i, c in enumerate(counts)]


def build_sections(s: RunStats, run_dir: str) -> list[Section]:
    return [_summary(s, run_dir), _tokens_cost(s), _lengths(s), _finish(s), _errors(s),
            _latency(s), _repairs(s), _budget(s)]


def _summary(s: RunStats, run_dir: str) -> Section:
    t = s.totals
    m = s.meta
    rows = [*_outcome_rows(s),
        ["run dir", run_dir], ["model", m.get("model", "?")],
        ["renderer", m.get("renderer", "?")],
        ["thinking", {"1": "on", "0": "off"}.get(m.get("thinking", ""), "?")],
        ["config hash", m.get("config_hash", "?")],
        ["tokenizer fingerprint", (m.get("tokenizer_fingerprint") or "?")[:16]],
        ["shard", m.get("shard") or "—"],
        ["merged from", m.get("merged_from") or "—"],
        ["started", ts(t["started_at"])], ["last activity", ts(t["last_activity_at"])],
        ["samples", t["samples"]],
        ["conversations", _conversations(s)],
        ["tasks (one request of a conversation)",
         ", ".join(f"{k} {v:,}" for k, v in sorted(s.tasks.items())) or "0"],
        ["attempts (HTTP tries of the tasks)", f"{t['attempts']:,} ({t['failed_attempts']:,} "
                                               "gave no sample)"],
        ["tokens in samples", t["sample_tokens"]], ["tokens trained on (mask 1)", t["trained_tokens"]],
        ["cost of kept samples", usd(t["cost_usd"])],
        ["billed, all attempts", usd(t["billed_usd"])],
        ["invalid source rows", _invalid(s)],
        *([["redone (excluded providers' work)", redo_line(s.redone).removeprefix("redone: ")]]
          if s.redone else []),
        *_hub_rows(m),
    ]
    # the outcome, its cause and what to do open the report (its banner: specgen.run_outcome)
    return Section("summary", "Summary", [Table("Run", ["", ""], rows)])


def _hub_rows(meta: dict[str, str]) -> list[list[Any]]:
    """One row per Hub dataset: what it read (dataset, subset, split, pinned commit)."""
    from ..sources.pins import hub_pins, pin_line

    return [["Hub source", pin_line(name, pin)] for name, pin in hub_pins(meta).items()]


def _outcome_rows(s: RunStats) -> list[list[Any]]:
    """The run's outcome first: the last session's state and its yield (the reason and the
    change to make are in the banner above, never clipped)."""
    last = s.sessions[-1] if s.sessions else None
    j = s.judgement
    if j is None or not j.answered:
        yield_text = "no answered task yet"
    else:
        yield_text = (f"{j.kept:,} of {j.answered:,} answered task(s) kept "
                      f"({j.kept / j.answered:.0%}; [quality] min_kept_share "
                      f"{j.min_kept_share:g})")
    return [["outcome (last session)", last["state"] if last else "never started"],
            ["yield", yield_text]]


def _conversations(s: RunStats) -> str:
    """Conversations by status, with why those that ended early did, where it is counted."""
    text = conversation_counts(s.conversations, s.end_reasons) or "0"
    note = early_end_note(dict(s.end_reasons))
    return f"{text}; {note}" if note else text


def _invalid(s: RunStats) -> str:
    j = s.judgement
    if not s.invalid_rows:
        return "0"
    first = "; ".join(j.invalid_reasons) if j is not None else ""
    return f"{s.invalid_rows:,}" + (f" (first: {first})" if first else "")


def _tokens_cost(s: RunStats) -> Section:
    ds_rows = [[d["dataset"], d["samples"], d["conversations"], d["prompt_tokens"],
                d["completion_tokens"], d["reasoning_tokens"], d["trained_tokens"],
                usd(d["cost_usd"]), usd(d["billed_usd"]), d["attempts"], d["failed_attempts"]]
               for d in s.datasets]
    pr_rows = [[p["provider"], p["samples"], p["prompt_tokens"], p["completion_tokens"],
                usd(p["cost_usd"]), usd(p["billed_usd"]), p["attempts"], p["failed_attempts"],
                _count_checks(p.get("count_checks"))]
               for p in s.providers]
    sides = any(p.get("witness_sides") for p in s.providers)  # stores made before: none
    if sides:
        for row, p in zip(pr_rows, s.providers, strict=True):
            row.append(witness_sides.describe(p.get("witness_sides")))
    sec = Section("tokens-cost", "Tokens and cost", [
        Table("Per dataset", ["dataset", "samples", "conversations", "prompt tok", "completion tok",
                              "reasoning tok", "trained tok", "cost (kept)", "billed (all)",
                              "attempts", "failed attempts"], ds_rows),
        Table("Per provider", ["provider", "samples", "prompt tok", "completion tok",
                               "cost (kept)", "billed (all)", "attempts", "failed attempts",
                               "count checks", *(["witness sides"] if sides else [])],
              pr_rows)])
    sec.notes.append("Tokens are the API's usage counts; 'trained tok' counts our ids under loss "
                     "mask 1. 'billed (all)' adds the cost of attempts that were retried, "
                     "rejected or quarantined. An attempt is one HTTP try of a task (one "
                     "request of a conversation); 'failed attempts' gave no sample (retried, "
                     "rejected, quarantined or failed). 'count checks': the kept samples by what the "
                     "provider's own token counts said of them (count_check; docs/quality.md); 'witness "
                     "sides': the prompt side's and the completion side's verdicts apart, and "
                     "the provider's prompt deltas (its count − ours) for the request shapes "
                     "it renders its own way (docs/quality.md, \"Two sides\").")
    sec.charts.append(svg.bar_chart([(d["dataset"], d["completion_tokens"]) for d in s.datasets],
                                    title="Completion tokens per dataset"))
    sec.charts.append(svg.bar_chart([(d["dataset"], d["billed_usd"]) for d in s.datasets],
                                    title="Billed USD per dataset", value_fmt=usd))
    sec.charts.append(svg.bar_chart([(p["provider"], p["billed_usd"]) for p in s.providers],
                                    title="Billed USD per provider", value_fmt=usd))
    return sec


def _count_checks(checks: dict[str, int] | None) -> str:
    """`exact 12, mismatch 1`: a provider's kept samples by count_check."""
    return ", ".join(f"{k} {n}" for k, n in sorted((checks or {}).items())) or "—"


def _lengths(s: RunStats) -> Section:
    sec = Section("completion-lengths", "Completion lengths")
    rows = []
    for ds, values in s.lengths.items():
        rows.append([ds, len(values), percentile(values, 50), percentile(values, 90),
                     percentile(values, 99), max(values)])
        sec.histograms.append(Histogram(f"{ds}: completion length (tokens)", "tokens",
                                        nice_bins(values)))
    sec.tables.append(Table("Completion tokens per sample (our ids)",
                            ["dataset", "samples", "p50", "p90", "p99", "max"], rows))
    return sec


def _finish(s: RunStats) -> Section:
    names = sorted({k for c in s.finish_reasons.values() for k in c})
    rows = [[ds, *[c.get(n, 0) for n in names]] for ds, c in s.finish_reasons.items()]
    sec = Section("finish-reasons", "Finish reasons",
                  [Table("Finish reason of the kept samples", ["dataset", *names], rows)])
    if s.native_finish_reasons:
        sec.tables.append(Table("Native finish reasons (as the provider sent them)",
                                ["native finish reason", "samples"],
                                sorted(s.native_finish_reasons.items())))
    total = {n: sum(c.get(n, 0) for c in s.finish_reasons.values()) for n in names}
    sec.charts.append(svg.bar_chart(list(total.items()), title="Finish reasons"))
    return sec


def _errors(s: RunStats) -> Section:
    sec = Section("errors", "Errors over time", [
        Table("Attempts that did not give a sample, by class", ["class", "attempts"],
              s.error_classes.most_common())])
    e = s.errors_over_time
    if e["buckets"]:
        labels = [ts(e["t0"] + (i + 0.5) * e["width"])[11:19] for i in range(e["buckets"])]
        sec.charts.append(svg.stacked_time_bars(e["series"], title="Failed attempts over time",
                                                t_labels=labels))
        sec.tables.append(Table(f"Failed attempts per interval of {e['width']:.3g}s "
                                f"(from {ts(e['t0'])})", ["class", "per interval"],
                                [[k, " ".join(map(str, v))] for k, v in e["series"].items()]))
    if s.task_errors:
        sec.tables.append(Table("Tasks that failed for good", ["error", "tasks"],
                                s.task_errors.most_common()))
    if s.events:
        sec.tables.append(Table("Events by kind", ["kind", "events"], s.events.most_common()))
    return sec


def _latency(s: RunStats) -> Section:
    rows = []
    for provider, lat in sorted(s.latency.items(), key=lambda kv: (kv[0] != "all", kv[0])):
        ft, tot = lat["first_token"], lat["total"]
        rows.append([provider, len(tot), secs(percentile(ft, 50)), secs(percentile(ft, 90)),
                     secs(percentile(ft, 99)), secs(percentile(tot, 50)), secs(percentile(tot, 90)),
                     secs(percentile(tot, 99))])
    sec = Section("latency", "Latency", [Table(
        "Successful attempts", ["provider", "attempts", "first token p50", "p90", "p99",
                                "total p50", "p90", "p99"], rows)])
    sec.notes.append("first token: from sending the request to the first byte of the model's "
                     "output (content, reasoning or a tool call; keep-alive comments and the "
                     "response headers do not count), the time to first token of a streamed "
                     "answer; an answer that is not streamed arrives whole, so there it equals "
                     "the total. total: until the whole answer had arrived. Attempts stored "
                     "before first tokens were recorded show '—'.")
    total = (s.latency.get("all") or {}).get("total") or []
    if total:
        sec.histograms.append(Histogram("Total latency of successful attempts (s)", "seconds",
                                        _float_bins(total)))
    return sec


def _float_bins(values: list[float], n: int = 20) -> list[tuple[float, float, int]]:
    vmax = max(values) or 1.0
    width = vmax / n
    counts = [0] * n
    for v in values:
        counts[min(n - 1, int(v / width))] += 1
    return [(round(i * width, 3), round((i + 1) * width, 3), c) for i, c in enumerate(counts)]


def _repairs(s: RunStats) -> Section:
    sec = Section("repairs-quarantine", "Repairs and quarantines", [
        Table("Repairs applied to kept samples", ["repair", "samples"], s.repairs.most_common()),
        Table("Observed in kept samples, nothing changed (normaliser flags)",
              ["flag", "samples"], s.flags.most_common()),
        Table("Quarantined answers by reason", ["reason", "answers"], s.quarantine.most_common()),
        Table("Quarantined answers by reason, dataset and provider",
              ["reason", "dataset", "provider", "answers"], [list(r) for r in s.quarantine_by]),
        Table("The figures of each reason's latest quarantine (both counts of a count_mismatch)",
              ["dataset", "reason", "figures"],
              [[ds, reason, detail_text(fig)] for ds, by in sorted(s.quarantine_details.items())
               for reason, fig in sorted(by.items())]),
        Table("Conversations ended early (the planner stopped before the dataset's last turn, "
              "or an answer was quarantined)", ["end reason", "conversations", "expected?"],
              [[r, n, "yes: the model left the recorded tool loop" if r in TOOL_LOOP_ENDS
                else "no"] for r, n in s.end_reasons.most_common()]),
        Table("Turns per conversation (samples)", ["dataset", "turns", "conversations"],
              [[ds, n, c] for ds, v in s.shapes.items()
               for n, c in v["turns_per_conversation"].items()]),
        Table("Samples reusing recorded tool results, by weakest match (exact, name, position)",
              ["dataset", "match", "samples"],
              [[ds, k, n] for ds, v in s.shapes.items() for k, n in v["tool_matches"].items()])])
    sec.charts.append(svg.bar_chart(s.repairs.most_common(), title="Repairs"))
    sec.charts.append(svg.bar_chart(s.quarantine.most_common(), title="Quarantines"))
    return sec


def _exclusion_cause(info: dict[str, Any]) -> str:
    """What excluded a provider: the alarm (and its dataset), the policing figure, or a
    user."""
    fig = info.get("figures") or {}
    alarm = fig.get("alarm")
    if isinstance(alarm, dict):
        return f"alarm {alarm.get('alarm')} on dataset {alarm.get('dataset')}"
    if fig.get("metric"):
        return f"policing: {fig['metric']}"
    return "specgen provider --exclude" if info.get("by") == "user" else "—"


def _budget(s: RunStats) -> Section:
    t = s.totals
    budget = t.get("max_cost_usd")
    rows = [["budget (max_cost_usd)", usd(budget) if budget is not None else "none"],
            ["billed so far", usd(t["billed_usd"])]]
    if budget:
        rows.append(["share of budget used", f"{100 * t['billed_usd'] / budget:.1f}%"])
    sec = Section("budget-stop", "Budget and stops", [Table("Budget", ["", ""], rows)])
    sec.tables.append(Table("Datasets", ["dataset", "state", "rows read", "invalid", "duplicate",
                                         "other shard", "exhausted"],
                            [[d["dataset"], d.get("state", "?"), d.get("rows_read", 0),
                              d.get("rows_invalid", 0), d.get("rows_duplicate", 0),
                              d.get("rows_other_shard", 0),
                              "yes" if d.get("exhausted") else "no"]
                             for d in s.datasets]))
    sec.tables.append(Table("Sessions", ["session", "host", "pid", "started", "ended", "state",
                                         "stop reason"],
                            [[str(x["id"]), x["host"], str(x["pid"]), ts(x["started_at"]),
                              ts(x["ended_at"] or x["heartbeat_at"]), x["state"],
                              x["stop_reason"] or "—"] for x in s.sessions]))
    excluded = read_excluded(s.meta)
    if excluded:
        sec.tables.append(Table(
            "Excluded providers (their samples are left out of exports)",
            ["provider", "by", "cause", "reason"],
            [[name, info.get("by", "?"), _exclusion_cause(info), info.get("reason", "")]
             for name, info in sorted(excluded.items())]))
    if s.recent_events:
        sec.tables.append(Table("Latest events (retries left out)",
                                ["time", "session", "kind", "dataset", "provider", "detail"],
                                [[ts(e["ts"]), str(e["session"]), e["kind"], e["dataset"] or "—",
                                  e["provider"] or "—", e["detail"] or ""]
                                 for e in s.recent_events]))
    return sec
