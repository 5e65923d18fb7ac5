"""What a running engine shows: a live rich view on a terminal, plain lines elsewhere.

Both are built from `snapshot(engine)`, which combines the store's totals (loaded at start)
with this session's counters.
"""

from __future__ import annotations

import time
from typing import Any

from ..display import in_flight_text, printable_data
from .progress import fmt_duration
from .scheduler import Engine
from .status import quality_cell

_SHORT = {"exact": "exact", "repaired": "rep", "unverified": "unv", "mismatch": "MISMATCH",
          "true_ids": "ids"}


def _fmt_int(n: float) -> str:
    n = float(n)
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def eta_text(s: dict[str, Any]) -> str | None:
    """`ETA 3m05s` (`ETA ≥3m05s` when a dataset's size is a lower bound); None until the
    recent completion rate is meaningful."""
    if s["eta_s"] is None:
        return None
    return f"ETA {'≥' if s.get('eta_lower_bound') else ''}{fmt_duration(s['eta_s'])}"


def rows_text(d: dict[str, Any]) -> str:
    """Rows read of the source's rows: `1.2k/31.0k`, `120/≥120` while its size is unknown."""
    total = d.get("rows_total")
    if total is None:
        return f"{_fmt_int(d['rows_read'])}/≥{_fmt_int(d['rows_read'])}"
    return f"{_fmt_int(d['rows_read'])}/{_fmt_int(total)}"


def snapshot(engine: Engine) -> dict[str, Any]:
    """Figures for the live view and progress lines."""
    st = engine.stats
    rps, tps = st.rate.rates()
    b = engine.budget
    progress = engine.progress()
    datasets = []
    for ds in engine.datasets:
        spend = b.datasets[ds.name]
        t = ds.tasks
        done, failed, quar = t.get("done", 0), t.get("failed", 0), t.get("quarantined", 0)
        pending = t.get("pending", 0)
        pl = progress["plans"][ds.name]
        datasets.append({
            "name": ds.name, "state": ds.state, "done": done, "failed": failed,
            "quarantined": quar, "pending": pending, "total": done + failed + quar + pending,
            "in_flight": ds.in_flight, "rows_read": ds.rows_read,
            "rows_total": progress["rows_total"][ds.name],
            "completion_tokens": spend.completion_tokens, "prompt_tokens": spend.prompt_tokens,
            "cost_usd": spend.cost_usd, "fraction": pl.fraction, "basis": pl.basis,
            "planned": pl.requests, "planned_kind": pl.kind, "progress": pl.label(),
            "token_budget": spend.token_budget, "limit": ds.cfg.limit,
        })
    eta = None if engine.final_state else progress["eta_s"]  # nothing to wait for once ended
    return {
        "elapsed": time.monotonic() - st.started,
        "state": engine.final_state or (
            {"drain": "draining", "now": "stopping now"}.get(engine.stopping or "")
            or ("failing" if engine.fatal else "running")),
        "in_flight": len(engine.inflight), "limit": engine.concurrency()[0],
        "limit_reason": engine.concurrency()[1], "endpoint": engine.health.to_json(),
        "store_problem": engine.store_problem(),
        "max_concurrency": engine.limit.maximum, "backoffs": engine.limit.backoffs,
        "retrying": len(engine.retries), "rps": rps, "tps": tps,
        "cost_usd": b.cost_usd, "max_cost_usd": b.max_cost_usd,
        "prices": b.prices.source, "errors": dict(st.errors), "datasets": datasets,
        "providers": {k: v.to_json() for k, v in st.providers.items()}, "eta_s": eta,
        "eta_lower_bound": progress["eta_lower_bound"],
        "rejections": dict(st.rejections), "quarantines": dict(st.quarantines),
        "quality": engine.quality.policing.to_json(),
        "excluded": dict(engine.policy.excluded), "alarms": list(engine.alarms_fired),
    }


def progress_line(engine: Engine) -> str:
    """One plain log line with the run's figures."""
    s = snapshot(engine)
    cap = f"/${s['max_cost_usd']:g}" if s["max_cost_usd"] is not None else ""
    parts = [
        in_flight_text(s["in_flight"], s["limit"])
        + (f" ({s['limit_reason']})" if s["limit_reason"] else ""),
        f"{s['rps']:.1f} req/s", f"{_fmt_int(s['tps'])} tok/s",
        f"cost ${s['cost_usd']:.4f}{cap}" + (" (reported; no prices known)"
                                            if s["prices"] == "unknown" and cap else ""),
    ]
    for d in s["datasets"]:
        parts.append(f"{d['name']}: tasks {d['done']:,} done {d['failed']:,} failed "
                     f"{d['quarantined']:,} quarantined {d['pending']:,} pending, "
                     f"{d['progress']} [{d['state']}]")
    if s["errors"]:
        parts.append("errors " + " ".join(f"{k}={v}" for k, v in sorted(s["errors"].items())))
    if eta_text(s):
        parts.append(eta_text(s))
    if engine.batch is not None:
        parts.append(engine.batch.progress_text())
    if s["excluded"]:
        parts.append("excluded " + ",".join(name + _why(info)
                                            for name, info in s["excluded"].items()))
    if s["alarms"]:
        parts.append("ALARM " + ",".join(f"{a['alarm']}@{a['dataset']}" for a in s["alarms"]))
    if s["store_problem"]:
        sp = s["store_problem"]
        parts.append(f"STORE: {sp['message']}: {sp['held_answers']} answers held; free space "
                     "or press Ctrl-C")
    return " | ".join(parts)


def _why(info: dict[str, Any]) -> str:
    """` (alarm raw_markers)` when an alarm excluded the provider (quality.blame)."""
    metric = str((info.get("figures") or {}).get("metric") or "")
    return f" ({metric.replace(':', ' ', 1)})" if metric.startswith("alarm:") else ""


class LiveView:
    """The rich live panel (TTY only)."""

    def __init__(self, engine: Engine, console=None):
        from rich.console import Console
        from rich.live import Live

        self.engine = engine
        self.console = console or Console(stderr=True)
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self._last = 0.0

    def __enter__(self) -> LiveView:
        self.live.__enter__()
        self.update(force=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.update(force=True)
        self.live.__exit__(None, None, None)

    def update(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.5:
            return
        self._last = now
        self.live.update(self.render(), refresh=True)

    def render(self):
        from rich.console import Group
        from rich.text import Text

        s = printable_data(snapshot(self.engine))  # names and ids from the API
        width = self.console.width
        cap = f" / ${s['max_cost_usd']:g}" if s["max_cost_usd"] is not None else ""
        price_note = " (cost as reported: no prices known)" if s["prices"] == "unknown" else ""
        head = flow([
            Text.assemble(("specgen run ", "bold"), (f"[{s['state']}]", "cyan")),
            f"elapsed {fmt_duration(s['elapsed'])}",
            in_flight_text(s["in_flight"], s["limit"], s["max_concurrency"])
            + (f" ({s['backoffs']:,} backoffs)" if s["backoffs"] else ""),
            f"retrying {s['retrying']:,}",
            f"{s['rps']:.1f} req/s", f"{_fmt_int(s['tps'])} tok/s",
            Text.assemble((f"${s['cost_usd']:.4f}{cap}", "green"), price_note),
            *([eta_text(s)] if eta_text(s) else []),
        ], width)
        rows = []
        for d in s["datasets"]:
            budget = f"/{_fmt_int(d['token_budget'])}" if d["token_budget"] else ""
            rows.append([d["name"], d["state"], f"{d['done']:,}", f"{d['failed']:,}",
                         f"{d['quarantined']:,}", f"{d['pending']:,}", f"{d['in_flight']:,}",
                         rows_text(d), _fmt_int(d["prompt_tokens"]),
                         _fmt_int(d["completion_tokens"]) + budget, f"{d['cost_usd']:.4f}",
                         d["progress"]])
        dt = fit_table(width, DATASET_COLUMNS, rows)
        parts: list[Any] = [head]
        if s["limit_reason"]:
            parts.append(Text(f"limit {s['limit']} of {s['max_concurrency']}: "
                              f"{s['limit_reason']}", style="yellow"))
        if s["store_problem"]:
            sp = s["store_problem"]
            parts.append(Text(f"{sp['message']}: {sp['held_answers']} answers held in memory; "
                              "free space or press Ctrl-C", style="bold red"))
        for name, info in s["excluded"].items():
            parts.append(Text(f"excluded provider {name} ({info.get('by')}): "
                              f"{info.get('reason')}", style="yellow"))
        if self.engine.batch is not None:
            parts.append(Text(self.engine.batch.progress_text(), style="cyan"))
        for a in s["alarms"]:
            parts.append(Text(f"ALARM {a['alarm']} on {a['dataset']}: "
                              f"{100 * a['share']:.0f}% of {a['samples']} ({a['action']})",
                              style="bold red"))
        parts.append(dt)
        if s["providers"]:
            witness = self.engine.witness
            rows = []
            for name, p in sorted(s["providers"].items(), key=lambda kv: -kv[1]["requests"]):
                lat = p["latency_s"]
                errs = " ".join(f"{k}={v}" for k, v in sorted(p["errors"].items())) or "-"
                checks = " ".join(f"{_SHORT.get(k, k)} {v}"
                                  for k, v in sorted(p["count_checks"].items())) or "-"
                if witness.unusable(name):
                    checks += " (counts unusable)"
                elif split := witness.split_forms(name):
                    checks += f" (counts split: {', '.join(split)} unverified)"
                rows.append([name, f"{p['requests']:,}", f"{p['ok']:,}", f"{p['rejected']:,}",
                             f"{p['quarantined']:,}", errs, checks,
                             quality_cell(s["quality"].get(name),
                                          self.engine.policy.is_excluded(name)),
                             _fmt_int(p["completion_tokens"]), f"{p['cost_usd']:.4f}",
                             f"{lat['p50']:.2f}s" if lat["p50"] is not None else "-",
                             f"{lat['p90']:.2f}s" if lat["p90"] is not None else "-"])
            parts.append(fit_table(width, PROVIDER_COLUMNS, rows))
        if s["errors"]:
            parts.append(Text("errors this session: " + "  ".join(
                f"{k}={v}" for k, v in sorted(s["errors"].items())), style="yellow"))
        return Group(*parts)


# (header, justify, priority, widest): columns are dropped from the highest priority number
# down until a table fits the terminal; 0 is never dropped; `widest` caps what a wrapping
# column is measured at.
Column = tuple[str, str, int, int | None]
DATASET_COLUMNS: list[Column] = [
    ("dataset", "left", 0, None), ("state", "left", 1, None), ("tasks done", "right", 3, None),
    ("failed", "right", 4, None), ("quar.", "right", 9, None), ("pending", "right", 5, None),
    ("in flight", "right", 10, None), ("rows", "right", 8, None),
    ("prompt tok", "right", 11, None), ("compl. tok", "right", 7, None),
    ("cost $", "right", 6, None), ("progress", "right", 2, None)]
PROVIDER_COLUMNS: list[Column] = [
    ("provider", "left", 0, None), ("attempts", "right", 1, None), ("ok", "right", 2, None),
    ("rejected", "right", 6, None), ("quar.", "right", 7, None), ("errors", "left", 3, 24),
    ("witness", "left", 8, 16), ("quality", "left", 8, 40), ("compl. tok", "right", 9, None), ("cost $", "right", 5, None),
    ("total p50", "right", 4, None), ("p90", "right", 10, None)]


def fit_table(width: int, columns: list[Column], rows: list[list[str]]):
    """A rich table of `rows` keeping the columns that fit in `width` (by priority): a
    terminal of 80-100 columns shows fewer columns, never names cut short."""
    from rich.table import Table

    natural = []
    for i, (header, _j, _p, widest) in enumerate(columns):
        w = max([len(header), *(len(r[i]) for r in rows)])
        natural.append(min(w, widest) if widest else w)
    keep = list(range(len(columns)))

    def need() -> int:
        return sum(natural[i] for i in keep) + 2 * (len(keep) - 1)

    for i in sorted(keep, key=lambda i: -columns[i][2]):
        if need() <= width:
            break
        if columns[i][2] > 0:
            keep.remove(i)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for i in keep:
        header, justify, priority, widest = columns[i]
        table.add_column(header, justify=justify, no_wrap=priority == 0 or widest is None,
                         overflow="fold")
    for r in rows:
        table.add_row(*(r[i] for i in keep))
    return table


def flow(segments: list, width: int):
    """Segments (str or rich Text) on as few lines as fit `width`, two spaces apart, never
    splitting one."""
    from rich.text import Text

    out = Text()
    line = 0
    for seg in segments:
        seg = seg if isinstance(seg, Text) else Text(seg)
        if line and line + 2 + len(seg) > width:
            out.append("\n")
            line = 0
        elif line:
            out.append("  ")
            line += 2
        out.append_text(seg)
        line += len(seg)
    return out
