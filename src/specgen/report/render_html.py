"""The report as one self-contained HTML file (inline CSS and SVG, no external assets)."""

from __future__ import annotations

from html import escape

from ..run_outcome import Banner
from . import svg
from .sections import Section

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f4f4f4}
caption{text-align:left;font-weight:600;padding:.3em 0}
.charts{display:flex;flex-wrap:wrap;gap:1em}.note{color:#666;font-size:12px}
nav a{margin-right:1em}
.alert{background:#fde8e8;border-left:4px solid #c62828;padding:.4em .8em;font-weight:600}
.banner{margin:.6em 0 1.2em;padding:.9em 1.2em;border-radius:6px;border-left:10px solid;
font-size:17px;line-height:1.45}
.banner .headline{display:block;font-size:26px;font-weight:700;margin-bottom:.2em}
.banner .label{font-weight:600}
.banner-done{background:#e3f4e6;border-color:#1e7e34;color:#0d3d19}
.banner-running{background:#e6effd;border-color:#1a56db;color:#0b2a6b}
.banner-stopped{background:#fff1d6;border-color:#c77700;color:#4d2e00}
.banner-unproductive,.banner-failed{background:#fde3e3;border-color:#c62828;color:#5c0b0b}
"""


def render_html(sections: list[Section], title: str, banner: Banner | None = None) -> str:
    out = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
           f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{escape(title)}</h1>"]
    if banner is not None:  # the outcome first, impossible to miss
        out.append(f'<div id="outcome" class="banner banner-{banner.kind}" role="status">'
                   f'<span class="headline">{escape(banner.headline)}</span>'
                   f'<span class="label">Why:</span> {escape(banner.cause)}'
                   + (f'<br><span class="label">What to do:</span> {escape(banner.todo)}'
                      if banner.todo else "") + "</div>")
    out.append("<nav>")
    out += [f'<a href="#{s.id}">{escape(s.title)}</a>' for s in sections]
    out.append("</nav>")
    for s in sections:
        out.append(f'<section id="{s.id}"><h2>{escape(s.title)}</h2>')
        for alert in s.alerts:
            out.append(f'<p class="alert">{escape(alert)}</p>')
        for note in s.notes:
            out.append(f'<p class="note">{escape(note)}</p>')
        charts = [c for c in s.charts if c] + [
            svg.histogram(h.bins, title=h.title, x_label=h.x_label) for h in s.histograms]
        if charts:
            out.append('<div class="charts">' + "".join(charts) + "</div>")
        for t in s.tables:
            out.append(f"<table><caption>{escape(t.title)}</caption>")
            if any(t.headers):
                out.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in t.headers) + "</tr>")
            if not t.rows:
                out.append(f'<tr><td colspan="{len(t.headers)}">none</td></tr>')
            for row in t.rows:
                out.append("<tr>" + "".join(_cell(v) for v in row) + "</tr>")
            out.append("</table>")
        out.append("</section>")
    out.append("</body></html>\n")
    return "".join(out)


def _cell(v) -> str:
    if isinstance(v, bool) or v is None:
        return f"<td>{escape(str(v if v is not None else '—'))}</td>"
    if isinstance(v, int | float):
        return f'<td class="n">{escape(svg.fmt_num(v) if isinstance(v, float) else f"{v:,}")}</td>'
    return f"<td>{escape(str(v))}</td>"
