"""`specgen stats RUN_DIR [--json]`: what the stored samples look like, and what to filter."""

from __future__ import annotations

import argparse
import sys

from .numbers import whole
from .rundir import RunDirError, add_run_dir, resolve_run_dir


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "stats", help="describe the stored samples: lengths, truncation, loops, duplicates",
        description="One pass over the run's store, per dataset and provider: token "
                    "distributions, finish reasons, reasoning share, tool calls, turns, "
                    "duplicate samples and prompts, repetition loops, empty answers, scripts; "
                    "then a 'ready to train?' list with the export options that filter each "
                    "finding (docs/stats.md). Safe while the run is still writing.")
    add_run_dir(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--dataset", action="append", default=[], metavar="NAME",
                   help="only this dataset (repeatable)")
    p.add_argument("--repetition-tokens", type=whole(), default=None, metavar="N",
                   help="a repetition loop repeats at least N tokens (default 64)")
    p.add_argument("--repetition-period", type=whole(), default=None, metavar="N",
                   help="of a block of at most N tokens (default 64)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    import orjson

    from ..config import ConfigError
    from ..display import clean_floats, printable
    from ..display import path as tidy
    from ..stats import StatsError, StatsOptions, compute_stats
    from ..stats.render import ready_list, render_text
    from ..store import StoreError

    opts = StatsOptions(datasets=list(args.dataset))
    for name in ("repetition_tokens", "repetition_period"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                print(f"specgen stats: --{name.replace('_', '-')} must be at least 1 "
                      f"(got {value})", file=sys.stderr)
                return 2
            setattr(opts, name, value)
    try:
        run_dir = resolve_run_dir(args.run_dir)
        stats = compute_stats(run_dir, opts)
    except (StoreError, ConfigError, RunDirError, StatsError) as exc:
        print(f"specgen stats: {exc}", file=sys.stderr)
        return 2
    shown = tidy(run_dir)
    if args.json:
        stats["ready_to_train"] = ready_list(stats, shown)
        sys.stdout.write(orjson.dumps(clean_floats(stats),
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    sys.stdout.write(printable(render_text(stats, shown), keep="\n"))
    return 0
