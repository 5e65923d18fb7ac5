"""Is an existing run dir compatible with this config? And starting afresh without deleting.

A run continues only when nothing that changes results differs: the global result settings
(`RunConfig.global_result_hash`: model, renderer, sampling), the tokenizer (by fingerprint),
each dataset's result settings (`RunConfig.dataset_result_hash`) for datasets already in the
store, and the shard. Budgets, limits, concurrency, timeouts and provider policy may change.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson

from ..config import RESULT_DATASET_KEYS, RunConfig
from ..sampling import defaults_on
from ..store import STORE_FILE, Store, StoreError


class IncompatibleRunError(RuntimeError):
    """The run dir holds results made with settings that this config changes."""


def meta_for(cfg: RunConfig, *, tokenizer_fingerprint: str, shard: str) -> dict[str, str]:
    """The meta rows describing what this config produces (written at every start)."""
    return {
        "config_hash": cfg.result_hash(),
        "result_hash_global": cfg.global_result_hash(),
        "config_json": orjson.dumps(cfg.to_json()).decode(),
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "renderer": cfg.target.renderer,
        "model": cfg.target.model,
        "thinking": "1" if cfg.sampling.thinking else "0",
        "shard": shard,
        "heartbeat_interval": repr(cfg.engine.heartbeat_interval),
        # model-card sampling defaults on ("model") or off ("off"; stores made before them)
        "sampling_defaults": "model" if defaults_on(cfg) else "off",
    }


def pin_sampling_defaults(store: Store, cfg: RunConfig) -> bool:
    """A store whose work was made without the model-card sampling defaults (before they
    existed, or with them off) keeps them off when the config does not say: its silent
    temperature stays 1.0 and no top_p is added, so the run resumes as it was made. True
    when it pinned them."""
    if cfg.sampling.model_defaults is not None:
        return False
    if store.conn.execute("SELECT 1 FROM conversations LIMIT 1").fetchone() is None:
        return False
    if store.get_meta("sampling_defaults") not in (None, "off"):
        return False
    cfg.sampling.model_defaults = False
    return True


def pin_for_run_dir(cfg: RunConfig) -> bool:
    """`pin_sampling_defaults` for the store of the config's run dir, if it has one (read
    only; for preview and probe, which show what a resumed run would send)."""
    if not (Path(cfg.run_dir) / STORE_FILE).exists():
        return False
    try:
        with Store.open(cfg.run_dir) as store:
            return pin_sampling_defaults(store, cfg)
    except (sqlite3.Error, OSError, StoreError):
        return False


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): obj}


def _diff(old: dict[str, Any], new: dict[str, Any], label: str) -> list[str]:
    a, b = _flat(old), _flat(new)
    return [f"{label}{k}: {_shown(a.get(k))} -> {_shown(b.get(k))}"
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _shown(value: Any) -> str:
    return "unset" if value is None else repr(value)


def problems(store: Store, cfg: RunConfig, *, tokenizer_fingerprint: str,
             shard: str) -> list[str]:
    """What in this config conflicts with the results already in `store` (empty = resume)."""
    meta = store.meta()
    has_work = store.conn.execute("SELECT 1 FROM conversations LIMIT 1").fetchone() is not None
    if not has_work or "result_hash_global" not in meta:
        return []
    out: list[str] = []
    if meta.get("shard", "") != shard:
        out.append(f"shard: {meta.get('shard') or 'none'!r} -> {shard or 'none'!r} "
                   "(a run dir belongs to one shard)")
    if meta.get("tokenizer_fingerprint") != tokenizer_fingerprint:
        out.append("tokenizer: the tokenizer files differ from the ones this run started with")
    old_cfg = orjson.loads(meta.get("config_json", "{}"))
    if meta["result_hash_global"] != cfg.global_result_hash():
        new_cfg = cfg.to_json()
        details = []
        for section, skip in (("target", "tokenizer"), ("sampling", "max_tokens")):
            old = {k: v for k, v in (old_cfg.get(section) or {}).items() if k != skip}
            new = {k: v for k, v in new_cfg[section].items() if k != skip}
            details += _diff(old, new, f"{section}.")
        out += details or ["the model, renderer or sampling settings changed"]
    table = store.datasets_table()
    old_ds = {d.get("name"): d for d in old_cfg.get("datasets") or []}
    for ds in cfg.datasets:
        row = table.get(ds.name)
        if row is None or row.get("config_hash") in (None, cfg.dataset_result_hash(ds)):
            continue
        before = old_ds.get(ds.name, {})
        now = orjson.loads(orjson.dumps(cfg.to_json()))["datasets"][cfg.datasets.index(ds)]
        changed = [f"dataset {ds.name!r}: {k}: {before.get(k)!r} -> {now.get(k)!r}"
                   for k in RESULT_DATASET_KEYS if before.get(k) != now.get(k)]
        out += changed or [f"dataset {ds.name!r}: settings that change results differ"]
    return out


def refusal_message(run_dir: Path, found: list[str]) -> str:
    lines = "\n".join(f"  - {p}" for p in found)
    return (
        f"{run_dir / STORE_FILE} holds results made with settings this config changes:\n"
        f"{lines}\n"
        "Resume with the original settings, use a new run_dir, or pass --force-new to start "
        f"afresh (the old store is moved to {run_dir / 'previous'}/, nothing is deleted)."
    )


# What was made from a store, moved aside with it: the default export dir and report.
OUTPUTS = ("exports", "report.html")


def move_aside(run_dir: Path) -> list[tuple[Path, Path]]:
    """Move the run's store to run_dir/previous/state-<time>.sqlite (WAL folded in first)
    and what was made from it (`exports/`, `report.html`) to previous/exports-<time>/ and
    previous/report-<time>.html, so nothing beside the new store describes the old one.
    Returns the (from, to) moves, the store first; empty when there was no store."""
    src = run_dir / STORE_FILE
    if not src.exists():
        return []
    conn = sqlite3.connect(src)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    dest_dir = run_dir / "previous"
    dest_dir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = dest_dir / f"state-{stamp}.sqlite"
    n = 1
    while dest.exists():
        n += 1
        dest = dest_dir / f"state-{stamp}-{n}.sqlite"
    src.rename(dest)
    for suffix in ("-wal", "-shm"):
        side = run_dir / (STORE_FILE + suffix)
        if side.exists():
            side.rename(dest.with_name(dest.name + suffix))
    moved = [(src, dest)]
    tag = dest.name.removeprefix("state-").removesuffix(".sqlite")
    for name in OUTPUTS:
        out = run_dir / name
        if out.exists():
            stem, dot, ext = name.partition(".")
            target = dest_dir / f"{stem}-{tag}{dot}{ext}"
            out.rename(target)
            moved.append((out, target))
    return moved
