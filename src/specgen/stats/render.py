"""`specgen stats` as text for a person: one block per dataset (its providers indented), then
the "ready to train?" list of what was found and the command that filters it."""

from __future__ import annotations

from typing import Any


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f}%"


def _dist(d: dict[str, Any]) -> str:
    if not d["count"]:
        return "none"
    return (f"p50 {d['p50']:,}  p90 {d['p90']:,}  p99 {d['p99']:,}  max {d['max']:,}  "
            f"mean {d['mean']:,.1f}")


def _flag(f: dict[str, Any]) -> str:
    return "  <-- above threshold" if f.get("above_threshold") else ""


def _ids(f: dict[str, Any], limit: int = 5) -> str:
    ids = f.get("samples") or []
    if not ids:
        return ""
    more = f["count"] - min(limit, len(ids))
    return " (" + ", ".join(ids[:limit]) + (f", +{more:,} more" if more > 0 else "") + ")"


def group_lines(g: dict[str, Any], indent: str = "  ") -> list[str]:
    tok = g["tokens"]
    calls = g["tool_calls"]
    fr = ", ".join(f"{k} {v:,}" for k, v in g["finish_reasons"].items()) or "none"
    scripts = ", ".join(f"{k} {v:,}" for k, v in g["scripts"].items()) or "none"
    lines = [
        f"{indent}samples {g['samples']:,} in {g['conversations']:,} conversations",
        f"{indent}prompt tokens     {_dist(tok['prompt'])}",
        f"{indent}completion tokens {_dist(tok['completion'])}",
        f"{indent}trainable tokens  {_dist(tok['trainable'])}  (total {tok['trainable']['sum']:,})",
        f"{indent}finish reasons: {fr}",
        f"{indent}cut at max_tokens: {g['truncated']['count']:,} ({_pct(g['truncated']['share'])})"
        f"{_flag(g['truncated'])}",
        f"{indent}reasoning share of trained tokens: {_pct(g['reasoning_share'])}",
        f"{indent}tool calls: {_pct(calls['rate'])} of answers; per answer with calls: "
        f"{_dist(calls['per_answer'])}",
        f"{indent}turns per conversation: {_dist(g['turns_per_conversation'])}",
        f"{indent}duplicate samples (identical trainable span): {g['duplicates']['count']:,} "
        f"({_pct(g['duplicates']['share'])}){_ids(g['duplicates'])}{_flag(g['duplicates'])}",
        f"{indent}duplicate prompts: {g['duplicate_prompts']['count']:,} "
        f"({_pct(g['duplicate_prompts']['share'])})",
        f"{indent}repetition loops: {g['repetition']['count']:,} "
        f"({_pct(g['repetition']['share'])}){_ids(g['repetition'])}{_flag(g['repetition'])}",
        f"{indent}empty answers: {g['empty']['count']:,}{_ids(g['empty'])}; whitespace-only: "
        f"{g['whitespace_only']['count']:,}{_ids(g['whitespace_only'])}",
        f"{indent}scripts: {scripts}",
    ]
    if g.get("quarantined"):
        lines.append(f"{indent}quarantined by the run (not samples): " + ", ".join(
            f"{r} {q['count']:,}" for r, q in g["quarantined"].items()))
    return lines


def ready_list(stats: dict[str, Any], run_dir: str) -> list[dict[str, str]]:
    """What was found that a trainer should not get, each with the command that filters it."""
    t = stats["total"]
    th = stats["thresholds"]
    out = []
    bad = stats.get("unreadable") or {}
    if bad.get("count"):
        first = bad["samples"][0]
        out.append({"finding": f"{bad['count']:,} stored sample(s) damaged or inconsistent "
                               f"(first: {first['sample']}: {first['problem']}); export refuses "
                               "them",
                    "command": f"specgen verify {run_dir}", "above_threshold": True})
    exp = f"specgen export {run_dir} --format tokens"
    if t["truncated"]["count"]:
        out.append({"finding": f"{t['truncated']['count']:,} sample(s) cut at max_tokens "
                               f"({_pct(t['truncated']['share'])})",
                    "command": f"{exp} --drop-truncated",
                    "above_threshold": t["truncated"]["above_threshold"]})
    if t["repetition"]["count"]:
        out.append({"finding": f"{t['repetition']['count']:,} sample(s) with a repetition loop "
                               f"of {th['repetition_tokens']}+ tokens",
                    "command": f"{exp} --max-repetition {th['repetition_tokens'] - 1}",
                    "above_threshold": t["repetition"]["above_threshold"]})
    if t["duplicates"]["count"]:
        out.append({"finding": f"{t['duplicates']['count']:,} duplicate sample(s)",
                    "command": f"{exp} --dedup",
                    "above_threshold": t["duplicates"]["above_threshold"]})
    blank = t["empty"]["count"] + t["whitespace_only"]["count"]
    if blank:
        out.append({"finding": f"{blank:,} empty or whitespace-only answer(s)",
                    "command": f"{exp} --min-trainable-tokens 4",
                    "above_threshold": t["empty"]["above_threshold"]
                    or t["whitespace_only"]["above_threshold"]})
    return out


def render_text(stats: dict[str, Any], run_dir: str) -> str:
    lines = [f"stats of {stats['run_dir']} ({stats['total']['samples']:,} samples, "
             f"{stats['seconds']:.2f}s)"]
    for name, g in stats["datasets"].items():
        if not g["samples"]:
            lines += ["", f"dataset {name}: no samples"]
            if g.get("quarantined"):
                lines.append("  quarantined by the run: " + ", ".join(
                    f"{r} {q['count']:,}" for r, q in g["quarantined"].items()))
            continue
        lines += ["", f"dataset {name}"] + group_lines(g)
        if len(g["providers"]) > 1:
            for prov, pg in g["providers"].items():
                lines += [f"  provider {prov}"] + group_lines(pg, "    ")
        elif g["providers"]:
            lines.append(f"  provider: {next(iter(g['providers']))}")
    if len(stats["datasets"]) > 1:
        lines += ["", "all datasets"] + group_lines(stats["total"])
    found = ready_list(stats, run_dir)
    lines += ["", "ready to train?"]
    if not stats["total"]["samples"] and not found:
        lines.append("  no samples yet")
    elif not found:
        lines.append("  yes: no truncation, repetition loop, duplicate or empty answer found")
    for f in found:
        mark = "!" if f["above_threshold"] else "-"
        lines.append(f"  {mark} {f['finding']}: {f['command']}")
    return "\n".join(lines) + "\n"
