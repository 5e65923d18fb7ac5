"""`specgen sim`: run the local OpenRouter-compatible simulator (docs/sim.md)."""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sim",
        help="run a local OpenRouter-compatible simulator (providers, quirks, faults)",
        description="Serve OpenRouter's chat API locally, answering with simulated target-model "
        "tokens. The first stdout line is 'specgen sim listening on http://HOST:PORT'.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8790, help="port (0 = a free one; default 8790)")
    p.add_argument("--config", metavar="SIM_TOML",
                   help="the simulator's TOML file (default: built-in defaults)")
    p.add_argument("--seed", type=int, default=None, help="seed (default: the config's, 0)")
    p.add_argument("--print-config", action="store_true",
                   help="print the effective configuration as JSON and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import gc
    import json
    import resource
    import signal
    import sys

    from ..config import ConfigError
    from ..render.base import RenderError
    from ..sim import SimConfig, load_sim_config
    from ..tokenizer import TokenizerError

    try:
        cfg = load_sim_config(args.config) if args.config else SimConfig()
    except ConfigError as exc:
        print(f"specgen sim: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(cfg.to_json(), indent=2))
        return 0
    # Thousands of open connections need more descriptors than the usual soft limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 16 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass

    async def serve() -> int:
        from ..sim import start

        try:
            server = await start(cfg, seed=args.seed, host=args.host, port=args.port)
        except (ConfigError, RenderError, TokenizerError) as exc:
            print(f"specgen sim: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"specgen sim: cannot listen on {args.host}:{args.port}: {exc.strerror}",
                  file=sys.stderr)
            return 2
        # The tokenizer and text bank live as long as the process: keep the collector from
        # scanning them again and again.
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)  # requests leave little cyclic garbage
        print(f"specgen sim listening on {server.root_url}", flush=True)
        print(f"base_url: {server.url}  (stats: {server.root_url}/sim/stats; Ctrl-C stops)",
              flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        await stop.wait()
        await server.stop()
        return 0

    return asyncio.run(serve())
