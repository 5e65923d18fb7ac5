"""`specgen report`: one self-contained HTML page (or text) about a run.

Sections: summary, tokens and cost per dataset and provider, completion-length histograms,
finish reasons, error classes over time, latency percentiles, repairs and quarantines, budget
and stops. Everything is read with SQL from a consistent snapshot of the store.
"""

from __future__ import annotations

from pathlib import Path

from ..display import path as tidy
from ..export.snapshot import read_snapshot
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
    return render_text(sections, title) if text else render_html(sections, title)
