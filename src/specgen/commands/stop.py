"""`specgen stop RUN_DIR [--now]`: stop a running engine from another shell."""

from __future__ import annotations

import argparse
import sys
import time

from .numbers import finite
from .rundir import RunDirError, add_run_dir, resolve_run_dir


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "stop", help="stop a running run: drain in-flight requests (or --now: cancel them)",
        description="Ask the engine running in RUN_DIR to stop. By default it stops sending, "
                    "lets in-flight requests finish (up to its drain timeout) and commits; "
                    "--now cancels in-flight requests and commits what is done.")
    add_run_dir(p)
    p.add_argument("--now", action="store_true", help="cancel in-flight requests")
    p.add_argument("--no-wait", action="store_true", help="return once the request is made")
    p.add_argument("--timeout", type=finite, metavar="S",
                   help="wait at most S seconds for the run to end (default: its drain "
                        "timeout + 30)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    import orjson

    from ..config import ConfigError
    from ..engine.control import read_control, write_control
    from ..engine.status import run_status
    from ..store import StoreError

    try:
        run_dir = resolve_run_dir(args.run_dir)
        status = run_status(run_dir)
    except (StoreError, ConfigError, RunDirError) as exc:
        print(f"specgen stop: {exc}", file=sys.stderr)
        return 2
    if status["state"] != "running":
        print(f"specgen stop: nothing to stop in {run_dir}: state {status['state']}"
              + (f" ({status['stop_reason']})" if status["stop_reason"] else ""))
        return 0
    session = (status.get("session") or {}).get("id")
    action = "now" if args.now else "drain"
    write_control(run_dir, action, session)
    pid = status["pid"]
    print(f"asked the run (pid {pid}) to stop"
          + (" now (cancelling in-flight requests)" if args.now
             else " (it finishes the requests in flight first)"))
    if args.no_wait:
        return 0
    timeout = args.timeout
    if timeout is None:
        from ..store import Store

        with Store.open(run_dir) as store:
            drain = store.get_meta("drain_timeout")
            cfg = orjson.loads(store.get_meta("config_json") or "{}")
        if drain is None:
            drain = (cfg.get("engine") or {}).get("drain_timeout", 60.0)
        timeout = float(drain) + 30.0
    deadline = time.monotonic() + timeout
    picked_up_warned = False
    started = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        status = run_status(run_dir)
        if status["state"] != "running":
            print(f"the run ended: state {status['state']}"
                  + (f" — {status['stop_reason']}" if status["stop_reason"] else ""))
            return 0
        if (not picked_up_warned and time.monotonic() - started > 10
                and read_control(run_dir) is not None):
            picked_up_warned = True
            print(f"the run has not picked up the request after 10s (is it hung?); "
                  f"`kill {pid}` sends it SIGTERM", file=sys.stderr)
    print(f"specgen stop: the run is still running after {timeout:g}s "
          f"(in flight: {status.get('in_flight', '?')}); run `specgen stop --now {run_dir}` "
          "to cancel in-flight requests", file=sys.stderr)
    return 1
