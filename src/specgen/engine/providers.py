"""Providers taken out of a run: how the exclusions persist, and how `specgen provider` asks.

* The store's meta `excluded_providers` holds the run's exclusions as JSON, `{name: {"by":
  "auto" | "user", "reason", "at", "slug"}}`; a resumed run reads them back (the provider
  stays in the request's `provider.ignore`).
* `specgen provider RUN_DIR --exclude NAME | --allow NAME` writes a request file
  `run_dir/provider-<ns>.json` (`{"action", "name", "ts"}`) that the running engine polls with
  the stop requests, applies and removes. With no engine running, the command holds the run
  dir's lock and changes the store itself (`apply_offline`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson

from ..exclusions import META_KEY, encode_excluded, read_excluded  # noqa: F401 (re-exported)

REQUEST_PREFIX = "provider-"
ACTIONS = ("exclude", "allow")


def write_request(run_dir: Path, action: str, name: str) -> Path:
    """Ask the engine running in `run_dir` to exclude or allow a provider."""
    if action not in ACTIONS:
        raise ValueError(action)
    path = Path(run_dir) / f"{REQUEST_PREFIX}{time.time_ns()}-{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps({"action": action, "name": name, "ts": time.time()}))
    os.replace(tmp, path)
    return path


def pending_requests(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Request files waiting in `run_dir`, oldest first; unreadable ones are dropped."""
    out = []
    try:
        entries = [e for e in os.scandir(run_dir)
                   if e.name.startswith(REQUEST_PREFIX) and e.name.endswith(".json")]
    except OSError:
        return []
    for entry in sorted(entries, key=lambda e: e.name):
        path = Path(entry.path)
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            data = None
        if (isinstance(data, dict) and data.get("action") in ACTIONS
                and isinstance(data.get("name"), str) and data["name"].strip()):
            out.append((path, data))
        else:
            path.unlink(missing_ok=True)
    return out


def change(excluded: dict[str, dict[str, Any]], action: str, name: str,
           reason: str) -> str | None:
    """Apply one request to an exclusions dict (no endpoint list: the name is its slug);
    returns the name changed, None when there was nothing to do."""
    if action == "exclude":
        if any(k.lower() == name.lower() for k in excluded):
            return None
        excluded[name] = {"by": "user", "reason": reason, "at": time.time(), "slug": name}
        return name
    for key in list(excluded):
        if key.lower() == name.lower() or str(excluded[key].get("slug", "")).lower() \
                == name.lower():
            del excluded[key]
            return key
    return None


def apply_offline(run_dir: Path, action: str, name: str) -> str:
    """Change the exclusions of a run no engine is running (holding the run dir's lock, so
    none starts meanwhile). Returns what was done. Raises RunLockedError when an engine holds
    the run dir, StoreError when there is no run."""
    from ..store import Store
    from .control import RunLock

    with RunLock(run_dir), Store.open(run_dir, readonly=False) as store:
        excluded = read_excluded(store.meta())
        done = change(excluded, action, name, "specgen provider --exclude")
        if done is None:
            return (f"{name!r} is already excluded" if action == "exclude"
                    else f"{name!r} is not excluded")
        store.set_meta(META_KEY, encode_excluded(excluded))
        store.conn.execute(
            "INSERT INTO events(ts, session, kind, dataset, provider, detail) "
            "VALUES(?, NULL, ?, NULL, ?, ?)",
            (time.time(), f"provider_{'excluded' if action == 'exclude' else 'allowed'}", done,
             f"specgen provider --{action} {name} (no run was running)"))
    return (f"{done!r} excluded: the next run leaves it out" if action == "exclude"
            else f"{done!r} allowed back: the next run sends to it again")
