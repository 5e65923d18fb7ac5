"""How a run's provider exclusions persist: the store's meta `excluded_providers`, JSON
`{name: {"by": "auto" | "user", "reason", "at", "slug"}}` (written by the engine, read back by
a resumed run, status and the exporters)."""

from __future__ import annotations

import re
from typing import Any

import orjson

META_KEY = "excluded_providers"


def read_excluded(meta: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The exclusions recorded in a store's meta ({} when none or unreadable)."""
    try:
        value = orjson.loads(meta.get(META_KEY) or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def encode_excluded(excluded: dict[str, dict[str, Any]]) -> str:
    return orjson.dumps(excluded, option=orjson.OPT_SORT_KEYS).decode()


def name_key(name: str) -> str:
    """A provider name or slug as exclusions match it: lower case, letters and digits only."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def keys_of(excluded: dict[str, Any]) -> set[str]:
    """The match keys (`name_key`) of these exclusions' names and slugs."""
    out = set()
    for name, info in excluded.items():
        out.add(name_key(name))
        if isinstance(info, dict) and info.get("slug"):
            out.add(name_key(str(info["slug"])))
    return out
