"""`specgen merge RUN_DIR… -o RUN_DIR`: combine shard runs of one config into one run."""

from __future__ import annotations

import argparse
import sys

from .rundir import RunDirError, add_run_dir, resolve_run_dir


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "merge", help="combine the run dirs of shards (--shard i/N) of one config",
        description="Merge run stores of one config (same config hash) into a new run dir "
                    "without duplicate conversations; export, verify and report work on it.")
    add_run_dir(p, "run_dirs", nargs="+",
                help="the run dirs of the shards (or their TOML configs)")
    p.add_argument("-o", "--output", required=True, metavar="NEW_RUN_DIR",
                   help="new run dir to write (must not hold a run yet)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sqlite3

    import orjson

    from ..config import ConfigError
    from ..export.atomic import describe_os_error
    from ..merge import MergeError, merge_runs
    from ..store import StoreError

    try:
        inputs = [resolve_run_dir(d) for d in args.run_dirs]
        summary = merge_runs(inputs, args.output)
    except (MergeError, StoreError, ConfigError, RunDirError) as exc:
        print(f"specgen merge: {exc}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.Error) as exc:  # disk full, no permission, ...
        reason = (describe_os_error(exc, args.output) if isinstance(exc, OSError)
                  else f"the merge into {args.output} failed: SQLite: {exc}")
        print(f"specgen merge: {reason}; the partly built merge was removed and nothing was "
              f"written under {args.output}", file=sys.stderr)
        return 1
    if args.json:
        from ..display import clean_floats

        sys.stdout.write(orjson.dumps(clean_floats(summary.to_json()),
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    shards = ", ".join(f"{i['run_dir']} ({i['shard'] or 'unsharded'}, {i['results']:,} samples)"
                       for i in summary.inputs)
    print(f"merged {shards}")
    print(f"into {args.output}: {summary.conversations:,} conversations, {summary.results:,} "
          f"samples, {summary.attempts:,} attempts, {summary.sessions:,} sessions, "
          f"{summary.events:,} events")
    if summary.duplicate_conversations:
        print(f"  {summary.duplicate_conversations:,} duplicate conversation(s): kept the most "
              f"complete copy; {summary.attempts_left_out:,} attempt(s) of dropped copies left "
              "out")
    return 0
