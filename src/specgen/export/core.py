"""`specgen export`: stream a run's samples from the store into training files + a manifest.

Nothing appears under a final name before the whole export is complete: every file is written
under a temporary name next to it and renamed at the end (data files first, the manifest
last; see `Staging`), so a killed or failed export leaves no file that looks complete and
keeps the previous export whole until the new one replaces it.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import witness_sides
from ..display import clean_floats
from ..exclusions import keys_of, name_key, read_excluded
from ..planner import weakest_match
from ..store import ResultRow, Store
from .atomic import fsync_dir, remove, remove_stale, temp_path, write_temp
from .conversations import (
    group_by_conversation,
    openai_row,
    regenerated_conversations,
    specforge_row,
)
from .filters import SampleFilter
from .snapshot import read_snapshot
from .tokens import (
    exported_count_check,
    exported_ids,
    has_true_ids,
    parquet_schema,
    token_row,
    token_samples,
)
from .vocab import (
    DEFAULT_DRAFT_VOCAB,
    TIE_RULES,
    VocabError,
    count_trained,
    write_vocab_files,
)
from .writers import JsonlWriter, ParquetWriter, Writer

FORMATS = ("tokens", "specforge", "openai", "vocab")
DICT_TOTALS = ("count_checks", "prompt_checks", "tool_matches", "providers", "quantizations")


class ExportError(Exception):
    """The export cannot be made (bad option, unknown dataset, unreadable sample)."""


@dataclass
class ExportOptions:
    format: str
    out: Path | None = None  # file, or directory with split_by_dataset; default under run_dir
    datasets: list[str] = field(default_factory=list)  # empty: all
    jsonl: bool = False  # tokens as JSONL instead of Parquet
    split_by_dataset: bool = False
    merge_prefix: bool = False
    include_mismatched: bool = False  # also export samples with count_check = "mismatch"
    include_excluded_providers: bool = False  # also samples of providers the run excluded
    # only samples whose prompt side is one of these classes (quality.shapes: exact,
    # rendering, history, default_system, repaired, unverified; `--prompt-check`); empty: all
    prompt_checks: tuple[str, ...] = ()
    # sample filters (export.filters): left out, counted in the manifest's excluded.filtered
    min_trainable_tokens: int | None = None
    max_repetition: int | None = None
    dedup: bool = False
    drop_truncated: bool = False
    # --format vocab (export.vocab): the draft vocabulary's size; the target's (default: the
    # run's tokenizer)
    draft_vocab_size: int | None = None  # None: 32000, or the target's size when smaller
    target_vocab_size: int | None = None
    max_length: int | None = None  # count only the first N ids of each sample
    vocab_ties: str = "lowest-id"  # export.vocab.TIE_RULES

    def extension(self) -> str:
        return ".parquet" if self.format == "tokens" and not self.jsonl else ".jsonl"

    def filter_flags(self) -> list[str]:
        """The sample filters given, as flags (for messages)."""
        flags = [f"--min-trainable-tokens {self.min_trainable_tokens}"
                 if self.min_trainable_tokens is not None else "",
                 f"--max-repetition {self.max_repetition}"
                 if self.max_repetition is not None else "",
                 "--dedup" if self.dedup else "", "--drop-truncated" if self.drop_truncated else ""]
        return [f for f in flags if f]

    @property
    def as_directory(self) -> bool:
        """The export is a directory (one file per dataset, or the vocab's files)."""
        return self.split_by_dataset or self.format == "vocab"


@dataclass
class DatasetTotals:
    rows: int = 0  # rows written
    samples: int = 0  # stored samples they hold
    conversations: int = 0
    tokens: int = 0  # sum of len(input_ids) over the stored samples
    loss_tokens: int = 0  # sum of loss_mask (the tokens a drafter trains on)
    exported_tokens: int = 0  # ids in the written rows (< tokens after --merge-prefix)
    prompt_tokens: int = 0  # usage as reported by the API
    completion_tokens: int = 0
    cost_usd: float = 0.0
    true_id_samples: int = 0  # samples exported as the backend's own ids
    excluded_mismatch: int = 0  # samples left out: count_check = "mismatch"
    excluded_provider: int = 0  # samples left out: their provider is excluded from the run
    excluded_pending: int = 0  # samples left out: their prompt side not judged yet (pending)
    excluded_prompt_check: int = 0  # samples left out by --prompt-check
    # exported samples by count_check as written ("unchecked": stored before the check)
    count_checks: dict[str, int] = field(default_factory=dict)
    # exported samples by their prompt side's class (quality.shapes; "unchecked": none)
    prompt_checks: dict[str, int] = field(default_factory=dict)
    # exported samples whose prompt reuses recorded tool results, by the weakest match
    tool_matches: dict[str, int] = field(default_factory=dict)
    # exported samples by answering provider and by the quantization that served them
    providers: dict[str, int] = field(default_factory=dict)
    quantizations: dict[str, int] = field(default_factory=dict)
    # exported samples by answering provider: both sides of the witness (specgen.witness_sides)
    witness_sides: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    def add_samples(self, rows: Sequence[ResultRow]) -> None:
        self.conversations += 1
        for r in rows:
            ids, n_prompt = exported_ids(r)
            self.samples += 1
            self.tokens += len(ids)
            self.loss_tokens += len(ids) - n_prompt
            self.prompt_tokens += r.prompt_tokens or 0
            self.completion_tokens += r.completion_tokens or 0
            self.cost_usd += r.cost_usd or 0.0
            self.true_id_samples += has_true_ids(r)
            check = exported_count_check(r) or "unchecked"
            self.count_checks[check] = self.count_checks.get(check, 0) + 1
            side = r.prompt_check or "unchecked"
            self.prompt_checks[side] = self.prompt_checks.get(side, 0) + 1
            provider = r.provider or "(unknown)"
            self.providers[provider] = self.providers.get(provider, 0) + 1
            quant = r.quantization or "unknown"
            self.quantizations[quant] = self.quantizations.get(quant, 0) + 1
            witness_sides.add(self.witness_sides.setdefault(provider, witness_sides.empty()),
                              r.prompt_check, r.completion_check, r.prompt_delta)
            weakest = weakest_match(r.tool_matches)
            if weakest is not None:
                self.tool_matches[weakest] = self.tool_matches.get(weakest, 0) + 1


def default_out(run_dir: Path, opts: ExportOptions) -> Path:
    base = Path(run_dir) / "exports"
    return base / opts.format if opts.as_directory else base / f"{opts.format}{opts.extension()}"


def manifest_path(out: Path, split: bool, jsonl_tokens: bool = False) -> Path:
    """Where an export's manifest goes: `manifest.json` inside a directory, `NAME.manifest.json`
    next to a file `NAME.EXT`, and `NAME.jsonl.manifest.json` next to the JSONL form of the
    tokens format (`--jsonl`), which shares its NAME with the Parquet form: each has its own
    manifest, so neither describes the other's file."""
    if split:
        return out / "manifest.json"
    return out.with_name((out.name if jsonl_tokens else out.stem) + ".manifest.json")


def safe_name(name: str) -> str:
    """A dataset name as a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "dataset"


def export_run(run_dir: str | Path, opts: ExportOptions) -> dict[str, Any]:
    """Write the export described by `opts`; returns the manifest (also written to disk)."""
    run_dir = Path(run_dir)
    if opts.format not in FORMATS:
        raise ExportError(f"unknown export format {opts.format!r}; choose one of {', '.join(FORMATS)}")
    for name in ("min_trainable_tokens", "max_repetition"):
        value = getattr(opts, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 0 <= value < 2**63):
            raise ExportError(f"--{name.replace('_', '-')} must be a whole number from 0 to "
                              f"{2**63 - 1:,} (got {value!r})")
    if opts.merge_prefix and opts.format != "tokens":
        raise ExportError("--merge-prefix applies to --format tokens only")
    out = Path(opts.out) if opts.out else default_out(run_dir, opts)
    if opts.as_directory and out.exists() and not out.is_dir():
        raise ExportError(f"{out}: {'--format vocab' if opts.format == 'vocab' else '--split-by-dataset'} "
                          "writes a directory, but a file is there")
    if opts.format == "vocab" and opts.split_by_dataset:
        raise ExportError("--split-by-dataset does not apply to --format vocab")
    if opts.format != "vocab" and (opts.max_length is not None or opts.vocab_ties != "lowest-id"):
        raise ExportError("--max-length and --vocab-ties apply to --format vocab only")
    if opts.max_length is not None and opts.max_length < 1:
        raise ExportError(f"--max-length must be at least 1 (got {opts.max_length})")
    if opts.vocab_ties not in TIE_RULES:
        raise ExportError(f"--vocab-ties must be one of {', '.join(TIE_RULES)}")
    if not opts.as_directory and out.is_dir():
        raise ExportError(f"{out} is a directory; give a file name (or use --split-by-dataset)")

    import orjson

    with read_snapshot(run_dir) as store:
        names = store.dataset_names()
        unknown = [d for d in opts.datasets if d not in names]
        if unknown:
            raise ExportError(
                f"{run_dir}: no dataset named {', '.join(map(repr, unknown))} in this run "
                f"(datasets: {', '.join(names) or 'none'})")
        selected = [d for d in names if not opts.datasets or d in opts.datasets]
        meta = store.meta()
        stage = Staging(out, opts.as_directory,
                        jsonl_tokens=opts.format == "tokens" and opts.jsonl)
        try:
            sample_filter = SampleFilter(
                min_trainable_tokens=opts.min_trainable_tokens,
                max_repetition=opts.max_repetition, dedup=opts.dedup,
                drop_truncated=opts.drop_truncated)
            counts: Counter[int] | None = Counter() if opts.format == "vocab" else None
            first_seen = {} if counts is not None and opts.vocab_ties == "first-seen" else None
            totals, files = _write(store, selected, stage, opts, meta, sample_filter, counts,
                                   first_seen)
            manifest = build_manifest(run_dir, meta, opts, out, selected, totals, files)
            if counts is not None:
                try:
                    target = opts.target_vocab_size or target_vocab_size(meta)
                    draft = (min(DEFAULT_DRAFT_VOCAB, target) if opts.draft_vocab_size is None
                             else opts.draft_vocab_size)
                    manifest["vocab"] = write_vocab_files(
                        stage, out, counts, draft, target, first_seen=first_seen,
                        max_length=opts.max_length)
                except VocabError as exc:
                    raise ExportError(str(exc)) from None
            if sample_filter.active:
                filtered = sample_filter.manifest()
                manifest["excluded"]["filtered"] = filtered
                manifest["excluded"]["samples"] += filtered["samples"]
                manifest["excluded"]["by_reason"].update(filtered["by_reason"])
            manifest = clean_floats(manifest)
            stage.stage_manifest(orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n")
            stage.publish()
        except BaseException:
            stage.abort()
            raise
    manifest["manifest_path"] = str(stage.manifest)
    return manifest


class Staging:
    """Where an export's files are built, and their publication under the final names.

    * `--split-by-dataset` to a directory that does not exist yet: the whole directory is built
      as `.DIR.tmp-<pid>` (files under their final names inside it) and renamed at the end.
    * otherwise each file `NAME` is built as `.NAME.tmp-<pid>` in its final directory; at the
      end the old manifest is removed, the data files replace theirs (`os.replace`) and the new
      manifest goes last. A data file without its manifest is thus an interrupted publication,
      and a manifest always describes the files next to it.

    Temporary names left by killed exports (their pid no longer running) are removed first.
    """

    def __init__(self, out: Path, split: bool, jsonl_tokens: bool = False):
        self.out = out
        self.manifest = manifest_path(out, split, jsonl_tokens)
        self.files: list[tuple[Path, Path]] = []  # (temporary, final) data files
        self.manifest_temp: Path | None = None
        self.dir_temp: Path | None = None
        out.parent.mkdir(parents=True, exist_ok=True)
        if split and not out.exists():
            remove_stale(out.parent, {out.name})
            self.dir_temp = temp_path(out)
            self.dir_temp.mkdir()
        elif split:
            remove_stale(out)  # the export's own directory: any leftover of ours goes
        else:
            remove_stale(out.parent, {out.name, self.manifest.name})
            for legacy in (out, self.manifest):  # NAME.partial of older specgen versions
                legacy.with_name(legacy.name + ".partial").unlink(missing_ok=True)

    def temp_for(self, final: Path) -> Path:
        """The path to write `final`'s content to (registered for publication)."""
        tmp = self.dir_temp / final.name if self.dir_temp is not None else temp_path(final)
        self.files.append((tmp, final))
        return tmp

    def stage_manifest(self, data: bytes) -> None:
        if self.dir_temp is not None:  # inside the temporary directory: its final name
            tmp = self.dir_temp / self.manifest.name
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            self.manifest_temp = tmp
        else:
            self.manifest_temp = write_temp(self.manifest, data)

    def publish(self) -> None:
        if self.dir_temp is not None:
            fsync_dir(self.dir_temp)
            try:
                os.rename(self.dir_temp, self.out)
            except OSError as exc:
                raise ExportError(f"{self.out}: appeared while the export was written "
                                  f"({exc.strerror}); nothing was replaced") from None
            self.dir_temp = None
            fsync_dir(self.out.parent)
            return
        assert self.manifest_temp is not None
        self.manifest.unlink(missing_ok=True)  # the old manifest would describe old files
        for tmp, final in self.files:
            os.replace(tmp, final)
        fsync_dir(self.manifest.parent)
        os.replace(self.manifest_temp, self.manifest)
        fsync_dir(self.manifest.parent)
        self.files, self.manifest_temp = [], None

    def abort(self) -> None:
        """Remove whatever was built (a no-op after `publish`)."""
        if self.dir_temp is not None:
            remove(self.dir_temp)
            self.dir_temp = None
        for tmp, _ in self.files:
            remove(tmp)
        if self.manifest_temp is not None:
            remove(self.manifest_temp)
        self.files, self.manifest_temp = [], None


def _write(store: Store, selected: list[str], stage: Staging, opts: ExportOptions,
           meta: dict[str, str], sample_filter: SampleFilter | None = None,
           counts: Counter[int] | None = None, first_seen: dict[int, int] | None = None,
           ) -> tuple[dict[str, DatasetTotals], list[dict[str, Any]]]:
    out = stage.out
    totals = {d: DatasetTotals() for d in selected}
    writers: dict[str, Writer] = {}
    files: list[dict[str, Any]] = []
    used_names: dict[str, str] = {}

    def writer_for(dataset: str) -> Writer:
        key = dataset if opts.split_by_dataset else ""
        if key not in writers:
            if opts.split_by_dataset:
                fname = safe_name(dataset) + opts.extension()
                if fname in used_names:
                    raise ExportError(f"datasets {used_names[fname]!r} and {dataset!r} map to "
                                      f"the same file name {fname}")
                used_names[fname] = dataset
                path = out / fname
            else:
                path = out
            writers[key] = _open_writer(path, stage.temp_for(path), opts, meta)
        return writers[key]

    if not opts.as_directory:
        writer_for("")  # one file, even when the run has no samples yet
    try:
        rows_in = _checked(store.iter_results(selected))
        if not opts.include_mismatched:
            rows_in = _without_mismatched(rows_in, totals)
        if opts.prompt_checks:
            rows_in = _with_prompt_checks(rows_in, set(opts.prompt_checks), totals)
        excluded = excluded_provider_names(meta)
        if excluded and not opts.include_excluded_providers:
            rows_in = _without_providers(rows_in, excluded, totals)
        if sample_filter is not None and sample_filter.active:
            rows_in = sample_filter.apply(rows_in)
        if counts is not None:
            rows_in = count_trained(rows_in, counts, max_length=opts.max_length,
                                    first_seen=first_seen)
        groups = group_by_conversation(rows_in)
        if opts.format == "vocab":
            for rows in groups:
                t = totals[rows[0].dataset]
                t.add_samples(rows)
                t.exported_tokens += sum(len(exported_ids(r)[0]) for r in rows)
        elif opts.format == "tokens":
            for rows, samples in token_samples(groups, merge=opts.merge_prefix):
                t = totals[rows[0].dataset]
                t.add_samples(rows)
                w = writer_for(rows[0].dataset)
                for s in samples:
                    w.write(token_row(s, merged=opts.merge_prefix))
                    t.rows += 1
                    t.exported_tokens += len(s.input_ids)
        else:
            make_row = specforge_row if opts.format == "specforge" else openai_row
            for rows in groups:
                t = totals[rows[0].dataset]
                t.add_samples(rows)
                t.exported_tokens += sum(len(exported_ids(r)[0]) for r in rows)
                w = writer_for(rows[0].dataset)
                for conv in regenerated_conversations(rows):
                    w.write(make_row(conv))
                    t.rows += 1
        for key, w in writers.items():
            entry = w.close()
            entry["dataset"] = key or None
            files.append(entry)
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    return totals, files


def target_vocab_size(meta: dict[str, str]) -> int:
    """The vocabulary size of the run's tokenizer (its config's `target.tokenizer`)."""
    import orjson

    from ..tokenizer import load_tokenizer

    try:
        spec = orjson.loads(meta.get("config_json") or "{}")["target"]["tokenizer"]
        return int(load_tokenizer(spec).vocab_size)
    except Exception as exc:  # noqa: BLE001 - any failure: the user gives the size
        raise ExportError(f"the run's tokenizer cannot be loaded to learn the target's "
                          f"vocabulary size ({type(exc).__name__}: {exc}); give "
                          "--target-vocab-size") from None


def _checked(rows):
    """Turn an undecodable stored sample, or one whose prompt length does not fit its ids (a
    tampered `n_prompt` would export negative trained tokens), into an ExportError naming it
    (and `specgen verify`)."""
    it = iter(rows)
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except (ValueError, TypeError, KeyError) as exc:
            raise ExportError(f"a stored sample cannot be read ({exc}); run `specgen verify` "
                              "to find it") from None
        problem = inconsistency(row)
        if problem:
            raise ExportError(f"stored sample {row.dataset}/{row.conv_id} turn {row.turn} "
                              f"(task {row.task}) is inconsistent: {problem}; nothing was "
                              "exported (run `specgen verify`)")
        yield row


def inconsistency(r: ResultRow) -> str | None:
    """What makes a stored sample impossible as a training sample, else None: its prompt
    length (`n_prompt`, the loss mask's zeros) outside its ids."""
    n, total = r.n_prompt, len(r.input_ids)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= total:
        return f"n_prompt {n!r} outside the sample's {total:,} ids"
    return None


def is_mismatched(r: ResultRow) -> bool:
    """A sample whose ids the provider's own token counts contradict (the sample is wrong).
    Not when the backend returned its ids: those are what is exported, and the verdict was
    about our rebuilt ids."""
    return r.count_check == "mismatch" and not has_true_ids(r)


def _without_mismatched(rows, totals: dict[str, DatasetTotals]):
    """The samples less the mismatched ones, counted per dataset as excluded."""
    for r in rows:
        if is_mismatched(r):
            totals[r.dataset].excluded_mismatch += 1
            continue
        if r.count_check == "pending" and not has_true_ids(r):
            totals[r.dataset].excluded_pending += 1  # judged at the run's end: not yet
            continue
        yield r


def _with_prompt_checks(rows, wanted: set[str], totals: dict[str, DatasetTotals]):
    """The samples whose prompt side is one of `wanted` (`--prompt-check`), the others
    counted per dataset as excluded."""
    for r in rows:
        if (r.prompt_check or "unchecked") not in wanted and not has_true_ids(r):
            totals[r.dataset].excluded_prompt_check += 1
            continue
        yield r


def excluded_provider_names(meta: dict[str, str]) -> set[str]:
    """Names and slugs (normalised) of the providers the run has excluded."""
    return keys_of(read_excluded(meta))


def _without_providers(rows, excluded: set[str], totals: dict[str, DatasetTotals]):
    """The samples less those of excluded providers, counted per dataset."""
    for r in rows:
        if r.provider and name_key(r.provider) in excluded:
            totals[r.dataset].excluded_provider += 1
            continue
        yield r


def _open_writer(path: Path, temp: Path, opts: ExportOptions, meta: dict[str, str]) -> Writer:
    if opts.format == "tokens" and not opts.jsonl:
        return ParquetWriter(path, parquet_schema(merged=opts.merge_prefix), temp=temp, metadata={
            "specgen.config_hash": meta.get("config_hash", ""),
            "specgen.tokenizer_fingerprint": meta.get("tokenizer_fingerprint", ""),
            "specgen.renderer": meta.get("renderer", ""),
            "specgen.model": meta.get("model", ""),
        })
    return JsonlWriter(path, temp)


def hub_pins(meta: dict[str, str]) -> dict[str, Any]:
    from ..sources.pins import hub_pins as pins

    return pins(meta)


def build_manifest(run_dir: Path, meta: dict[str, str], opts: ExportOptions, out: Path,
                   selected: list[str], totals: dict[str, DatasetTotals],
                   files: list[dict[str, Any]]) -> dict[str, Any]:
    from .. import __version__

    total = DatasetTotals()
    for t in totals.values():
        for k in asdict(total):
            if k == "witness_sides":
                witness_sides.merge(total.witness_sides, t.witness_sides)
            elif k in DICT_TOTALS:
                into = getattr(total, k)
                for key, n in getattr(t, k).items():
                    into[key] = into.get(key, 0) + n
            else:
                setattr(total, k, getattr(total, k) + getattr(t, k))
    for t in (total, *totals.values()):
        for k in DICT_TOTALS:
            setattr(t, k, dict(sorted(getattr(t, k).items())))
        t.witness_sides = witness_sides.ordered(t.witness_sides)
    for t in (total, *totals.values()):
        t.cost_usd = round(t.cost_usd, 10)  # no float-sum noise in the manifest
    per = {d: asdict(t) for d, t in totals.items()}
    options = asdict(opts)
    options["out"] = str(out)
    return {
        "specgen_version": __version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run_dir": str(run_dir.resolve()),
        "format": opts.format,
        "options": options,
        "config_hash": meta.get("config_hash"),
        "tokenizer_fingerprint": meta.get("tokenizer_fingerprint"),
        "renderer": meta.get("renderer"),
        "model": meta.get("model"),
        "thinking": meta.get("thinking"),
        "shard": meta.get("shard") or None,
        "merged_from": _json_or_none(meta.get("merged_from")),
        "datasets": selected,
        "sources": hub_pins(meta),  # Hub datasets: dataset, subset, split, pinned commit
        "files": files,
        "totals": asdict(total),
        "per_dataset": per,
        "loss_mask": "1 on the ids the model sampled (completion), 0 on the prompt",
        "ids": "the backend's own ids where it returned them (true_prompt_ids + "
               "true_completion_ids), else specgen's rebuilt ids",
        "excluded": {
            "samples": total.excluded_mismatch + total.excluded_provider
            + total.excluded_pending + total.excluded_prompt_check,
            "by_reason": {"count_mismatch": total.excluded_mismatch,
                          "provider_excluded": total.excluded_provider,
                          "witness_pending": total.excluded_pending,
                          "prompt_check": total.excluded_prompt_check},
            "prompt_checks": list(opts.prompt_checks),
            "providers": sorted(read_excluded(meta)),
            "why": ("left out: samples whose ids contradict the provider's own token counts "
                    "(count_check = mismatch); --include-mismatched exports them"
                    if not opts.include_mismatched else
                    "no mismatched sample left out: --include-mismatched was given")
            + ("; samples of the providers the run excluded (quality policing or `specgen "
               "provider --exclude`); --include-excluded-providers exports them"
               if not opts.include_excluded_providers else
               "; excluded providers' samples kept: --include-excluded-providers was given"),
        },
    }


def _json_or_none(value: str | None):
    if not value:
        return None
    from .. import jsonexact

    try:
        return jsonexact.loads(value)
    except jsonexact.JSONDecodeError:
        return value
