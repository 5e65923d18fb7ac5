"""`specgen stats`: what the stored samples look like, computed from the store in one pass.

Per dataset and per (dataset, provider), and for the whole run: distributions (percentiles and
a histogram) of prompt, completion and trainable tokens; finish reasons and the share cut at
`max_tokens`; the reasoning share of the trained tokens; tool-call rate, calls per answer and
turns per conversation; duplicate samples (identical trainable spans) and duplicate prompts;
repetition loops (specgen.quality.repetition); empty and whitespace-only answers; the scripts
the answers are written in. Sample ids are the exports' (`dataset/conv_id/turn`).

The ids measured are the ones exported: the backend's own when it returned them, else the
rebuilt ones. The trainable part is the completion (loss mask 1).
"""

from __future__ import annotations

import hashlib
import math
import time
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..quality.repetition import MAX_PERIOD, MIN_TOKENS, find_loop, may_loop
from ..store import unpack_ids
from .scripts import script_of

# Histogram bin edges, in tokens: 0, 1, 2, 4, ... (a bin holds edges[i] <= n < edges[i+1]).
EDGES = [0, 1] + [2 ** k for k in range(1, 21)]
PERCENTILES = (50, 90, 99)
LISTED = 50  # sample ids listed per finding (all are counted)


@dataclass
class StatsOptions:
    datasets: list[str] = field(default_factory=list)  # empty: all
    repetition_tokens: int = MIN_TOKENS  # a loop repeats at least this many tokens
    repetition_period: int = MAX_PERIOD  # of a block of at most this many tokens
    truncated_threshold: float = 0.05  # shares above these are called out
    repetition_threshold: float = 0.01
    duplicate_threshold: float = 0.01
    empty_threshold: float = 0.01


class Dist:
    """Integer values: count, sum, percentiles, histogram over EDGES."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values = array("I")  # 4 bytes a value: a million samples stay small

    def add(self, v: int) -> None:
        self.values.append(v)

    def to_json(self) -> dict[str, Any]:
        vals = sorted(self.values)
        n = len(vals)
        out: dict[str, Any] = {"count": n, "sum": sum(vals)}
        if not n:
            return {**out, "mean": None, "min": None, "max": None,
                    **{f"p{p}": None for p in PERCENTILES}, "histogram": []}
        out.update(mean=round(out["sum"] / n, 2), min=vals[0], max=vals[-1])
        for p in PERCENTILES:
            out[f"p{p}"] = vals[min(n - 1, max(0, math.ceil(p / 100 * n) - 1))]
        counts: dict[int, int] = {}
        for v in vals:
            i = bisect_right(EDGES, v) - 1
            counts[i] = counts.get(i, 0) + 1
        lo, hi = min(counts), max(counts)
        hist = [{"from": EDGES[i], "to": EDGES[i + 1] if i + 1 < len(EDGES) else None,
                 "count": counts.get(i, 0)} for i in range(lo, hi + 1)]
        out["histogram"] = hist
        return out


class Group:
    """The figures of one group of samples (a dataset, a dataset's provider, the run)."""

    def __init__(self) -> None:
        self.samples = 0
        self.prompt = Dist()
        self.completion = Dist()
        self.trainable = Dist()
        self.finish: dict[str, int] = {}
        self.reasoning_tokens = 0  # usage's reasoning tokens of the samples that report it
        self.reasoning_of = 0  # completion tokens of those samples
        self.with_calls = 0
        self.calls = Dist()  # tool calls per answer that has any
        self.empty: list[str] = []
        self.whitespace: list[str] = []
        self.loops: list[dict[str, Any]] = []
        self.duplicates: list[str] = []  # samples whose trainable span an earlier one had
        self.duplicate_prompts = 0  # samples whose prompt ids an earlier one had
        self.scripts: dict[str, int] = {}
        self.conversations: dict[int, int] = {}  # conversation row id -> samples

    def merge(self, o: Group) -> None:
        """Add the common figures of `o` (not its findings: those are kept in every group)."""
        self.samples += o.samples
        for mine, theirs in ((self.prompt, o.prompt), (self.completion, o.completion),
                             (self.trainable, o.trainable), (self.calls, o.calls)):
            mine.values.extend(theirs.values)
        for mine, theirs in ((self.finish, o.finish), (self.scripts, o.scripts),
                             (self.conversations, o.conversations)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        self.reasoning_tokens += o.reasoning_tokens
        self.reasoning_of += o.reasoning_of
        self.with_calls += o.with_calls
        self.duplicate_prompts += o.duplicate_prompts

    def to_json(self, opts: StatsOptions) -> dict[str, Any]:
        n = self.samples
        cut = self.finish.get("length", 0)

        def share(k: int) -> float | None:
            return round(k / n, 4) if n else None

        turns = Dist()
        for k in self.conversations.values():
            turns.add(k)
        return {
            "samples": n,
            "conversations": len(self.conversations),
            "tokens": {"prompt": self.prompt.to_json(), "completion": self.completion.to_json(),
                       "trainable": self.trainable.to_json()},
            "finish_reasons": dict(sorted(self.finish.items())),
            "truncated": {"count": cut, "share": share(cut),
                          "above_threshold": bool(n and cut / n > opts.truncated_threshold)},
            "reasoning_share": (round(self.reasoning_tokens / self.reasoning_of, 4)
                                if self.reasoning_of else None),
            "tool_calls": {"answers_with_calls": self.with_calls,
                           "rate": share(self.with_calls),
                           "per_answer": self.calls.to_json()},
            "turns_per_conversation": turns.to_json(),
            "duplicates": _finding(self.duplicates, n, opts.duplicate_threshold),
            "duplicate_prompts": {"count": self.duplicate_prompts,
                                  "share": share(self.duplicate_prompts)},
            "repetition": {**_finding([lp["sample"] for lp in self.loops], n,
                                      opts.repetition_threshold),
                           "loops": self.loops[:LISTED]},
            "empty": _finding(self.empty, n, opts.empty_threshold),
            "whitespace_only": _finding(self.whitespace, n, opts.empty_threshold),
            "scripts": dict(sorted(self.scripts.items(), key=lambda kv: (-kv[1], kv[0]))),
        }


def _finding(ids: list[str], n: int, threshold: float) -> dict[str, Any]:
    return {"count": len(ids), "share": round(len(ids) / n, 4) if n else None,
            "above_threshold": bool(n and len(ids) / n > threshold), "samples": ids[:LISTED]}


# The columns one pass needs (no request blob: the prompt is measured on its ids).
_SQL = (
    "SELECT r.dataset, c.conv_id, r.turn, r.conversation, r.provider, r.finish_reason, "
    "r.message, r.input_ids, r.n_prompt, r.true_prompt_ids, r.true_completion_ids, "
    "r.completion_tokens, r.reasoning_tokens FROM results r "
    "LEFT JOIN conversations c ON c.id = r.conversation "
    "LEFT JOIN datasets d ON d.name = r.dataset "
)


def _rows(conn, datasets: list[str]) -> Iterator[tuple]:
    sql, args = _SQL, []
    if datasets:
        sql += f"WHERE r.dataset IN ({','.join('?' * len(datasets))}) "
        args = list(datasets)
    sql += "ORDER BY d.position, c.row_index, r.turn, r.task"
    cur = conn.execute(sql, args)
    while rows := cur.fetchmany(512):
        yield from rows


def compute_stats(run_dir: str | Path, opts: StatsOptions | None = None) -> dict[str, Any]:
    """The stats of a run's stored samples (a JSON-able dict; see the module doc)."""
    from ..export.snapshot import read_snapshot

    opts = opts or StatsOptions()
    t0 = time.perf_counter()
    with read_snapshot(run_dir) as store:
        names = store.dataset_names()
        unknown = [d for d in opts.datasets if d not in names]
        if unknown:
            raise StatsError(f"{run_dir}: no dataset named {', '.join(map(repr, unknown))} in "
                             f"this run (datasets: {', '.join(names) or 'none'})")
        meta = store.meta()
        result = scan(_rows(store.conn, opts.datasets), opts)
        add_quarantined(result, store.conn, opts.datasets)
    result["run_dir"] = str(Path(run_dir))
    result["model"] = meta.get("model")
    result["seconds"] = round(time.perf_counter() - t0, 3)
    return result


def add_quarantined(result: dict[str, Any], conn, datasets: list[str]) -> None:
    """Answers kept out of the samples by the run's policy (quarantine), by reason, with their
    sample ids: an empty answer, for one, is quarantined, not stored as a sample."""
    rows = conn.execute(
        "SELECT q.dataset, q.reason, c.conv_id, t.turn FROM quarantine q "
        "LEFT JOIN tasks t ON t.id = q.task LEFT JOIN conversations c ON c.id = t.conversation "
        "ORDER BY q.id").fetchall()
    total: dict[str, list[str]] = {}
    per: dict[str, dict[str, list[str]]] = {}
    for dataset, reason, conv_id, turn in rows:
        if datasets and dataset not in datasets:
            continue
        ident = f"{dataset}/{conv_id}/{turn}" if conv_id is not None else f"{dataset}/?"
        total.setdefault(reason, []).append(ident)
        per.setdefault(dataset, {}).setdefault(reason, []).append(ident)

    def as_json(by: dict[str, list[str]]) -> dict[str, Any]:
        return {r: {"count": len(ids), "samples": ids[:LISTED]} for r, ids in sorted(by.items())}

    result["total"]["quarantined"] = as_json(total)
    for name, g in result["datasets"].items():
        g["quarantined"] = as_json(per.get(name, {}))
    for name in per:
        if name not in result["datasets"]:
            result["datasets"][name] = {"samples": 0, "quarantined": as_json(per[name])}


class StatsError(Exception):
    """The stats cannot be computed (unknown dataset)."""


def _digest(dataset: str, blob: bytes) -> int:
    h = hashlib.blake2b(dataset.encode() + b"\0", digest_size=8)
    h.update(blob)
    return int.from_bytes(h.digest(), "little")


def scan(rows, opts: StatsOptions) -> dict[str, Any]:
    """The stats of rows of `_SQL` (the one pass)."""
    total = Group()
    per_ds: dict[str, Group] = {}
    per_prov: dict[tuple[str, str], Group] = {}
    # 64-bit digests of (dataset, ids): a collision among a million samples has odds ~3e-8
    seen_span: set[int] = set()
    seen_prompt: set[int] = set()
    min_rep, max_period = opts.repetition_tokens, opts.repetition_period
    unreadable: list[dict[str, str]] = []  # damaged or tampered rows: counted, not measured
    for (dataset, conv_id, turn, conversation, provider, finish, message, ids_blob, n_prompt,
         tp_blob, tc_blob, completion_tokens, reasoning_tokens) in rows:
        msg, problem = _readable(message, ids_blob, n_prompt)
        if problem is not None:
            unreadable.append({"sample": f"{dataset}/{conv_id}/{turn}", "problem": problem})
            continue
        if tp_blob is not None and tc_blob is not None:
            prompt_blob, span_blob = tp_blob, tc_blob
        else:
            prompt_blob, span_blob = ids_blob[:4 * n_prompt], ids_blob[4 * n_prompt:]
        n_p, n_c = len(prompt_blob) // 4, len(span_blob) // 4
        sid = f"{dataset}/{conv_id}/{turn}"
        prov = provider or "(unknown)"
        g_ds = per_ds.get(dataset)
        if g_ds is None:
            g_ds = per_ds[dataset] = Group()
        g_pv = per_prov.get((dataset, prov))
        if g_pv is None:
            g_pv = per_prov[(dataset, prov)] = Group()
        content = msg.get("content") or ""
        if not isinstance(content, str):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        n_calls = len(msg.get("tool_calls") or ())
        empty = whitespace = False
        if not n_calls and not content.strip():
            empty, whitespace = not content, bool(content)
        span_key = _digest(dataset, span_blob)
        dup_span = span_key in seen_span
        seen_span.add(span_key)
        prompt_key = _digest(dataset, prompt_blob)
        dup_prompt = prompt_key in seen_prompt
        seen_prompt.add(prompt_key)
        loop = None
        if n_c > min_rep and may_loop(span_blob, min_rep, max_period):
            loop = find_loop(unpack_ids(span_blob) or [], min_rep, max_period, span_blob)
        text = content or msg.get("reasoning_content") or msg.get("reasoning") or ""
        script = script_of(text) if isinstance(text, str) else "none"
        # the common figures go to the provider's group only (merged into its dataset's and
        # the run's at the end); the rare findings, with their sample ids, to all three
        g = g_pv
        g.samples += 1
        g.prompt.add(n_p)
        g.completion.add(n_c)
        g.trainable.add(n_c)
        f = finish or "(none)"
        g.finish[f] = g.finish.get(f, 0) + 1
        if reasoning_tokens is not None and completion_tokens:
            g.reasoning_tokens += reasoning_tokens
            g.reasoning_of += completion_tokens
        if n_calls:
            g.with_calls += 1
            g.calls.add(n_calls)
        if dup_prompt:
            g.duplicate_prompts += 1
        g.scripts[script] = g.scripts.get(script, 0) + 1
        g.conversations[conversation] = g.conversations.get(conversation, 0) + 1
        if empty or whitespace or dup_span or loop is not None:
            for g in (total, g_ds, g_pv):
                if empty:
                    g.empty.append(sid)
                if whitespace:
                    g.whitespace.append(sid)
                if dup_span:
                    g.duplicates.append(sid)
                if loop is not None:
                    g.loops.append({"sample": sid, "tokens": loop.tokens,
                                    "period": loop.period, "start": loop.start})
    for (d, _), pg in sorted(per_prov.items()):
        per_ds[d].merge(pg)
    for g in per_ds.values():
        total.merge(g)
    datasets = {}
    for name, g in per_ds.items():
        datasets[name] = {**g.to_json(opts), "providers": {
            p: pg.to_json(opts) for (d, p), pg in sorted(per_prov.items()) if d == name}}
    return {
        "thresholds": {"repetition_tokens": min_rep, "repetition_period": max_period,
                       "truncated": opts.truncated_threshold,
                       "repetition": opts.repetition_threshold,
                       "duplicates": opts.duplicate_threshold, "empty": opts.empty_threshold},
        "total": total.to_json(opts),
        "datasets": datasets,
        "unreadable": {"count": len(unreadable), "samples": unreadable[:LISTED]},
    }


def _readable(message: Any, ids_blob: Any, n_prompt: Any) -> tuple[dict[str, Any], str | None]:
    """(the stored message, None), or ({}, what makes the row unusable): a message that is not
    a JSON object, ids that are not a blob, a prompt length outside the ids."""
    try:
        msg = orjson.loads(message)
    except (orjson.JSONDecodeError, TypeError):
        return {}, "its message is not JSON"
    if not isinstance(msg, dict):
        return {}, "its message is not a JSON object"
    if not isinstance(ids_blob, bytes):
        return {}, "its ids are not stored as a blob"
    if isinstance(n_prompt, bool) or not isinstance(n_prompt, int) \
            or not 0 <= 4 * n_prompt <= len(ids_blob):
        return {}, f"n_prompt {n_prompt!r} outside its {len(ids_blob) // 4:,} ids"
    return msg, None
