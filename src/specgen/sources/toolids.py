"""Tool-call ids of dataset conversations.

Kimi models were trained on ids `functions.{name}:{k}` with k counting the tool calls of the
whole conversation from 0, and the id is part of the tokens (`<|tool_call_begin|>{id}...` and
`## Return of {id}`). Datasets carry `call_abc123` ids or none at all, so by default (for the
Kimi renderers) every dataset call gets its native id and the matching tool results'
`tool_call_id`s are rewritten. With `native_tool_ids = false` existing ids are kept and only
missing ones are filled in (natively).

Tool results are matched to calls by `tool_call_id`; a result whose id is missing or unknown
takes the first call of the preceding assistant message that has no result yet.
"""

from __future__ import annotations

from ..conversation import Message


def native_id(name: str, k: int) -> str:
    return f"functions.{name}:{k}"


def assign_tool_ids(messages: list[Message], *, native: bool) -> list[Message]:
    """Messages with consistent tool-call ids (new dicts where something changed)."""
    out: list[Message] = []
    k = 0
    pending: list[str] = []  # ids of the last assistant message's calls still without a result
    by_old: dict[str, str] = {}
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = []
            pending = []
            by_old = {}
            for c in m["tool_calls"]:
                old = c.get("id") or ""
                new = old if old and not native else native_id(c["function"]["name"], k)
                k += 1
                if old and old not in by_old:
                    by_old[old] = new
                pending.append(new)
                calls.append({**c, "id": new} if new != old else c)
            out.append({**m, "tool_calls": calls})
        elif role == "tool":
            old = m.get("tool_call_id") or ""
            new = by_old.get(old)
            if new is None or new not in pending:
                new = pending[0] if pending else old
            if new in pending:
                pending.remove(new)
            out.append({**m, "tool_call_id": new} if new != old else m)
        else:
            pending, by_old = [], {}
            out.append(m)
    return out


def resolve_native_ids(setting: bool | None, renderer: str | None) -> bool:
    """The effective switch: the dataset's `native_tool_ids`, else on for Kimi renderers (and
    when the renderer is not known, Kimi being the default target)."""
    if setting is not None:
        return setting
    return renderer is None or renderer.startswith("kimi")
