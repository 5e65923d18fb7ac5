"""What a row that failed its declared format looks like: the fields found and the format
they fit (`format = "auto"`'s detection), for the invalid-row reason (issue 24)."""

from __future__ import annotations

from typing import Any

from .formats import LIST_KEYS, detect_format


def found_fields(row: Any) -> str:
    """The row's top-level keys, with the keys of the first item of its message list."""
    if not isinstance(row, dict):
        return type(row).__name__
    parts = []
    for key in list(row)[:8]:
        value = row[key]
        if key in LIST_KEYS and isinstance(value, list) and value and isinstance(value[0], dict):
            parts.append(f"{key}[].{'/'.join(list(value[0])[:4])}")
        else:
            parts.append(str(key))
    return ", ".join(parts)


def format_hint(row: Any, declared: str) -> str:
    """"" when the row fits no other format; else "; found fields ...: format = "X"?"."""
    fits = detect_format(row)
    if fits is None or fits == declared:
        return ""
    return f" (found fields {found_fields(row)}: set format = \"{fits}\" or \"auto\")"
