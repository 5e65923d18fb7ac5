"""Shape checks for a conversation before it is rendered, with errors naming the field.

Renderers assume OpenAI chat format; these checks make a bad dataset row fail with
`messages[2].tool_calls[0].function.name: expected a string` instead of a stack trace.
They validate only: nothing is rewritten (tokenization must see the data as it is).
"""

from __future__ import annotations

from typing import Any

from .base import RenderError

_TEXT_OR_NONE = (str, type(None))


def check_conversation(messages: Any, tools: Any = None) -> None:
    """Raise RenderError naming the first field of `messages` / `tools` a renderer cannot use."""
    if not isinstance(messages, list):
        raise RenderError(f"messages: expected a list of messages, got {_kind(messages)}")
    if not messages:
        raise RenderError("messages: the list is empty")
    for i, m in enumerate(messages):
        _check_message(m, f"messages[{i}]")
    if tools is not None:
        if not isinstance(tools, list):
            raise RenderError(f"tools: expected a list of tools, got {_kind(tools)}")
        for k, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise RenderError(f"tools[{k}]: expected an object, got {_kind(tool)}")
            fn = tool.get("function")
            if fn is not None and not isinstance(fn, dict):
                raise RenderError(f"tools[{k}].function: expected an object, got {_kind(fn)}")


def _check_message(m: Any, where: str) -> None:
    if not isinstance(m, dict):
        raise RenderError(f"{where}: expected an object, got {_kind(m)}")
    role = m.get("role")
    if not isinstance(role, str) or not role:
        raise RenderError(f"{where}.role: expected a non-empty string, got {_kind(role)}")
    _check_content(m.get("content"), f"{where}.content")
    for key in ("name", "reasoning_content", "thinking", "reasoning", "tool_call_id"):
        if not isinstance(m.get(key), _TEXT_OR_NONE):
            raise RenderError(f"{where}.{key}: expected a string, got {_kind(m[key])}")
    calls = m.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise RenderError(f"{where}.tool_calls: expected a list, got {_kind(calls)}")
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, dict):
            raise RenderError(f"{at}: expected an object, got {_kind(call)}")
        if not isinstance(call.get("id"), _TEXT_OR_NONE):
            raise RenderError(f"{at}.id: expected a string, got {_kind(call['id'])}")
        if "function" not in call:
            kind = call.get("type")
            what = (f"a {kind!r} tool call" if isinstance(kind, str) and kind != "function"
                    else "this tool call")
            raise RenderError(f"{at}.function: missing ({what} has no function; chat templates "
                              "render function calls only)")
        fn = call["function"]
        if not isinstance(fn, dict):
            raise RenderError(f"{at}.function: expected an object, got {_kind(fn)}")
        if "name" not in fn:
            raise RenderError(f"{at}.function.name: missing")
        if not isinstance(fn["name"], str):
            raise RenderError(f"{at}.function.name: expected a string, got {_kind(fn['name'])}")
        if "arguments" not in fn:
            raise RenderError(f"{at}.function.arguments: missing (the template writes the "
                              "arguments string the model produced; none is invented)")
        if not isinstance(fn["arguments"], str | dict | list):
            raise RenderError(
                f"{at}.function.arguments: expected a string (or JSON object), "
                f"got {_kind(fn['arguments'])}"
            )


def _check_content(content: Any, where: str) -> None:
    if isinstance(content, _TEXT_OR_NONE):
        return
    if not isinstance(content, list):
        raise RenderError(f"{where}: expected a string, a list of parts or null, got {_kind(content)}")
    for k, part in enumerate(content):
        if isinstance(part, str):
            continue
        if not isinstance(part, dict):
            raise RenderError(f"{where}[{k}]: expected an object, got {_kind(part)}")
        if not isinstance(part.get("text"), _TEXT_OR_NONE):
            raise RenderError(f"{where}[{k}].text: expected a string, got {_kind(part['text'])}")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
