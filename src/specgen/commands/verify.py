"""`specgen verify RUN_DIR`: re-check every stored sample's ids, mask and special tokens."""

from __future__ import annotations

import argparse
import sys

from .numbers import finite
from .rundir import RunDirError, add_run_dir, resolve_run_dir


def add_parser(subparsers) -> None:
    from ..verify import DEFAULT_MAX_TRUE_MISMATCH

    p = subparsers.add_parser(
        "verify", help="re-render every stored sample and check its ids, mask, special tokens",
        description="Exit status: 0 all checks pass; 1 a sample fails a check, or the share "
                    "of samples whose true ids differ from ours is above --max-true-mismatch; "
                    "2 the run cannot be verified (no store, tokenizer missing or different).")
    add_run_dir(p)
    p.add_argument("--tokenizer", metavar="PATH",
                   help="the run's tokenizer files, if not at the path in its config")
    p.add_argument("--dataset", action="append", default=[], metavar="NAME",
                   help="check only this dataset (repeatable)")
    p.add_argument("--max-true-mismatch", type=finite, default=DEFAULT_MAX_TRUE_MISMATCH,
                   metavar="RATE",
                   help="highest share of samples (0..1, prompt and completion each) whose true "
                        "ids may differ from ours before verify fails (default "
                        f"{DEFAULT_MAX_TRUE_MISMATCH}; use 1 for the simulator's raw mode)")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import orjson

    from ..config import ConfigError
    from ..display import printable
    from ..store import StoreError
    from ..verify import VerifyError, format_report, verify_run

    if not 0 <= args.max_true_mismatch <= 1:
        print("specgen verify: --max-true-mismatch must be between 0 and 1", file=sys.stderr)
        return 2
    try:
        run_dir = resolve_run_dir(args.run_dir)
    except (ConfigError, RunDirError) as exc:
        print(f"specgen verify: {exc}", file=sys.stderr)
        return 2
    try:
        report = verify_run(run_dir, tokenizer=args.tokenizer,
                            datasets=args.dataset or None,
                            max_true_mismatch=args.max_true_mismatch)
    except (VerifyError, StoreError) as exc:
        print(f"specgen verify: {exc}", file=sys.stderr)
        return 2
    if args.json:
        from ..display import clean_floats

        sys.stdout.write(orjson.dumps(clean_floats(report.to_json()),
                                      option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(printable(format_report(report), keep="\n"))
    return report.exit_code
