"""The report's "Ready to train?" section: `specgen stats` of the run as tables and inline SVG
distributions, the truncated and repetition shares highlighted above their thresholds, and
what was found with the export command that filters it."""

from __future__ import annotations

from pathlib import Path

from ..stats import compute_stats
from ..stats.render import ready_list
from .sections import Histogram, Section, Table

SECTION_ID = "data-quality"


def _pct(share: float | None) -> str:
    return "—" if share is None else f"{100 * share:.1f}%"


def data_quality_section(run_dir: str | Path, shown: str) -> Section:
    stats = compute_stats(run_dir)
    sec = Section(SECTION_ID, "Ready to train?")
    t = stats["total"]
    th = stats["thresholds"]
    if not t["samples"]:
        sec.notes.append("no samples yet")
        return sec
    for key, label, limit in (("truncated", "are cut at max_tokens", th["truncated"]),
                              ("repetition", "hold a repetition loop", th["repetition"]),
                              ("duplicates", "are duplicates", th["duplicates"])):
        f = t[key]
        if f["above_threshold"]:
            sec.alerts.append(f"{_pct(f['share'])} of the samples {label} ({f['count']:,}; "
                              f"threshold {_pct(limit)})")
    found = ready_list(stats, shown)
    sec.tables.append(Table("What was found, and the export that filters it",
                            ["finding", "above threshold", "command"],
                            [[f["finding"], "yes" if f["above_threshold"] else "no",
                              f["command"]] for f in found]))
    if not found:
        sec.notes.append("ready: no truncation, repetition loop, duplicate or empty answer found")
    rows = []
    for name, g in stats["datasets"].items():
        if not g["samples"]:
            continue
        tr = g["tokens"]["trainable"]
        rows.append([name, g["samples"], tr["p50"], tr["p90"], tr["p99"], tr["max"],
                     _pct(g["truncated"]["share"]), g["repetition"]["count"],
                     g["duplicates"]["count"], g["duplicate_prompts"]["count"],
                     g["empty"]["count"] + g["whitespace_only"]["count"],
                     _pct(g["reasoning_share"]), _pct(g["tool_calls"]["rate"]),
                     ", ".join(f"{k} {v}" for k, v in list(g["scripts"].items())[:3])])
        for key, label in (("prompt", "prompt"), ("trainable", "trainable")):
            bins = [(b["from"], b["to"] if b["to"] is not None else 2 * b["from"], b["count"])
                    for b in g["tokens"][key]["histogram"]]
            sec.histograms.append(Histogram(f"{name}: {label} tokens per sample (log bins)",
                                            "tokens", bins))
    sec.tables.append(Table("Per dataset", ["dataset", "samples", "trainable p50", "p90", "p99",
                                            "max", "cut", "loops", "duplicates",
                                            "dup. prompts", "empty", "reasoning", "tool calls",
                                            "scripts"], rows))
    loops = t["repetition"]["loops"][:10]
    if loops:
        sec.tables.append(Table("Repetition loops (first 10)", ["sample", "repeated tokens",
                                                               "block", "from token"],
                                [[lp["sample"], lp["tokens"], lp["period"], lp["start"]]
                                 for lp in loops]))
    sec.notes.append(f"`specgen stats {shown}` prints all of it (--json for scripts)")
    return sec
