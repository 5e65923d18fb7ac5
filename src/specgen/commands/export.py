"""`specgen export RUN_DIR --format tokens|specforge|openai|vocab`: training files + a manifest."""

from __future__ import annotations

import argparse
import sys

from .numbers import MAX_IDS, whole
from .rundir import RunDirError, add_run_dir, resolve_run_dir


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="write the run's samples as training files (tokens, specforge, openai, vocab)",
        description="Stream the stored samples of a run into files drafter trainers load "
                    "unchanged, with a manifest JSON next to them. Safe while the run is "
                    "still writing (one consistent snapshot per export).")
    add_run_dir(p)
    p.add_argument("--format", "-f", required=True, choices=["tokens", "specforge", "openai", "vocab"],
                   help="tokens: input_ids + loss_mask (Parquet, or JSONL with --jsonl); "
                        "specforge: SpecForge conversation JSONL; openai: OpenAI messages JSONL; "
                        "vocab: trained-token frequencies + the draft vocabulary's d2t/t2d "
                        "(a directory)")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="output file (a directory with --split-by-dataset); "
                        "default RUN_DIR/exports/FORMAT.EXT")
    p.add_argument("--dataset", action="append", default=[], metavar="NAME",
                   help="export only this dataset (repeatable)")
    p.add_argument("--jsonl", action="store_true", help="tokens as JSONL instead of Parquet")
    p.add_argument("--split-by-dataset", action="store_true",
                   help="one file per dataset in the output directory")
    p.add_argument("--merge-prefix", action="store_true",
                   help="tokens: merge a conversation's samples into one row when each is an "
                        "id-level prefix of the next (every sampled span masked)")
    p.add_argument("--include-mismatched", action="store_true",
                   help="also export samples whose ids contradict the provider's own token "
                        "counts (count_check = mismatch); left out by default")
    p.add_argument("--include-excluded-providers", action="store_true",
                   help="also export samples of providers the run excluded (quality policing "
                        "or `specgen provider --exclude`); left out by default")
    p.add_argument("--prompt-check", action="append", default=[], metavar="CLASS",
                   choices=PROMPT_FILTERS,
                   help="export only samples whose prompt side is this class (repeatable: "
                        "exact, rendering, default_system, history, repaired, unverified; "
                        "docs/quality.md, \"Prompt side\"); counted in the manifest "
                        "(excluded.by_reason.prompt_check)")
    p.add_argument("--draft-vocab-size", type=whole(MAX_IDS), metavar="N",
                   help="vocab: the draft vocabulary's size (default 32000, or the target's "
                        "when smaller)")
    p.add_argument("--target-vocab-size", type=whole(MAX_IDS), metavar="N",
                   help="vocab: the target's vocabulary size (default: the run's tokenizer's)")
    p.add_argument("--max-length", type=int, metavar="N",
                   help="vocab: count only the first N tokens of each sample, as a trainer "
                        "that truncates samples at N does (SpecForge's --max-length)")
    p.add_argument("--vocab-ties", choices=["lowest-id", "first-seen"], default="lowest-id",
                   help="vocab: which of equally frequent ids enters the draft vocabulary: "
                        "the lower id (speculators' rule, the default) or the one seen first "
                        "in the export's sample order (SpecForge's rule over the order it "
                        "reads samples in; docs/stats.md)")
    add_filter_options(p)
    p.set_defaults(func=run)


# the prompt-side classes a sample can be kept with (quality.shapes), and "unchecked"
PROMPT_FILTERS = ("exact", "rendering", "default_system", "history", "repaired",
                  "unverified", "unchecked")


def add_filter_options(p) -> None:
    """The sample filters (docs/stats.md, "Filtering"); what they leave out is in the manifest."""
    g = p.add_argument_group("sample filters (counted in the manifest: excluded.filtered)")
    g.add_argument("--min-trainable-tokens", type=whole(), metavar="N",
                   help="leave out samples with fewer than N trainable (loss-mask 1) tokens")
    g.add_argument("--max-repetition", type=whole(), metavar="N",
                   help="leave out samples whose repetition loop repeats more than N tokens "
                        "(see specgen stats)")
    g.add_argument("--dedup", action="store_true",
                   help="leave out a sample whose trainable span an earlier sample of its "
                        "dataset has")
    g.add_argument("--drop-truncated", action="store_true",
                   help="leave out samples cut at max_tokens (finish_reason = length)")


def run(args: argparse.Namespace) -> int:
    import sqlite3
    from pathlib import Path

    from ..config import ConfigError
    from ..display import path as tidy
    from ..display import printable
    from ..export import ExportError, ExportOptions, export_run
    from ..export.atomic import describe_os_error
    from ..store import StoreError

    try:
        args.run_dir = resolve_run_dir(args.run_dir)
    except (ConfigError, RunDirError) as exc:
        print(f"specgen export: {exc}", file=sys.stderr)
        return 2

    opts = ExportOptions(
        format=args.format, out=Path(args.output) if args.output else None,
        datasets=list(args.dataset), jsonl=args.jsonl,
        split_by_dataset=args.split_by_dataset, merge_prefix=args.merge_prefix,
        include_mismatched=args.include_mismatched,
        include_excluded_providers=args.include_excluded_providers,
        prompt_checks=tuple(args.prompt_check),
        min_trainable_tokens=args.min_trainable_tokens, max_repetition=args.max_repetition,
        dedup=args.dedup, drop_truncated=args.drop_truncated,
        draft_vocab_size=args.draft_vocab_size, target_vocab_size=args.target_vocab_size,
        max_length=args.max_length, vocab_ties=args.vocab_ties)
    try:
        manifest = export_run(args.run_dir, opts)
    except (ExportError, StoreError) as exc:
        print(f"specgen export: {exc}", file=sys.stderr)
        return 2
    except (OSError, sqlite3.Error) as exc:  # disk full, no permission, ...
        what = str(opts.out or f"the export of {args.run_dir}")
        reason = (describe_os_error(exc, what) if isinstance(exc, OSError)
                  else f"{what} failed: SQLite: {exc} (reading the store, or SQLite's "
                       "temporary files: is a disk full?)")
        print(f"specgen export: {reason}; the export's temporary files were removed (an "
              "earlier export there is left as it was)", file=sys.stderr)
        return 1
    t = manifest["totals"]
    out = Path(manifest["options"]["out"])
    for f in manifest["files"]:
        print(f"wrote {f['rows']:,} rows to "
              f"{tidy(out / f['path'] if opts.split_by_dataset else out)}")
    if "vocab" in manifest:
        v = manifest["vocab"]
        cov = "-" if v["coverage"] is None else f"{100 * v['coverage']:.2f}%"
        print(f"wrote {', '.join(v['files'])} to {tidy(out)}: draft vocabulary of "
              f"{v['draft_vocab_size']:,} of {v['target_vocab_size']:,} ids covers {cov} of "
              f"{v['trained_tokens']:,} trained tokens ({v['distinct_trained_tokens']:,} "
              "distinct)")
        if "not installed" in v["torch"]:
            print(v["torch"])
    print(f"{t['samples']:,} samples, {t['tokens']:,} tokens ({t['loss_tokens']:,} trained on); "
          f"manifest {tidy(manifest['manifest_path'])}")
    if t["true_id_samples"] and opts.format == "tokens":
        print(f"{t['true_id_samples']:,} of them as the backend's own ids (true ids)")
    elif t["true_id_samples"] and opts.format == "vocab":
        print(f"{t['true_id_samples']:,} of them counted with the backend's own ids (true ids)")
    elif t["true_id_samples"]:
        print(f"{t['true_id_samples']:,} of them have the backend's own ids; the {opts.format} "
              "format carries text (the trainer tokenizes it): --format tokens exports the ids")
    if t["excluded_mismatch"]:
        print(f"left out {t['excluded_mismatch']:,} sample(s) whose ids contradict the provider's "
              "token counts (count_check = mismatch); --include-mismatched exports them")
    if t["excluded_provider"]:
        print(f"left out {t['excluded_provider']:,} sample(s) of excluded providers "
              f"({printable(', '.join(manifest['excluded']['providers']))}); "
              "--include-excluded-providers exports them")
    filtered = manifest["excluded"].get("filtered")
    if filtered:
        parts = [f"{n:,} {why}" for why, n in filtered["by_reason"].items() if n]
        print(f"filtered out {filtered['samples']:,} sample(s)"
              + (f": {', '.join(parts)}" if parts else "") + " (manifest: excluded.filtered)")
    if not t["excluded_mismatch"] and opts.include_mismatched and t["count_checks"].get("mismatch"):
        print(f"included {t['count_checks']['mismatch']:,} sample(s) with count_check = mismatch")
    if not t["samples"]:
        why = _why_empty(args.run_dir, {**t, "filtered": (filtered or {}).get("samples", 0)},
                         opts)
        print(f"specgen export: nothing exported — {why}",
              file=sys.stderr)
        return 6
    return 0


def _why_empty(run_dir, totals: dict, opts) -> str:
    """Why an export wrote no sample: samples left out by the options, or the run's own
    judgement (specgen.judgement)."""
    left_out = []
    if totals["excluded_mismatch"]:
        left_out.append(f"{totals['excluded_mismatch']:,} whose ids contradict the provider's "
                        "counts (--include-mismatched)")
    if totals["excluded_provider"]:
        left_out.append(f"{totals['excluded_provider']:,} of excluded providers "
                        "(--include-excluded-providers)")
    if totals.get("filtered"):
        left_out.append(f"{totals['filtered']:,} by the sample filters "
                        f"({', '.join(opts.filter_flags()) or 'see above'}: loosen or drop "
                        "them)")
    if left_out:
        return "every sample was left out: " + "; ".join(left_out)
    from ..judgement import judge
    from ..store import Store

    with Store.open(run_dir) as store:
        verdict = judge(store, opts.datasets or None).verdict
    return verdict or ("the run has no sample yet" + (f" in {', '.join(opts.datasets)}"
                                                       if opts.datasets else ""))
