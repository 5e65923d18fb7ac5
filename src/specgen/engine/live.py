"""What a running engine shows: a live rich view on a terminal, plain lines elsewhere.

Both are built from `snapshot(engine)`, which combines the store's totals (loaded at start)
with this session's counters.
"""

from __future__ import annotations

import time
from typing import Any

from .scheduler import Engine

_SHORT = {"exact": "exact", "repaired": "rep", "unverified": "unv", "mismatch": "MISMATCH",
          "true_ids": "ids"}


def _fmt_int(n: float) -> str:
    n = float(n)
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0 or seconds > 86400 * 365:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def snapshot(engine: Engine) -> dict[str, Any]:
    """Figures for the live view and progress lines."""
    st = engine.stats
    rps, tps = st.rate.rates()
    b = engine.budget
    datasets = []
    for ds in engine.datasets:
        spend = b.datasets[ds.name]
        t = ds.tasks
        done, failed, quar = t.get("done", 0), t.get("failed", 0), t.get("quarantined", 0)
        pending = t.get("pending", 0)
        total = done + failed + quar + pending
        # Progress: against the budget, the limit, or (once the source is read) the tasks.
        frac = None
        if spend.token_budget:
            frac = spend.completion_tokens / spend.token_budget
        if ds.cfg.limit:
            # the limit counts source rows; each gives n conversations
            convs_done = (ds.conversations - ds.open) / max(1, ds.cfg.n)
            f2 = (convs_done + ds.rows_other_shard) / ds.cfg.limit
            frac = f2 if frac is None else max(frac, f2)
        if ds.exhausted and total:
            f3 = (total - pending) / total
            frac = f3 if frac is None else max(frac, f3)
        datasets.append({
            "name": ds.name, "state": ds.state, "done": done, "failed": failed,
            "quarantined": quar, "pending": pending, "total": total,
            "in_flight": ds.in_flight, "rows_read": ds.rows_read,
            "completion_tokens": spend.completion_tokens, "prompt_tokens": spend.prompt_tokens,
            "cost_usd": spend.cost_usd, "fraction": min(frac, 1.0) if frac is not None else None,
            "token_budget": spend.token_budget, "limit": ds.cfg.limit,
        })
    # ETA of the dataset being worked on: remaining fraction at the current request rate.
    eta = None
    active = [d for d in datasets if d["state"] == "active" and d["fraction"] is not None]
    if active and rps > 0 and st.answers:
        d = active[0]
        done_now = max(d["done"], 1)
        if d["fraction"] and d["fraction"] > 0:
            remaining = done_now / d["fraction"] - done_now
            eta = remaining / rps
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
        "rejections": dict(st.rejections), "quarantines": dict(st.quarantines),
    }


def progress_line(engine: Engine) -> str:
    """One plain log line with the run's figures."""
    s = snapshot(engine)
    cap = f"/${s['max_cost_usd']:g}" if s["max_cost_usd"] is not None else ""
    parts = [
        f"in flight {s['in_flight']}/{s['limit']}"
        + (f" ({s['limit_reason']})" if s["limit_reason"] else ""),
        f"{s['rps']:.1f} req/s", f"{_fmt_int(s['tps'])} tok/s",
        f"cost ${s['cost_usd']:.4f}{cap}" + (" (reported; no prices known)"
                                            if s["prices"] == "unknown" and cap else ""),
    ]
    for d in s["datasets"]:
        parts.append(f"{d['name']}: {d['done']} done {d['failed']} failed "
                     f"{d['pending']} pending [{d['state']}]")
    if s["errors"]:
        parts.append("errors " + " ".join(f"{k}={v}" for k, v in sorted(s["errors"].items())))
    if s["eta_s"] is not None:
        parts.append(f"ETA {_fmt_eta(s['eta_s'])}")
    if s["store_problem"]:
        sp = s["store_problem"]
        parts.append(f"STORE: {sp['message']}: {sp['held_answers']} answers held; free space "
                     "or press Ctrl-C")
    return " | ".join(parts)


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
        from rich.table import Table
        from rich.text import Text

        s = snapshot(self.engine)
        cap = f" / ${s['max_cost_usd']:g}" if s["max_cost_usd"] is not None else ""
        price_note = "  (cost as reported: no prices known)" if s["prices"] == "unknown" else ""
        head = Text.assemble(
            ("specgen run ", "bold"), (f"[{s['state']}]  ", "cyan"),
            f"elapsed {_fmt_eta(s['elapsed'])}  ",
            f"in flight {s['in_flight']} (limit {s['limit']}/{s['max_concurrency']}"
            + (f", {s['backoffs']} backoffs" if s["backoffs"] else "") + ")  ",
            f"retrying {s['retrying']}  ",
            f"{s['rps']:.1f} req/s  {_fmt_int(s['tps'])} tok/s  ",
            (f"${s['cost_usd']:.4f}{cap}", "green"), price_note,
            f"  ETA {_fmt_eta(s['eta_s'])}",
        )
        dt = Table(box=None, pad_edge=False, header_style="bold")
        for col in ("dataset", "state", "done", "total", "failed", "quar.", "pending",
                    "in flight", "rows", "prompt tok", "compl. tok", "cost $", "progress"):
            dt.add_column(col, justify="left" if col in ("dataset", "state") else "right")
        for d in s["datasets"]:
            budget = f"/{_fmt_int(d['token_budget'])}" if d["token_budget"] else ""
            frac = f"{100 * d['fraction']:.0f}%" if d["fraction"] is not None else "-"
            dt.add_row(d["name"], d["state"], str(d["done"]), str(d["total"]), str(d["failed"]),
                       str(d["quarantined"]), str(d["pending"]), str(d["in_flight"]),
                       _fmt_int(d["rows_read"]), _fmt_int(d["prompt_tokens"]),
                       _fmt_int(d["completion_tokens"]) + budget, f"{d['cost_usd']:.4f}", frac)
        parts: list[Any] = [head]
        if s["limit_reason"]:
            parts.append(Text(f"limit {s['limit']} of {s['max_concurrency']}: "
                              f"{s['limit_reason']}", style="yellow"))
        if s["store_problem"]:
            sp = s["store_problem"]
            parts.append(Text(f"{sp['message']}: {sp['held_answers']} answers held in memory; "
                              "free space or press Ctrl-C", style="bold red"))
        parts.append(dt)
        if s["providers"]:
            pt = Table(box=None, pad_edge=False, header_style="bold")
            witness = self.engine.witness
            for col in ("provider", "requests", "ok", "rejected", "quar.", "errors", "witness",
                        "compl. tok", "cost $", "p50 s", "p90 s"):
                pt.add_column(col, justify="left" if col in ("provider", "errors", "witness")
                              else "right")
            for name, p in sorted(s["providers"].items(), key=lambda kv: -kv[1]["requests"]):
                lat = p["latency_s"]
                errs = " ".join(f"{k}={v}" for k, v in sorted(p["errors"].items())) or "-"
                checks = " ".join(f"{_SHORT.get(k, k)} {v}"
                                  for k, v in sorted(p["count_checks"].items())) or "-"
                if witness.unusable(name):
                    checks += " (counts unusable)"
                pt.add_row(name, str(p["requests"]), str(p["ok"]), str(p["rejected"]),
                           str(p["quarantined"]), errs, checks, _fmt_int(p["completion_tokens"]),
                           f"{p['cost_usd']:.4f}",
                           f"{lat['p50']:.2f}" if lat["p50"] is not None else "-",
                           f"{lat['p90']:.2f}" if lat["p90"] is not None else "-")
            parts.append(pt)
        if s["errors"]:
            parts.append(Text("errors this session: " + "  ".join(
                f"{k}={v}" for k, v in sorted(s["errors"].items())), style="yellow"))
        return Group(*parts)
