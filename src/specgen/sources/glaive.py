"""glaive function-calling rows -> messages with real `tools` and real tool calls.

A row has `system` text and `chat` text (or one `sample`/`text` field holding both):

    system: SYSTEM: You are a helpful assistant with access to the following functions.
            Use them if required -
            { "name": "get_weather", "description": ..., "parameters": {...} }
            { ...more definitions... }
    chat:   USER: ...
            ASSISTANT: <functioncall> {"name": "get_weather", "arguments": '{"city": "Paris"}'} <|endoftext|>
            FUNCTION RESPONSE: {"temp": 21}
            ASSISTANT: It is 21 degrees in Paris. <|endoftext|>

The JSON definitions after the system sentence become OpenAI `tools`; the system message keeps
only the sentence (its trailing " -" removed). A system text without definitions ("...no
access to external functions") stays as it is. `<functioncall>` payloads are pseudo-JSON: the
arguments are usually a single-quoted string wrapping JSON, sometimes an object or a Python
literal; one ASSISTANT block may hold several calls, each FUNCTION RESPONSE answers the next
call still without a result. `<|endoftext|>` markers are removed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..conversation import Message, Tool
from .arguments import ArgumentsError, parse_arguments
from .messages import FormatError, normalize_tools, tool_call

_MARKER = re.compile(
    r"(?:^|(?<=\n))[ \t]*(USER|ASSISTANT|FUNCTION RESPONSE|FUNCTION RESULT|SYSTEM)[ \t]*:[ \t]?"
)
_CALL = "<functioncall>"
_EOT = "<|endoftext|>"
_PAYLOAD = re.compile(
    r"""^\{\s*"name"\s*:\s*"(?P<name>(?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*"""
    r"""(?P<q>['"])(?P<args>.*)(?P=q)\s*\}$""",
    re.S,
)


def glaive_conversation(row: dict[str, Any]) -> tuple[list[Message], list[Tool] | None]:
    """Messages and tools of one glaive row."""
    chat = row.get("chat")
    system = row.get("system")
    if not isinstance(chat, str):
        for key in ("sample", "text", "conversation"):
            if isinstance(row.get(key), str):
                chat = row[key]
                break
        else:
            raise FormatError("glaive row has no 'chat' text")
    if system is not None and not isinstance(system, str):
        raise FormatError("glaive 'system' must be text")

    blocks = _blocks(chat)
    tools: list[Tool] | None = None
    messages: list[Message] = []
    sys_text = system.strip() if system else ""
    if blocks and blocks[0][0] == "SYSTEM" and not sys_text:
        sys_text = blocks.pop(0)[1]
    sys_text = re.sub(r"^SYSTEM\s*:\s*", "", sys_text)
    if sys_text:
        sys_text, tools = split_function_definitions(sys_text)
        if sys_text:
            messages.append({"role": "system", "content": sys_text})

    for label, text in blocks:
        text = text.replace(_EOT, "").strip()
        if label == "USER":
            messages.append({"role": "user", "content": text})
        elif label == "SYSTEM":
            messages.append({"role": "system", "content": text})
        elif label == "ASSISTANT":
            messages.append(_assistant(text))
        else:  # FUNCTION RESPONSE / FUNCTION RESULT
            messages.append({"role": "tool", "content": text, "tool_call_id": ""})
    return messages, tools


def split_function_definitions(text: str) -> tuple[str, list[Tool] | None]:
    """(system text without the tool dump, tools) of a glaive system text."""
    start = text.find("{")
    if start < 0:
        return text.strip(), None
    decoder = json.JSONDecoder()
    defs: list[Any] = []
    pos = start
    rest: list[str] = []
    while pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            break
        if text[pos] != "{":
            rest.append(text[pos:].strip())
            break
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            end = _matching_brace(text, pos)
            try:
                value = parse_arguments(text[pos:end]) if end else None
            except ArgumentsError:
                value = None
            if value is None:
                if not defs:
                    return text.strip(), None  # braces, but not a definition dump
                raise FormatError(f"glaive system: function definition is not JSON ({exc.msg})") from None
            pos = end
        defs.append(value)
    if not defs or not all(isinstance(d, dict) and isinstance(d.get("name"), str) for d in defs):
        return text.strip(), None  # braces, but not function definitions
    head = text[:start].rstrip()
    head = re.sub(r"\s*-\s*$", "", head).strip()
    extra = "\n\n".join(r for r in rest if r)
    return ("\n\n".join(p for p in (head, extra) if p)), normalize_tools(defs, "glaive functions")


def parse_function_call(payload: str) -> tuple[str, Any]:
    """(name, arguments) of one `<functioncall>` payload."""
    payload = payload.strip()
    try:
        obj = json.loads(payload)
    except ValueError:
        obj = None
    if obj is None:
        m = _PAYLOAD.match(payload)
        if m:
            name = json.loads(f'"{m["name"]}"')
            return name, m["args"]
        try:
            obj = parse_arguments(payload)
        except ArgumentsError as exc:
            raise FormatError(f"<functioncall> payload unreadable: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise FormatError(f"<functioncall> payload has no function name: {payload[:80]!r}")
    args = obj.get("arguments", obj.get("parameters", {}))
    return obj["name"], args


def _assistant(text: str) -> Message:
    head, *payloads = text.split(_CALL)
    msg: Message = {"role": "assistant", "content": head.strip()}
    calls = []
    for p in payloads:
        name, args = parse_function_call(p)
        calls.append(tool_call(name, args))
    if calls:
        msg["tool_calls"] = calls
    return msg


def _blocks(chat: str) -> list[tuple[str, str]]:
    marks = list(_MARKER.finditer(chat))
    if not marks:
        raise FormatError("glaive chat has no USER:/ASSISTANT: turns")
    lead = chat[: marks[0].start()].strip()
    if lead:
        raise FormatError(f"glaive chat starts with text outside a turn: {lead[:60]!r}")
    out = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(chat)
        out.append((m.group(1), chat[m.end(): end]))
    return out


def _matching_brace(text: str, pos: int) -> int:
    """Index after the `}` closing the `{` at `pos` (quotes respected), 0 if none."""
    depth = 0
    quote = ""
    i = pos
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return 0
