"""Alarms that remember (issue 24): the alarm windows and the fired alarms kept in the store's
meta, so the figures run over the whole run — a rolling window across sessions, which no
number of short sessions hides — and a fired alarm stands until its cause changes (a config
change, `specgen provider --allow`/`--exclude`) or it is acknowledged (`specgen run
--ack-alarm NAME`). docs/quality.md, "Alarms over the run".

Meta keys: `alarm_windows` {dataset: {alarm: [[hit, task, provider, label], ...]}} (the last
`window` relevant answers, written at each session's end and when an alarm fires) and
`alarms_fired` {dataset: {alarm: {message, fix, action, at, session, cause, acked?}}}.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .alarms import DatasetAlarms
from .observe import Rolling

META_WINDOWS = "alarm_windows"
META_FIRED = "alarms_fired"


def cause_of(config_json: dict[str, Any], excluded: list[str] | tuple[str, ...]) -> str:
    """What an alarm's cause depends on: the datasets, the sampling, the target, the
    `[quality]` and `[endpoint.provider]` settings and the excluded providers. Any change
    to them clears a standing alarm."""
    data = json.loads(json.dumps({k: config_json.get(k) for k in (
        "target", "sampling", "datasets", "quality")}, default=str))  # a copy: popped below
    data["provider"] = (config_json.get("endpoint") or {}).get("provider")
    data["excluded"] = sorted(excluded)
    for ds in data.get("datasets") or []:
        if isinstance(ds, dict):  # budgets and limits do not change what answers look like
            for key in ("token_budget", "limit", "weight"):
                ds.pop(key, None)
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def dump_windows(alarms: DatasetAlarms, cause: str) -> str:
    return json.dumps({"cause": cause, "windows": {
        ds: {name: [list(e) for e in r.recent] for name, r in shares.items() if r.recent}
        for ds, shares in alarms.shares.items()}})


def load_windows(alarms: DatasetAlarms, text: str | None, datasets: set[str],
                 cause: str) -> int:
    """Refill the rolling windows from the store when they were measured under the same
    cause (else they start afresh); the answers restored."""
    try:
        stored = json.loads(text) if text else {}
    except ValueError:
        return 0
    if not isinstance(stored, dict) or stored.get("cause") != cause:
        return 0
    data = stored.get("windows")
    n = 0
    for ds, shares in (data if isinstance(data, dict) else {}).items():
        if ds not in datasets or not isinstance(shares, dict):
            continue
        mine = alarms.shares.setdefault(ds, {k: Rolling(alarms.window) for k in alarms.rules})
        for name, entries in shares.items():
            if name not in mine or not isinstance(entries, list):
                continue
            for e in entries[-alarms.window:]:
                if isinstance(e, list) and len(e) == 4:
                    mine[name].add(bool(e[0]), int(e[1]), str(e[2]), e[3])
                    n += 1
    return n


def read_fired(text: str | None) -> dict[str, dict[str, dict[str, Any]]]:
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def standing(fired: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The fired alarms not acknowledged: [{dataset, alarm, message, ...}]."""
    return [{"dataset": ds, "alarm": name, **rec} for ds, recs in sorted(fired.items())
            for name, rec in sorted(recs.items()) if not rec.get("acked")]
