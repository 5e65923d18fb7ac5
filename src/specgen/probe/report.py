"""A probe's verdict: the ranked providers (`ranked`), `probe.json`, the table, and the
`[endpoint.provider]` block that keeps the providers meeting the thresholds."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from .measure import Thresholds, summarize, verdict
from .send import ProbeResult, Target

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def ranked(result: ProbeResult, th: Thresholds, *, require_witness: bool = False
           ) -> list[dict[str, Any]]:
    """One entry per probed endpoint, kept ones first, then by quality, then by cost."""
    plan = result.plan
    ref = plan.reference
    ref_obs = {o.canary: o for o in result.observations[ref.tag]} if ref else None
    rows = []
    for t in plan.targets:
        figures = summarize(result.observations[t.tag], None if t.reference else ref_obs)
        if t.reference:
            figures.update(trigger_f1=None, trigger_agreement=None)  # the truth itself
        why, thin = verdict(figures, th, require_witness=require_witness)
        if not t.in_policy:
            why.append("outside the config's provider policy (probed as the reference)")
        if result.stopped and figures["answered"] < figures["requests"]:
            why.append("probe stopped early: " + result.stopped)
        rows.append({**_endpoint(t), **figures, "kept": not why, "failures": why,
                     "too_few": thin, "quality": _quality(figures)})
    rows.sort(key=lambda r: (not r["kept"], -r["quality"],
                             r["cost_per_1k_completion_usd"] or float("inf")))
    return rows


def _endpoint(t: Target) -> dict[str, Any]:
    ep = t.endpoint
    return {"tag": ep.tag, "name": ep.provider_name, "quantization": ep.quantization,
            "in_policy": t.in_policy, "reference": t.reference,
            "listed_price_per_m": {
                "prompt": None if ep.prompt_price is None else round(ep.prompt_price * 1e6, 6),
                "completion": (None if ep.completion_price is None
                               else round(ep.completion_price * 1e6, 6))}}


def _quality(f: dict[str, Any]) -> float:
    """The mean of the measured quality figures (for ranking only)."""
    values = [f[k] for k in ("success_rate", "schema_accuracy", "trigger_f1",
                             "witness_agreement", "reasoning_present") if f.get(k) is not None]
    return round(sum(values) / len(values), 4) if values else 0.0


# -- the suggested [endpoint.provider] block -----------------------------------------------------
def suggested_provider(current: dict[str, Any], kept: list[str]) -> dict[str, Any] | None:
    """The config's provider object with `only` = the kept endpoints (best first); `ignore`
    is dropped (`only` says it all), `order` keeps its kept entries. None: nothing kept."""
    if not kept:
        return None
    out = {k: v for k, v in current.items() if k not in ("only", "ignore", "order")}
    order = [x for x in current.get("order") or [] if any(
        x.lower() in (k.lower(), k.split("/", 1)[0].lower()) for k in kept)]
    if order:
        out["order"] = order
    out["only"] = list(kept)
    return out


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{k if _BARE_KEY.match(k) else json.dumps(k)} = {toml_value(v)}"
                          for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def toml_block(provider: dict[str, Any] | None) -> str | None:
    if provider is None:
        return None
    lines = ["[endpoint.provider]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in provider.items()]
    return "\n".join(lines) + "\n"


# -- probe.json ----------------------------------------------------------------------------------
def probe_json(cfg, result: ProbeResult, rows: list[dict[str, Any]], th: Thresholds,
               opts) -> dict[str, Any]:
    kept = [r["tag"] for r in rows if r["kept"]]
    provider = suggested_provider(cfg.endpoint.provider, kept)
    plan = result.plan
    return {
        "model": cfg.target.model, "config": str(cfg.source), "created_at": time.time(),
        "canaries": {"source": plan.canary_source, "per_provider": len(plan.canaries),
                     "ids": [c.id for c in plan.canaries]},
        "reference": plan.reference.tag if plan.reference else None,
        "max_cost_usd": opts.max_cost_usd, "estimate_usd": round(plan.estimate_usd, 6),
        "spent_usd": round(result.spent_usd, 6), "stopped": result.stopped,
        "capped": result.capped, "billed_over_listed": result.billed_rates,
        "thresholds": th.to_json(),
        "providers": rows, "kept": kept,
        "suggested_provider": provider, "suggested_toml": toml_block(provider),
        "observations": [o.to_json() for items in result.observations.values()
                         for o in items],
    }


def out_problem(path: Path) -> str | None:
    """Why `path` cannot take probe.json (None: it can), checked before anything is paid
    for: not a directory nor another non-file, under a directory that exists (or can be
    made) and takes a new file — tried for real, the directories made for the try removed."""
    try:
        return _out_problem(path)
    except OSError as exc:  # a name too long, a loop of links, ...
        return exc.strerror or str(exc)


def _out_problem(path: Path) -> str | None:
    if path.is_dir():
        return "it is a directory (give a file name, e.g. DIR/probe.json)"
    if path.exists() and not path.is_file():
        return "it exists and is not a regular file"
    parent = path.parent
    existing = parent
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    made: list[Path] = []  # the directories write_json would make, made for the check
    try:
        for d in reversed([parent, *parent.parents][:len(parent.parts) - len(existing.parts)]):
            try:
                d.mkdir()
            except OSError as exc:
                return f"cannot create {d}: {exc.strerror or exc}"
            made.append(d)
        # a real write of write_json's own temp name: permissions (root's too), a read-only
        # mount, quotas, a name too long
        tmp = parent / f".{path.name}.tmp-{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            return f"cannot write in {parent}: {exc.strerror or exc}"
        os.close(fd)
        os.unlink(tmp)
        return None
    finally:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `path` whole or not at all (a temp name, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# -- the table -------------------------------------------------------------------------------
def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(rows: list[dict[str, Any]], *, title: str):
    """A rich Table of the ranked providers."""
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_lines=False)
    for name, justify in (("provider", "left"), ("quant", "left"), ("answered", "right"),
                          ("schema", "right"), ("trigger F1", "right"),
                          ("witness", "right"), ("reasoning", "right"),
                          ("finish", "left"), ("trunc", "right"), ("TTFT s", "right"),
                          ("tok/s", "right"), ("$/1k out", "right"), ("verdict", "left")):
        t.add_column(name, justify=justify, overflow="fold")
    for r in rows:
        finish = ", ".join(f"{k} {v}" for k, v in sorted(r["finish_reasons"].items(),
                                                        key=lambda kv: -kv[1]))
        who = r["tag"] + (" (reference)" if r["reference"] else "")
        verdict = "keep" if r["kept"] else "drop"

        def fig(key: str, r=r) -> str:  # `*`: under its floor on too few answers
            return _pct(r[key]) + ("*" if key in r["too_few"] else "")

        trig = "ref" if r["reference"] else fig("trigger_f1")
        answered = f"{r['answered']}/{r['requests']}" + ("*" if "success_rate" in r["too_few"]
                                                         else "")
        t.add_row(who, r["quantization"], answered,
                  fig("schema_accuracy"), trig, fig("witness_agreement"),
                  fig("reasoning_present"), finish or "-", _pct(r["truncated"]),
                  _num(r["ttft_p50_s"], ".2f"), _num(r["tokens_per_s"], ".0f"),
                  _num(r["cost_per_1k_completion_usd"], ".4f"), verdict)
    return t


def verdict_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Why each dropped endpoint was dropped, and (`*` in the table) which figures rest on
    too few answers to count, one line each."""
    out = [f"  drop {r['tag']}: {'; '.join(r['failures'])}" for r in rows if not r["kept"]]
    out += [f"  * {r['tag']}: {'; '.join(r['too_few'].values())}" for r in rows
            if r["too_few"]]
    return out
