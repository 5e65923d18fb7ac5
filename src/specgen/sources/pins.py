"""How a run records its Hub datasets (meta `hub:<dataset>`, written by
specgen.engine.hub_pin) and how readers of a run (summary, report, export manifests) name them."""

from __future__ import annotations

from typing import Any

import orjson

PIN_PREFIX = "hub:"
MOVED_PREFIX = "hub_moved:"  # what the revision pointed at upstream at the last session


def hub_pins(meta: dict[str, str]) -> dict[str, dict[str, Any]]:
    """{dataset: {repo, revision, subset, split, commit, files, ...}} of a run's meta."""
    out = {}
    for key, value in sorted(meta.items()):
        if not key.startswith(PIN_PREFIX):
            continue
        try:
            pin = orjson.loads(value)
        except orjson.JSONDecodeError:
            continue
        name = key[len(PIN_PREFIX):]
        pin["source"] = f"hf://datasets/{pin.get('repo')}"
        pin["upstream_moved_to"] = meta.get(MOVED_PREFIX + name) or None
        out[name] = pin
    return out


def pin_line(name: str, pin: dict[str, Any]) -> str:
    """One line naming a pinned Hub dataset (dataset, subset, split, commit)."""
    text = (f"{name}: {pin['source']} subset {pin.get('subset') or '-'} split "
            f"{pin.get('split') or '-'} at commit {str(pin.get('commit'))[:12]} (revision "
            f"{pin.get('revision')!r})")
    if pin.get("data_revision"):
        text += f", files from refs/convert/parquet {str(pin['data_revision'])[:12]}"
    if pin.get("upstream_moved_to"):
        text += (f"; upstream the revision moved to {pin['upstream_moved_to'][:12]}, the run "
                 "reads its pinned commit")
    return text
