"""Building blocks the format adapters share: clean OpenAI messages, tools, `<think>` splits.

Every adapter ends in the same normal form (see `specgen.conversation`): roles system / user /
assistant / tool; assistant reasoning in `reasoning_content`; tool calls as
`{"id", "type": "function", "function": {"name", "arguments": str}}`; tool results with
`tool_call_id`. Keys whose value is None are dropped (Arrow and Parquet fill missing struct
fields with nulls).
"""

from __future__ import annotations

import json
from typing import Any

from ..conversation import REASONING_KEYS, Message, Tool
from .arguments import ArgumentsError, canonical_arguments, parse_arguments

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

ROLE_ALIASES = {
    "system": "system", "developer": "system",
    "user": "user", "human": "user",
    "assistant": "assistant",
    "tool": "tool", "function": "tool", "ipython": "tool",
}


class FormatError(ValueError):
    """A row that does not fit its format; the message says which field and why."""


def drop_none(obj: Any) -> Any:
    """`obj` with None-valued mapping entries removed, recursively."""
    if isinstance(obj, dict):
        return {k: drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [drop_none(v) for v in obj]
    return obj


def maybe_json(value: Any, what: str) -> Any:
    """Parse `value` when a dataset stored a structure as a JSON string."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise FormatError(f"{what}: invalid JSON text ({exc})") from None
    return value


def normalize_tools(value: Any, what: str = "tools") -> list[Tool] | None:
    """OpenAI-format tool list from a list (or JSON text) of tools or bare function schemas."""
    value = maybe_json(value, what)
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise FormatError(f"{what}: expected a list of tools, got {type(value).__name__}")
    tools: list[Tool] = []
    for i, tool in enumerate(value):
        tool = maybe_json(tool, f"{what}[{i}]")
        if not isinstance(tool, dict):
            raise FormatError(f"{what}[{i}]: expected an object, got {type(tool).__name__}")
        tool = drop_none(tool)
        fn = tool.get("function") if tool.get("type", "function") == "function" else None
        if not isinstance(fn, dict):
            if "name" not in tool:
                raise FormatError(f"{what}[{i}]: neither a function tool nor a function schema")
            fn = tool
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise FormatError(f"{what}[{i}]: function has no name")
        fn = dict(fn)
        if isinstance(fn.get("parameters"), str):
            fn["parameters"] = maybe_json(fn["parameters"], f"{what}[{i}].parameters")
        tools.append({"type": "function", "function": fn})
    return tools or None


def tool_names(tools: list[Tool] | None) -> set[str]:
    return {t["function"]["name"] for t in tools or ()}


def tool_call(name: str, arguments: Any, call_id: str = "") -> dict[str, Any]:
    """An OpenAI tool call; arguments kept verbatim when they are JSON text."""
    try:
        args = canonical_arguments(arguments)
    except ArgumentsError as exc:
        raise FormatError(f"tool call {name!r}: arguments are not JSON ({exc})") from None
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def split_think(content: str) -> tuple[str | None, str]:
    """(reasoning, content) of text that holds a `<think>...</think>` block at its start (or
    only the closing tag). Reasoning loses its framing newlines, content its leading ones."""
    body = content.lstrip()
    if body.startswith(THINK_OPEN):
        end = body.find(THINK_CLOSE)
        if end < 0:
            raise FormatError(f"{THINK_OPEN} without {THINK_CLOSE}")
        reasoning = body[len(THINK_OPEN): end]
        rest = body[end + len(THINK_CLOSE):]
    elif THINK_CLOSE in content and THINK_OPEN not in content:
        reasoning, _, rest = content.partition(THINK_CLOSE)
    else:
        if THINK_OPEN in content or THINK_CLOSE in content:
            raise FormatError(f"{THINK_OPEN}/{THINK_CLOSE} in the middle of the content")
        return None, content
    if THINK_OPEN in rest or THINK_CLOSE in rest:
        raise FormatError(f"more than one {THINK_OPEN} block")
    return reasoning.strip("\n"), rest.lstrip("\n")


def clean_content(content: Any, what: str) -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                parts.append({"type": "text", "text": part})
            elif isinstance(part, dict):
                parts.append(drop_none(part))
            else:
                raise FormatError(f"{what}.content[{j}]: expected a text or content part")
        return parts
    raise FormatError(f"{what}.content: expected text, got {type(content).__name__}")


def clean_message(m: Any, what: str) -> Message:
    """One OpenAI-style message (role aliases mapped, reasoning split out) in normal form."""
    if not isinstance(m, dict):
        raise FormatError(f"{what}: expected an object with role and content")
    role = ROLE_ALIASES.get(str(m.get("role") or "").lower())
    if role is None:
        raise FormatError(f"{what}: unknown role {m.get('role')!r}")
    msg: Message = {"role": role, "content": clean_content(m.get("content"), what)}
    if role == "tool":
        call_id = m.get("tool_call_id")
        msg["tool_call_id"] = str(call_id) if call_id is not None else ""
        return msg
    name = m.get("name")
    if isinstance(name, str) and name and role != "assistant":
        msg["name"] = name
    if role != "assistant":
        return msg
    calls = m.get("tool_calls")
    if calls is None and isinstance(m.get("function_call"), dict):  # legacy OpenAI field
        calls = [{"function": m["function_call"]}]
    calls = maybe_json(calls, f"{what}.tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise FormatError(f"{what}.tool_calls: expected a list")
        out = []
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise FormatError(f"{what}.tool_calls[{j}]: missing function name")
            out.append(tool_call(fn["name"], fn.get("arguments", "{}"), str(c.get("id") or "")))
        msg["tool_calls"] = out
    reasoning = next((m[k] for k in REASONING_KEYS if isinstance(m.get(k), str)), None)
    if reasoning is None and isinstance(msg["content"], str):
        try:
            reasoning, msg["content"] = split_think(msg["content"])
        except FormatError as exc:
            raise FormatError(f"{what}: {exc}") from None
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return msg


def check_conversation(messages: list[Message], tools: list[Tool] | None) -> None:
    """Reject conversations the pipeline cannot use faithfully (reasons name the message)."""
    if not messages:
        raise FormatError("no messages")
    if not any(m["role"] == "user" for m in messages):
        raise FormatError("no user message")
    names = tool_names(tools)
    open_calls = 0
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "assistant":
            calls = m.get("tool_calls") or ()
            for c in calls:
                name = c["function"]["name"]
                if name not in names:
                    where = "the row declares no tools" if not tools else (
                        f"declared: {', '.join(sorted(names))}")
                    raise FormatError(f"message {i} calls tool {name!r} but {where}")
                try:
                    parse_arguments(c["function"]["arguments"])
                except ArgumentsError as exc:
                    raise FormatError(f"message {i}: arguments of {name!r} unreadable ({exc})") from None
            open_calls = len(calls)
        elif role == "tool":
            if open_calls <= 0:
                raise FormatError(f"message {i} is a tool result without a pending tool call")
            open_calls -= 1
        else:
            open_calls = 0
