"""`specgen probe CONFIG`: canary requests to every allowed provider of the target, measured
and ranked, before the big spend (docs/probe.md).

Exit codes: 0 the probe ran and at least one provider meets the thresholds (the suggested
block keeps them); 4 it ran but none does; 5 an account budget stopped it (the figures so far
are written); 3 interrupted (Ctrl-C: nothing written); 2 it could not start (bad config,
missing key, no endpoint list, nothing to probe, or the worst case above --max-cost);
1 a fatal error (the API refused the key mid-probe).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..display import printable, printable_data
from .numbers import finite, whole


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "probe", help="send a few canary requests to every allowed provider and rank them",
        description="Pin a few canary requests (the config's tool-calling rows first, or a "
                    "built-in tool-call suite) to every endpoint the provider policy allows, "
                    "measure schema accuracy, tool-call trigger agreement with a reference "
                    "provider, the count witness, reasoning, finish reasons, latency, speed "
                    "and cost, and print a ready [endpoint.provider] block keeping the "
                    "providers that meet the thresholds. The worst-case cost is shown first "
                    "and capped.")
    p.add_argument("config", metavar="CONFIG", help="the run config (TOML)")
    p.add_argument("--per-provider", type=whole(), default=8, metavar="N",
                   help="canary requests per provider (default 8)")
    p.add_argument("--providers", metavar="A,B",
                   help="only these endpoints (tags, provider slugs or names)")
    p.add_argument("--reference", metavar="NAME",
                   help="the provider whose tool-call triggering is the truth (default: the "
                        "model author's own endpoint, e.g. moonshotai, when listed)")
    p.add_argument("--max-cost", type=finite, default=1.0, metavar="USD",
                   help="refuse to start if the worst case exceeds this (default 1.00)")
    p.add_argument("--max-tokens", type=whole(), metavar="N",
                   help="max_tokens per canary (default: the dataset's, at most 4096)")
    p.add_argument("--min-schema-accuracy", type=finite, default=0.95, metavar="F")
    p.add_argument("--min-trigger-f1", type=finite, default=0.8, metavar="F")
    p.add_argument("--min-witness", type=finite, default=0.9, metavar="F",
                   help="count-witness agreement to keep a provider (default 0.9)")
    p.add_argument("--min-success", type=finite, default=0.8, metavar="F",
                   help="share of canaries answered (default 0.8)")
    p.add_argument("--min-reasoning", type=finite, default=0.9, metavar="F",
                   help="share of thinking canaries answered with reasoning (default 0.9)")
    p.add_argument("--suite", choices=("auto", "config", "builtin"), default="auto",
                   help="canaries: the config's rows (auto: tool-calling first, the built-in "
                        "suite when they declare no tools), or the built-in suite only")
    p.add_argument("--concurrency", type=whole(), default=8, metavar="N",
                   help="canary requests in flight (default 8)")
    p.add_argument("--out", metavar="FILE", help="where to write probe.json "
                                                 "(default: RUN_DIR/probe.json)")
    p.add_argument("--json", action="store_true", help="print probe.json instead of the table")
    p.add_argument("--no-color", action="store_true", help="plain text even on a terminal")
    p.set_defaults(func=run)


def _options(args: argparse.Namespace):
    from ..probe import ProbeOptions, Thresholds

    for name in ("per_provider", "concurrency"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError("--max-tokens must be >= 1")
    if not args.max_cost >= 0:
        raise ValueError("--max-cost must be >= 0 (USD)")
    floors = {k: getattr(args, k) for k in ("min_schema_accuracy", "min_trigger_f1",
                                             "min_witness", "min_success", "min_reasoning")}
    for k, v in floors.items():
        if not 0 <= v <= 1:
            raise ValueError(f"--{k.replace('_', '-')} must be between 0 and 1, got {v}")
    providers = [x.strip() for x in (args.providers or "").split(",") if x.strip()]
    return ProbeOptions(per_provider=args.per_provider, providers=providers,
                        reference=args.reference, max_cost_usd=args.max_cost,
                        max_tokens=args.max_tokens, concurrency=args.concurrency,
                        suite=args.suite, thresholds=Thresholds(**floors))


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import os

    from rich.console import Console

    from ..config import ConfigError, load_config
    from ..engine.outcome import EXIT_CANCELLED, EXIT_INCOMPLETE, EXIT_OK, EXIT_STOPPED
    from ..engine.resume import pin_for_run_dir
    from ..probe import ProbeError, probe
    from ..probe.report import (
        out_problem,
        probe_json,
        ranked,
        table,
        verdict_lines,
        write_json,
    )
    from ..render import RenderError, target_renderer
    from ..tokenizer import TokenizerError, load_tokenizer

    err = Console(stderr=True, highlight=False, markup=False, no_color=args.no_color,
                  soft_wrap=True)
    out = Console(highlight=False, markup=False, no_color=args.no_color)
    if not out.is_terminal:
        out = Console(highlight=False, markup=False, no_color=args.no_color, width=160)
    try:
        opts = _options(args)
        cfg = load_config(args.config)
        pin_for_run_dir(cfg)  # a resumed run's sampling, as it would be sent
        tokenizer = load_tokenizer(cfg.target.tokenizer, cfg.target.encode)
        renderer = target_renderer(cfg, tokenizer)
    except (ValueError, ConfigError, TokenizerError, RenderError) as exc:
        print(f"specgen probe: {exc}", file=sys.stderr)
        return 2
    path = Path(os.path.normpath(args.out or Path(cfg.run_dir) / "probe.json"))
    problem = out_problem(path)
    if problem is not None:  # before a cent is spent
        print(f"specgen probe: cannot write {path}: {problem} (--out FILE picks another "
              "place)", file=sys.stderr)
        return 2

    def on_plan(plan) -> None:
        ref = plan.reference
        err.print(f"specgen probe: {cfg.target.model}: {len(plan.targets)} endpoint(s) x "
                  f"{len(plan.canaries)} canaries from {plan.canary_source}; reference "
                  f"{printable(ref.tag) if ref else 'none (trigger agreement not measured)'}")
        if plan.left_out:
            err.print("  not probed (provider policy, --providers): "
                      + printable(", ".join(plan.left_out)))
        err.print(f"  worst case ${plan.estimate_usd:.4f} (every canary answered with "
                  f"max_tokens), cap --max-cost ${opts.max_cost_usd:g}")

    try:
        result = asyncio.run(probe(cfg, opts, tokenizer=tokenizer, renderer=renderer,
                                   on_plan=on_plan))
    except ProbeError as exc:
        print(f"specgen probe: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("specgen probe: interrupted; in-flight canaries cancelled, nothing written",
              file=sys.stderr)
        return EXIT_CANCELLED
    th = opts.thresholds
    rows = ranked(result, th, require_witness=cfg.quality.require_witness)
    data = probe_json(cfg, result, rows, th, opts)
    try:
        write_json(path, data)
    except OSError as exc:
        print(f"specgen probe: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    else:
        shown = printable_data(rows)  # provider names and tags from the API
        out.print(table(shown, title=f"specgen probe: {cfg.target.model} "
                                     f"(spent ${result.spent_usd:.4f})"))
        for line in verdict_lines(shown):
            out.print(line)
        if data["suggested_toml"]:
            out.print(f"# keeps {len(data['kept'])} of {len(rows)} endpoint(s); "
                      f"paste into {cfg.source}:")
            out.print(printable(data["suggested_toml"], keep="\n"), end="")
        else:
            out.print("no endpoint meets the thresholds: nothing to suggest (see the "
                      "verdicts above)")
    err.print(f"  wrote {path}")
    if result.capped:
        err.print(f"  {result.capped}")
    if result.stopped:
        err.print(f"  stopped early: {result.stopped}")
        return EXIT_STOPPED
    return EXIT_OK if data["kept"] else EXIT_INCOMPLETE
