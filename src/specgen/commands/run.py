"""`specgen run CONFIG`: generate (or resume generating) a run's samples."""

from __future__ import annotations

import argparse
import sys

from ..display import printable, printable_data
from ..queries import redo_line
from .numbers import finite


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="send a config's prompts to the target model and store exact samples",
        description="Run (or resume) the generation described by CONFIG. Rerunning the same "
                    "config continues where it stopped; Ctrl-C stops cleanly (twice: now).")
    p.add_argument("config", metavar="CONFIG", help="the run's TOML config")
    p.add_argument("--run-dir", metavar="DIR",
                   help="store the run in DIR instead of the config's run_dir (one config, "
                        "one run dir per shard or machine)")
    p.add_argument("--shard", metavar="I/N",
                   help="take only shard I of N of every dataset (by conversation id)")
    p.add_argument("--force-new", action="store_true",
                   help="start a fresh store even if the config changed results (the old "
                        "store, its exports and report are moved to RUN_DIR/previous/, "
                        "never deleted)")
    p.add_argument("--drain-timeout", type=finite, metavar="S",
                   help="on a first stop, wait at most S seconds for in-flight requests "
                        "(default: [engine] drain_timeout, 60)")
    p.add_argument("--retry-failed", action="store_true",
                   help="send tasks that failed in earlier sessions again")
    p.add_argument("--ack-alarm", action="append", default=[], metavar="NAME",
                   help="acknowledge a quality alarm that still stands from an earlier session "
                        "(its cause unchanged) and go on as it is (repeatable)")
    live = p.add_mutually_exclusive_group()
    live.add_argument("--live", dest="live", action="store_true", default=None,
                      help="force the live view")
    live.add_argument("--no-live", dest="live", action="store_false",
                      help="plain log lines instead of the live view")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..config import ConfigError, load_config
    from ..engine.runner import RunError, RunOptions, run
    from ..engine.status import run_status

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"specgen run: {exc}", file=sys.stderr)
        return 2
    if args.run_dir:
        from pathlib import Path

        cfg.run_dir = Path(args.run_dir).expanduser()
    if args.drain_timeout is not None and args.drain_timeout < 0:
        print("specgen run: --drain-timeout must be >= 0", file=sys.stderr)
        return 2
    from ..quality.alarms import ALARMS

    unknown = [n for n in args.ack_alarm if n not in ALARMS]
    if unknown:
        print(f"specgen run: --ack-alarm {unknown[0]}: no such alarm (known: "
              f"{', '.join(ALARMS)})", file=sys.stderr)
        return 2
    opts = RunOptions(shard=args.shard, force_new=args.force_new,
                      drain_timeout=args.drain_timeout, retry_failed=args.retry_failed,
                      ack_alarms=tuple(args.ack_alarm),
                      live=args.live, argv=sys.argv[1:])
    try:
        outcome = run(cfg, opts)
    except RunError as exc:
        print(f"specgen run: {exc}", file=sys.stderr)
        return 2
    try:
        status = run_status(cfg.run_dir)
    except Exception as exc:  # noqa: BLE001 - the store itself may be what failed
        print(f"run {outcome.state}: {printable(outcome.stop_reason or '')}")
        print(f"  (no summary: the store cannot be read: {exc})", file=sys.stderr)
        return outcome.exit_code
    # provider names, batch ids and reasons from the API: terminal-safe
    print_summary(printable_data(status), outcome.state, printable(outcome.stop_reason or ""),
                  config=args.config,
                  rerun=_rerun_args(args))
    _print_hub_sources(cfg.run_dir)
    return outcome.exit_code


def _print_hub_sources(run_dir) -> None:
    """The Hub datasets the run read, at their pinned commits (and a branch moved since)."""
    from ..sources.pins import hub_pins, pin_line
    from ..store import Store

    try:
        with Store.open(run_dir) as store:
            pins = hub_pins(store.meta())
    except Exception:  # noqa: BLE001 - the summary above already said what it could
        return
    for name, pin in pins.items():
        print(f"  source {pin_line(name, pin)}")


def _rerun_args(args: argparse.Namespace) -> str:
    """The options a rerun of this run needs besides the config (its dir, its shard)."""
    out = ""
    if args.run_dir:
        out += f" --run-dir {args.run_dir}"
    if args.shard:
        out += f" --shard {args.shard}"
    return out


def print_summary(status: dict, state: str, reason: str, config: str | None = None,
                  rerun: str = "") -> None:
    from ..engine.status import conversation_lines

    print(f"run {state}: {reason}")
    for name, d in status["datasets"].items():
        print(f"  {name} [{d['state']}]: tasks {d['done']:,} done, {d['failed']:,} failed, "
              f"{d['quarantined']:,} quarantined, {d['pending']:,} pending "
              f"({d['attempts']:,} attempts); "
              f"{d['completion_tokens']:,} completion tokens, ${d['cost_usd']:.4f}")
        for line in conversation_lines(d):
            print(f"    {line}")
    import os

    run_dir = os.path.normpath(status["run_dir"])
    print(f"  total cost ${status['cost_usd']:.4f}; store {run_dir}/state.sqlite")
    for name, info in (status.get("excluded_providers") or {}).items():
        print(f"  excluded provider {name} ({info.get('by', '?')}): {info.get('reason', '')}; "
              f"its samples are left out of exports; `specgen provider {run_dir} --allow "
              f"{name}` puts it back")
    if status.get("redone"):
        print(f"  {redo_line(status['redone'])}")
    if status.get("batches"):
        from ..batch_queries import batch_summary_line

        print(f"  {batch_summary_line(status['batches'])}")
    failures = status.get("failures") or {}
    if failures:
        print("  failed tasks by class (last error):")
        for kind, f in failures.items():
            print(f"    {kind}: {f['count']:,} — {_short(f['last_error'])}")
        cmd = (f"specgen run {config}{rerun} --retry-failed" if config
               else "rerun with --retry-failed")
        print(f"  to send them again with a fresh attempt budget: {cmd}")
    from ..run_outcome import next_step

    step = next_step(state, reason)
    if step and state != "incomplete":  # (incomplete: the --retry-failed command is above)
        print(f"  {step}")


def _short(text: str | None, limit: int = 200) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
