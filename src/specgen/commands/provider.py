"""`specgen provider RUN_DIR [--exclude NAME | --allow NAME]`: take a provider out of a run, or
put one back (a running run picks it up within a second; a stopped one at its next start)."""

from __future__ import annotations

import argparse
import sys
import time

from ..display import printable
from .numbers import finite


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "provider", help="exclude a provider from a run, or allow an excluded one back",
        description="Without an option: list the providers the run excludes (by quality "
                    "policing or by hand). --exclude NAME adds a provider to the requests' "
                    "provider.ignore from now on; --allow NAME puts an excluded one back. "
                    "Works on a running run (like `specgen stop`) and on a stopped one (the "
                    "next run keeps the change).")
    p.add_argument("run_dir", help="the run dir (or the run's TOML config)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--exclude", metavar="NAME", help="provider name or slug to leave out")
    group.add_argument("--allow", metavar="NAME", help="excluded provider to put back")
    p.add_argument("--timeout", type=finite, default=10.0, metavar="S",
                   help="how long to wait for a running run to take the request (default 10)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    from ..engine.control import RunLockedError
    from ..engine.providers import apply_offline, write_request
    from ..engine.status import run_status
    from ..store import StoreError
    from .status import resolve_run_dir

    try:
        run_dir = resolve_run_dir(args.run_dir)
        status = run_status(run_dir)
    except (StoreError, ConfigError) as exc:
        print(f"specgen provider: {exc}", file=sys.stderr)
        return 2
    if not (args.exclude or args.allow):
        excluded = status.get("excluded_providers") or {}
        if not excluded:
            print(f"{run_dir}: no provider is excluded")
        for name, info in excluded.items():
            print(f"{shown(name)}: excluded ({info.get('by', '?')}) — "
                  f"{shown(str(info.get('reason', '')))}")
        return 0
    action, name = ("exclude", args.exclude) if args.exclude else ("allow", args.allow)
    name = name.strip()
    if not name:
        print("specgen provider: the provider name is empty", file=sys.stderr)
        return 2
    if action == "exclude":
        unknown = unknown_name_note(run_dir, name)
        if unknown:
            print(f"specgen provider: note: {unknown}", file=sys.stderr)
    try:
        if status["state"] != "running":
            try:
                print(apply_offline(run_dir, action, name))
                return 0
            except RunLockedError:
                pass  # a run just started: ask it as a running run
            except StoreError as exc:
                print(f"specgen provider: {exc}", file=sys.stderr)
                return 2
        path = write_request(run_dir, action, name)
    except OSError as exc:  # a read-only run dir, or one this user may not write
        print(f"specgen provider: cannot {action} {shown(name)!r}: the run dir {run_dir} is "
              f"not writable here ({exc.strerror or exc}: {exc.filename or run_dir}); run it "
              "as the user who owns the run, or on a writable copy", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if not path.exists():
            print(f"the running run (pid {status.get('pid')}) took it: {name!r} "
                  + ("excluded" if action == "exclude" else "allowed back (if it was excluded)"))
            return 0
        time.sleep(0.1)
    print(f"specgen provider: the run has not taken the request after {args.timeout:g}s; it "
          f"stays in {path} and is applied when the run next polls or starts", file=sys.stderr)
    return 1


def shown(name: str) -> str:
    """A provider name as printed: control characters (terminal escapes) as escapes."""
    return printable(name)


def unknown_name_note(run_dir, name: str) -> str | None:
    """What to say when no answer or error of this run came from a provider called `name`
    (the exclusion is kept: it may answer later), with the close names; None when it did."""
    import difflib

    from ..store import Store

    try:
        with Store.open(run_dir) as store:
            seen = sorted({p for (p,) in store.conn.execute(
                "SELECT DISTINCT provider FROM attempts WHERE provider IS NOT NULL "
                "AND provider != ''")})
    except Exception:  # noqa: BLE001 - a note only: never in the way of the request
        return None
    if not seen or any(p.strip().lower() == name.lower() for p in seen):
        return None
    close = difflib.get_close_matches(name.lower(), [p.lower() for p in seen], n=3, cutoff=0.5)
    names = [p for p in seen if p.lower() in close]
    hint = (f"; did you mean {', '.join(repr(shown(p)) for p in names)}?" if names
            else f"; providers seen: {', '.join(shown(p) for p in seen[:10])}")
    return (f"no attempt of this run came from a provider named {shown(name)!r}{hint} "
            "(it is excluded anyway, in case it answers later)")
