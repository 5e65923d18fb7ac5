"""The report's numbers as plain text for the terminal (`specgen report --text`)."""

from __future__ import annotations

from ..run_outcome import Banner
from .sections import Section

BAR = 40
CELL = 110  # longest cell shown in the terminal (long error messages are clipped)


def render_text(sections: list[Section], title: str, banner: Banner | None = None) -> str:
    out = [title, "=" * len(title)]
    if banner is not None:  # the outcome first
        out += ["", f">> {banner.headline.upper()}", f"   why: {banner.cause}"]
        if banner.todo:
            out.append(f"   what to do: {banner.todo}")
    for s in sections:
        out += ["", s.title, "-" * len(s.title)]
        out += [f"  !! {a}" for a in s.alerts]
        out += [f"  ({n})" for n in s.notes]
        for t in s.tables:
            out.append(f"{t.title}:")
            if not t.rows:
                out.append("  none")
                continue
            rows = [[_s(v) for v in r] for r in t.rows]
            headers = [_s(h) for h in t.headers]
            widths = [max(len(x) for x in col) for col in zip(headers, *rows, strict=False)]
            keyed = not any(headers)  # a key/value table: everything left-aligned
            if not keyed:
                out.append("  " + "  ".join(
                    h.ljust(w) for h, w in zip(headers, widths, strict=False)).rstrip())
            for r in rows:
                out.append("  " + "  ".join(
                    c.rjust(w) if _numeric(c) and not keyed else c.ljust(w)
                    for c, w in zip(r, widths, strict=False)).rstrip())
        for h in s.histograms:
            out.append(f"{h.title}:")
            cmax = max((c for _, _, c in h.bins), default=0) or 1
            for lo, hi, c in h.bins:
                out.append(f"  {_s(lo):>8}–{_s(hi):<8} {'#' * round(c / cmax * BAR):<{BAR}} {c}")
    return "\n".join(out) + "\n"


def _s(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"  # ids and pids are given as strings
    s = str(v)
    return s if len(s) <= CELL else s[: CELL - 1] + "…"


def _numeric(c: str) -> bool:
    return c.replace(",", "").replace(".", "", 1).replace("-", "", 1).isdigit()
