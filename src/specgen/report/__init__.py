"""`specgen report`: one self-contained HTML page (or text) about a run.

Sections: summary, tokens and cost per dataset and provider, completion-length histograms,
finish reasons, error classes over time, latency percentiles, repairs and quarantines, budget
and stops. Everything is read with SQL from a consistent snapshot of the store.
"""

from __future__ import annotations

from pathlib import Path

from ..display import path as tidy
from ..export.snapshot import read_snapshot
from ..run_outcome import Banner, outcome_banner, session_state
from .batches import add_batch_timeline
from .data_quality import data_quality_section
from .render_html import render_html
from .render_text import render_text
from .sections import SECTION_IDS, Section, build_sections
from .stats import RunStats, collect

__all__ = ["SECTION_IDS", "RunStats", "Section", "build_report", "collect"]


def build_report(run_dir: str | Path, *, text: bool = False) -> str:
    """The report of a run as HTML (default) or plain text."""
    with read_snapshot(run_dir) as store:
        stats = collect(store)
        sections = build_sections(stats, tidy(run_dir))
        add_batch_timeline(sections, store, stats.config)
    sections.append(data_quality_section(run_dir, tidy(run_dir)))
    title = f"specgen run report: {Path(run_dir).resolve().name}"
    banner = run_banner(stats, tidy(run_dir))
    return render_text(sections, title, banner) if text else render_html(sections, title, banner)


def run_banner(stats: RunStats, run_dir: str) -> Banner:
    """The report's first line: the run's outcome (`specgen.run_outcome`), as `status` and the
    run summary tell it."""
    last = stats.sessions[-1] if stats.sessions else None
    state, reason = session_state(last, float(stats.meta.get("heartbeat_interval", "2.0")))
    j = stats.judgement
    return outcome_banner(state, reason, j.verdict if j is not None else None,
                          kept=j.kept if j is not None else 0,
                          answered=j.answered if j is not None else 0, run_dir=run_dir)
