"""Inline SVG charts (no plotting library): horizontal bars, histograms, stacked time bars."""

from __future__ import annotations

from html import escape

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
FONT = 'font-family="system-ui, sans-serif" font-size="11"'


def fmt_num(v: float) -> str:
    if isinstance(v, int) or float(v).is_integer():
        v = int(v)
        for unit, div in (("M", 1_000_000), ("k", 1_000)):
            if abs(v) >= div * 10:
                return f"{v / div:.1f}{unit}"
        return str(v)
    return f"{v:.4g}"


def bar_chart(items: list[tuple[str, float]], *, title: str, value_fmt=fmt_num,
              width: int = 560) -> str:
    """Horizontal bars, one per (label, value)."""
    if not items:
        return ""
    bar_h, gap, label_w = 16, 6, 170
    top = 22
    height = top + len(items) * (bar_h + gap) + 4
    vmax = max(v for _, v in items) or 1
    plot_w = width - label_w - 70
    out = [_open(width, height, title),
           f'<text x="0" y="14" {FONT} font-weight="bold">{escape(title)}</text>']
    for i, (label, v) in enumerate(items):
        y = top + i * (bar_h + gap)
        w = max(0.0, v / vmax * plot_w)
        color = PALETTE[i % len(PALETTE)]
        out.append(f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end" {FONT}>'
                   f'{escape(_clip(label, 28))}</text>')
        out.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" '
                   f'fill="{color}"><title>{escape(label)}: {escape(value_fmt(v))}</title></rect>')
        out.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 12}" {FONT}>{escape(value_fmt(v))}</text>')
    out.append("</svg>")
    return "".join(out)


def histogram(bins: list[tuple[float, float, int]], *, title: str, x_label: str,
              width: int = 560, height: int = 200) -> str:
    """Vertical bars for (lo, hi, count) bins."""
    if not bins:
        return ""
    left, bottom, top = 44, 34, 22
    plot_w, plot_h = width - left - 10, height - top - bottom
    cmax = max(c for _, _, c in bins) or 1
    bw = plot_w / len(bins)
    out = [_open(width, height, title),
           f'<text x="0" y="14" {FONT} font-weight="bold">{escape(title)}</text>',
           f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
           'stroke="#888"/>',
           f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" {FONT}>{fmt_num(cmax)}</text>',
           f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" {FONT}>0</text>']
    for i, (lo, hi, c) in enumerate(bins):
        h = c / cmax * plot_h
        x = left + i * bw
        out.append(f'<rect x="{x + 0.5:.1f}" y="{top + plot_h - h:.1f}" width="{max(bw - 1, 0.5):.1f}" '
                   f'height="{h:.1f}" fill="{PALETTE[0]}"><title>{fmt_num(lo)}–{fmt_num(hi)}: '
                   f'{c}</title></rect>')
    step = max(1, len(bins) // 6)
    for i in range(0, len(bins) + 1, step):
        x = left + i * bw
        lo = bins[i][0] if i < len(bins) else bins[-1][1]
        anchor = "end" if i == len(bins) else "middle"
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 14}" text-anchor="{anchor}" {FONT}>'
                   f'{fmt_num(lo)}</text>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 4}" text-anchor="middle" {FONT}>'
               f'{escape(x_label)}</text></svg>')
    return "".join(out)


def stacked_time_bars(series: dict[str, list[int]], *, title: str, t_labels: list[str],
                      width: int = 560, height: int = 220) -> str:
    """Bars over time buckets, one colour per series (stacked), with a legend."""
    if not series:
        return ""
    n = len(next(iter(series.values())))
    left, bottom, top = 44, 30, 22
    legend_h = 16 * ((len(series) + 2) // 3)
    plot_w, plot_h = width - left - 10, height - top - bottom
    totals = [sum(s[i] for s in series.values()) for i in range(n)]
    cmax = max(totals) or 1
    bw = plot_w / n
    out = [_open(width, height + legend_h, title),
           f'<text x="0" y="14" {FONT} font-weight="bold">{escape(title)}</text>',
           f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
           'stroke="#888"/>',
           f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" {FONT}>{fmt_num(cmax)}</text>']
    for i in range(n):
        y = top + plot_h
        for k, (name, counts) in enumerate(series.items()):
            if not counts[i]:
                continue
            h = counts[i] / cmax * plot_h
            y -= h
            out.append(f'<rect x="{left + i * bw + 0.5:.1f}" y="{y:.1f}" '
                       f'width="{max(bw - 1, 0.5):.1f}" height="{h:.1f}" '
                       f'fill="{PALETTE[k % len(PALETTE)]}"><title>{escape(t_labels[i])} '
                       f'{escape(name)}: {counts[i]}</title></rect>')
    for i in sorted({0, n // 2, n - 1}):
        # the outer labels align to the plot's edges so they are never clipped
        x, anchor = ((left, "start") if i == 0 and n > 1 else
                     (left + plot_w, "end") if i == n - 1 and n > 1 else
                     (left + (i + 0.5) * bw, "middle"))
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 14}" text-anchor="{anchor}" {FONT}>'
                   f'{escape(t_labels[i])}</text>')
    for k, name in enumerate(series):
        x = (k % 3) * (width // 3)
        y = height + 16 * (k // 3)
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" '
                   f'fill="{PALETTE[k % len(PALETTE)]}"/>'
                   f'<text x="{x + 14}" y="{y}" {FONT}>{escape(_clip(name, 30))}</text>')
    out.append("</svg>")
    return "".join(out)


def _open(width: int, height: int, title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">')


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"
