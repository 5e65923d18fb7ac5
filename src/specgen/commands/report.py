"""`specgen report RUN_DIR [-o report.html] [--text]`: what a run produced and cost."""

from __future__ import annotations

import argparse
import contextlib
import sys

from .rundir import RunDirError, add_run_dir, resolve_run_dir


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="write a self-contained HTML report of a run (or print it as text)",
        description="Tokens and cost per dataset and provider, completion lengths, finish "
                    "reasons, errors over time, latency percentiles, repairs, quarantines, "
                    "budget and stops. Safe while the run is still writing.")
    add_run_dir(p)
    p.add_argument("-o", "--output", metavar="PATH",
                   help="HTML file to write (default RUN_DIR/report.html)")
    p.add_argument("--text", action="store_true", help="print the numbers in the terminal")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..config import ConfigError
    from ..report import build_report
    from ..store import StoreError

    try:
        args.run_dir = resolve_run_dir(args.run_dir)
        out = build_report(args.run_dir, text=args.text)
    except (StoreError, ConfigError, RunDirError) as exc:
        print(f"specgen report: {exc}", file=sys.stderr)
        return 2
    if args.text:
        from ..display import printable

        sys.stdout.write(printable(out, keep="\n"))  # names and ids from the API
        return 0
    path = Path(args.output) if args.output else Path(args.run_dir) / "report.html"
    tmp = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(out, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:  # a read-only run dir, a directory in the way, a full disk
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        print(f"specgen report: cannot write {path}: {exc.strerror or exc}; -o PATH writes "
              "it elsewhere, --text prints it", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0
