"""`specgen status RUN_DIR [--json]`: a run's figures, read-only, from any shell."""

from __future__ import annotations

import argparse
import sys

from ..queries import redo_line
from .rundir import RunDirError, add_run_dir, resolve_run_dir


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "status", help="show a run's progress (read-only; safe while it runs)",
        description="Figures of a run from its store: state, cost, per dataset and provider.")
    add_run_dir(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    import orjson

    from ..config import ConfigError
    from ..engine.status import run_status
    from ..store import StoreError

    try:
        status = run_status(resolve_run_dir(args.run_dir))
    except (StoreError, ConfigError, RunDirError) as exc:
        print(f"specgen status: {exc}", file=sys.stderr)
        return 2
    if args.json:
        from ..display import clean_floats

        sys.stdout.write(orjson.dumps(clean_floats(status),
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    from ..display import printable_data

    print_status(printable_data(status))  # names and ids from the API: terminal-safe
    return 0


def print_status(s: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160, soft_wrap=True)
    head = f"[bold]{s['run_dir']}[/bold]  state [cyan]{s['state']}[/cyan]"
    if s["pid"]:
        head += f"  pid {s['pid']}"
    cap = f" / ${s['max_cost_usd']:g}" if s.get("max_cost_usd") is not None else ""
    head += f"  cost [green]${s['cost_usd']:.4f}{cap}[/green]"
    if s.get("concurrency") is not None:
        from ..display import in_flight_text

        head += f"  {in_flight_text(s.get('in_flight') or 0, s['concurrency'])}"
    progress = (s.get("live") or {}).get("progress") or {}
    if progress.get("eta_s") is not None:
        from ..engine.progress import fmt_duration

        head += (f"  ETA {'≥' if progress.get('eta_lower_bound') else ''}"
                 f"{fmt_duration(progress['eta_s'])}")
    console.print(head)
    if s.get("concurrency_reason"):
        console.print(f"  limit below the configured concurrency: {s['concurrency_reason']}")
    ep = s.get("endpoint") or {}
    if ep.get("state") in ("down", "paused"):
        console.print(f"  [yellow]endpoint {ep['state']}: {ep.get('reason')}[/yellow]")
    if s.get("store_problem"):
        sp = s["store_problem"]
        console.print(f"  [red]store: {sp['message']} — {sp['held_answers']} answer(s) held "
                      "in memory[/red]")
    if s["stop_reason"]:
        console.print(f"  {escape(s['stop_reason'])}")
    verdict = (s.get("judgement") or {}).get("verdict")
    if verdict and verdict not in (s["stop_reason"] or ""):
        console.print(f"  [red]{escape(verdict)}[/red]", highlight=False)
    t = Table(box=None, header_style="bold")
    plans = progress.get("datasets") or {}
    for col in ("dataset", "state", "tasks done", "failed", "quar.", "pending", "attempts",
                "rows read", "prompt tok", "compl. tok", "cost $",
                *(("progress",) if plans else ())):
        t.add_column(col, justify="left" if col in ("dataset", "state") else "right")
    for name, d in s["datasets"].items():
        t.add_row(name, d["state"], f"{d['done']:,}", f"{d['failed']:,}",
                  f"{d['quarantined']:,}", f"{d['pending']:,}", f"{d['attempts']:,}",
                  f"{d['rows_read']:,}",
                  f"{d['prompt_tokens']:,}", f"{d['completion_tokens']:,}",
                  f"{d['cost_usd']:.4f}",
                  *(((plans.get(name) or {}).get("label", "-"),) if plans else ()))
    console.print(t)
    from ..engine.status import conversation_lines, quality_cell

    for name, d in s["datasets"].items():
        lines = conversation_lines(d)
        if lines:
            console.print(f"  {name}: " + "; ".join(lines), markup=False, highlight=False)
    if s.get("batches"):
        from ..batch_queries import batch_summary_line

        console.print(f"  {batch_summary_line(s['batches'])}", markup=False, highlight=False)
    for kind, f in (s.get("failures") or {}).items():
        console.print(f"  failed tasks: {kind} x{f['count']:,} "
                      f"(last: {(f['last_error'] or '')[:160]})")
    for name, info in (s.get("excluded_providers") or {}).items():
        console.print(f"  [yellow]excluded provider {escape(name)}[/yellow] "
                      f"({info.get('by', '?')}): {escape(str(info.get('reason', '')))}; "
                      f"`specgen provider {s['run_dir']} --allow {escape(name)}` puts it back",
                      highlight=False)
    if s.get("redone"):
        console.print(f"  {redo_line(s['redone'])}", markup=False, highlight=False)
    for a in s.get("alarms") or []:
        if a.get("standing"):
            console.print(f"  [red]standing alarm {escape(a['alarm'])} on dataset "
                          f"{escape(a['dataset'])}[/red] (since session {a.get('session')}): "
                          f"to fix: {escape(a.get('fix') or '')}", highlight=False)
        else:
            console.print(f"  alarm {escape(a['alarm'])} on dataset {escape(a['dataset'])}: "
                          "what it depends on changed since; cleared when the run resumes",
                          highlight=False)
    for ev in s.get("quality_events") or []:
        said = (ev["detail"] or "").split(" (on_alarm", 1)[0] in (s["stop_reason"] or "")
        if ev["kind"] == "alarm" and not said and s.get("alarms") is None:
            console.print(f"  [red]{escape(ev['detail'] or '')}[/red]", highlight=False)
    if s["providers"]:
        p = Table(box=None, header_style="bold")
        for col in ("provider", "attempts", "outcomes", "samples by count check", "quality",
                    "compl. tok", "cost $"):
            p.add_column(col, justify="left" if col in ("provider", "outcomes", "quality",
                                                        "samples by count check") else "right")
        witness = s.get("count_witness") or {}
        for name, v in sorted(s["providers"].items(), key=lambda kv: -kv[1]["requests"]):
            outcomes = " ".join(f"{k}={n}" for k, n in sorted(v["outcomes"].items()))
            checks = " ".join(f"{k}={n}" for k, n in sorted(v.get("count_checks", {}).items()))
            state = (witness.get(name) or {}).get("completion", {}).get("state")
            if state == "unusable" or (witness.get(name) or {}).get("counts_unusable"):
                checks += " (counts unusable)"
            elif split := (witness.get(name) or {}).get("unverified_forms"):
                checks += f" (counts split: {', '.join(split)} unverified)"
            if (sides := v.get("witness_sides")) and sides.get("prompt_deltas"):
                checks += " prompt " + ",".join(
                    f"{d}x{n}" for d, n in sorted(sides["prompt_deltas"].items()))
            p.add_row(name, f"{v['requests']:,}", outcomes, checks or "-",
                      quality_cell(((s.get("quality") or {}).get("providers") or {}).get(name),
                                   name in (s.get("excluded_providers") or {})),
                      f"{v['completion_tokens']:,}", f"{v['cost_usd']:.4f}")
        console.print(p)

