"""The `specgen` command line: one subcommand per module in `specgen.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand name -> module under specgen.commands, in the order `--help` lists them: a run's
# life first, then the tools beside it. Each module defines `add_parser(subparsers)` (which
# sets `func`) and keeps heavy imports inside its handler.
COMMANDS = [
    "run",
    "preview",
    "status",
    "stop",
    "provider",
    "probe",
    "stats",
    "export",
    "verify",
    "report",
    "merge",
    "tokenize",
    "sim",
]


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="specgen",
        description="Turn prompt datasets into exact-token training data for drafters.",
        epilog="CONFIG is a run's TOML file; RUN_DIR a run dir, or the CONFIG whose run_dir "
               "it is. First run: specgen run examples/quickstart.toml",
    )
    parser.add_argument("--version", action="version", version=f"specgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f".commands.{name}", __package__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.commands.{name}":
                raise
            continue  # command not built yet
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        what = problem_message(exc, getattr(args, "run_dir", None) or _run_dir_of(args))
        if what is None:
            raise
        print(f"specgen {getattr(args, 'command', None) or ''}: {what}", file=sys.stderr)
        return 2


def _run_dir_of(args) -> str | None:
    """The run dir a `run` / `probe` config names (for a message about its disk)."""
    path = getattr(args, "config", None)
    if not path:
        return None
    try:
        import tomllib

        with open(path, "rb") as f:
            value = tomllib.load(f).get("run_dir")
        return value if isinstance(value, str) else None
    except (OSError, ValueError):
        return None


def problem_message(exc: BaseException, run_dir=None) -> str | None:
    """What to say for a store that is not one (empty, corrupt, a directory) or a run dir
    that cannot be written (a full disk says so) — a message instead of a traceback; None
    for anything else."""
    import sqlite3

    from .proxy import ProxyError
    from .store import StoreError, open_problem

    if isinstance(exc, StoreError | ProxyError):
        return str(exc)  # ProxyError: a malformed HTTPS_PROXY (its credentials never shown)
    if isinstance(exc, sqlite3.Error | OSError) and run_dir is not None \
            and (where := open_problem(exc, run_dir)) is not None:
        return where
    if isinstance(exc, sqlite3.Error):
        return (f"the run store cannot be used (sqlite: {exc}); check that the run dir's "
                "state.sqlite is a specgen store file")
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return None


if __name__ == "__main__":
    sys.exit(main())
