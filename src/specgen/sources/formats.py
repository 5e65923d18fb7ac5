"""Dataset row formats -> (messages, tools), and how `format = "auto"` picks one.

Detection looks at one row (the first valid row of the dataset), in this order:

| the row has                                                   | format      |
|---------------------------------------------------------------|-------------|
| `messages` / `conversations` / `conversation`: dicts with `from`+`value` | `sharegpt` |
| the same keys: dicts with `role` (any assistant text opening `<think>`) | `reasoning` |
| the same keys: dicts with `role`                                | `openai`    |
| `chat` text (or `sample`/`text` with `USER:` and `ASSISTANT:`)  | `glaive`    |
| `data` / `dialog` / `turns` / the keys above: a list of strings | `ultrachat` |
| `prompt` / `instruction` / `question` / `query` / `problem` / `input` | `prompt` |

`reasoning` and `openai` read rows the same way (a `<think>...</think>` block opening an
assistant message becomes its `reasoning_content` in both); the name only records what was seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..conversation import REASONING_KEYS, Message, Tool
from .arguments import ArgumentsError, parse_arguments
from .glaive import glaive_conversation
from .messages import (
    FormatError,
    clean_content,
    clean_message,
    maybe_json,
    normalize_tools,
    split_think,
    tool_call,
)

LIST_KEYS = ("messages", "conversations", "conversation")
ULTRACHAT_KEYS = ("data", "dialog", "dialogue", "turns") + LIST_KEYS
PROMPT_KEYS = ("prompt", "instruction", "question", "query", "problem", "input")
SYSTEM_KEYS = ("system", "system_prompt")
TOOLS_KEYS = ("tools", "functions")

Adapter = Callable[[dict[str, Any]], tuple[list[Message], list[Tool] | None]]


def detect_format(row: Any) -> str | None:
    """The format of one row, or None when it fits none (see the module docstring)."""
    if not isinstance(row, dict):
        return None
    for key in LIST_KEYS:
        items = _list(row.get(key))
        if not items:
            continue
        first = items[0]
        if isinstance(first, dict) and "from" in first and "value" in first:
            return "sharegpt"
        if isinstance(first, dict) and "role" in first:
            return "reasoning" if _has_think(items) else "openai"
        if all(isinstance(x, str) for x in items):
            return "ultrachat"
    if isinstance(row.get("chat"), str):
        return "glaive"
    for key in ("sample", "text"):
        text = row.get(key)
        if isinstance(text, str) and "USER:" in text and "ASSISTANT:" in text:
            return "glaive"
    for key in ULTRACHAT_KEYS:
        items = _list(row.get(key))
        if items and all(isinstance(x, str) for x in items):
            return "ultrachat"
    for key in PROMPT_KEYS:
        if isinstance(row.get(key), str) and row[key].strip():
            return "prompt"
        if isinstance(row.get(key), list) and row[key] and isinstance(row[key][0], dict):
            return "prompt"
    return None


def openai_conversation(row: dict[str, Any]) -> tuple[list[Message], list[Tool] | None]:
    items = _first_list(row, LIST_KEYS, "messages")
    messages = [clean_message(m, f"messages[{i}]") for i, m in enumerate(items)]
    messages = _with_system(row, messages)
    return messages, _tools(row)


def sharegpt_conversation(row: dict[str, Any]) -> tuple[list[Message], list[Tool] | None]:
    items = _first_list(row, LIST_KEYS, "conversations")
    messages: list[Message] = []
    for i, turn in enumerate(items):
        what = f"conversations[{i}]"
        if not isinstance(turn, dict):
            raise FormatError(f"{what}: expected an object with from/value")
        speaker = str(turn.get("from") or "").lower().replace("-", "_")
        value = turn.get("value")
        if speaker in ("function_call", "tool_call", "tool_calls"):
            calls = _sharegpt_calls(value, what)
            prev = messages[-1] if messages else None
            if prev and prev["role"] == "assistant":  # text turn + call turn = one message
                prev.setdefault("tool_calls", []).extend(calls)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": calls})
            continue
        text = clean_content(value, what)
        if speaker in ("human", "user"):
            messages.append({"role": "user", "content": text})
        elif speaker in ("gpt", "assistant", "chatgpt", "bard", "bing", "model", "bot"):
            msg: Message = {"role": "assistant", "content": text}
            reasoning = next((turn[k] for k in REASONING_KEYS if turn.get(k)), None)
            if isinstance(reasoning, str):
                msg["reasoning_content"] = reasoning
            elif isinstance(text, str):
                try:
                    reasoning, msg["content"] = split_think(text)
                except FormatError as exc:
                    raise FormatError(f"{what}: {exc}") from None
                if reasoning is not None:
                    msg["reasoning_content"] = reasoning
            messages.append(msg)
        elif speaker == "system":
            messages.append({"role": "system", "content": text})
        elif speaker in ("function_response", "observation", "tool", "function", "ipython"):
            messages.append({"role": "tool", "content": text, "tool_call_id": ""})
        else:
            raise FormatError(f"{what}: unknown speaker {turn.get('from')!r}")
    return _with_system(row, messages), _tools(row)


def ultrachat_conversation(row: dict[str, Any]) -> tuple[list[Message], list[Tool] | None]:
    items = _first_list(row, ULTRACHAT_KEYS, "data")
    messages: list[Message] = []
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise FormatError(f"data[{i}]: expected text, got {type(text).__name__}")
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return _with_system(row, messages), _tools(row)


def prompt_conversation(row: dict[str, Any]) -> tuple[list[Message], list[Tool] | None]:
    for key in PROMPT_KEYS:
        value = row.get(key)
        if isinstance(value, list) and value and isinstance(value[0], dict):
            messages = [clean_message(m, f"{key}[{i}]") for i, m in enumerate(value)]
            return _with_system(row, messages), _tools(row)
        if isinstance(value, str) and value.strip():
            text = value
            if key == "instruction" and isinstance(row.get("input"), str) and row["input"].strip():
                text = f"{value}\n\n{row['input']}"
            return _with_system(row, [{"role": "user", "content": text}]), _tools(row)
    raise FormatError(f"no prompt text (expected one of: {', '.join(PROMPT_KEYS)})")


FORMATS: dict[str, Adapter] = {
    "openai": openai_conversation,
    "reasoning": openai_conversation,
    "sharegpt": sharegpt_conversation,
    "glaive": glaive_conversation,
    "ultrachat": ultrachat_conversation,
    "prompt": prompt_conversation,
}


# -- helpers -------------------------------------------------------------------------------

def _list(value: Any) -> list | None:
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = maybe_json(value, "list")
        except FormatError:
            return None
    return value if isinstance(value, list) else None


def _first_list(row: dict[str, Any], keys: tuple[str, ...], label: str) -> list:
    for key in keys:
        value = row.get(key)
        if value is None:
            continue
        value = maybe_json(value, key)
        if not isinstance(value, list):
            raise FormatError(f"'{key}' must be a list, got {type(value).__name__}")
        return value
    raise FormatError(f"no '{label}' list (looked for: {', '.join(keys)})")


def _has_think(items: list) -> bool:
    for m in items:
        if isinstance(m, dict) and m.get("role") in ("assistant", "gpt"):
            content = m.get("content")
            if isinstance(content, str) and content.lstrip().startswith("<think>"):
                return True
    return False


def _with_system(row: dict[str, Any], messages: list[Message]) -> list[Message]:
    """Prepend a `system` column unless the messages already open with a system message."""
    for key in SYSTEM_KEYS:
        text = row.get(key)
        if isinstance(text, str) and text.strip():
            if not messages or messages[0]["role"] != "system":
                return [{"role": "system", "content": text}, *messages]
            break
    return messages


def _tools(row: dict[str, Any]) -> list[Tool] | None:
    for key in TOOLS_KEYS:
        if row.get(key) not in (None, "", []):
            return normalize_tools(row[key], key)
    return None


def _sharegpt_calls(value: Any, what: str) -> list[dict[str, Any]]:
    try:
        parsed = parse_arguments(value) if isinstance(value, str) else value
    except ArgumentsError as exc:
        raise FormatError(f"{what}: function call is not JSON ({exc})") from None
    items = parsed if isinstance(parsed, list) else [parsed]
    calls = []
    for j, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise FormatError(f"{what}: function call [{j}] has no name")
        calls.append(tool_call(item["name"], item.get("arguments", item.get("parameters", {}))))
    return calls
