"""How the serving stack turns a chat request's messages into what the chat template sees.

`[target] serving` names the stack (docs/renderers.md, "Serving dialects"). All three end in
HF's `apply_chat_template` (`template_view`: keys whose value is None dropped, reasoning under
`reasoning_content` / `thinking` / `reasoning` handed over as `reasoning_content` and
`thinking`), but vLLM and SGLang first rebuild every message (`served_messages`):

* `transformers` — the messages as given;
* `vllm` — history tool-call `arguments` parsed into objects (empty or not a JSON object:
  `{}`), so the template writes them back with `tojson` (`{"a": 1}`: `", "` / `": "`, keys in
  order, non-ASCII kept); `tool_calls: []` dropped; reasoning set as both `reasoning` and
  `reasoning_content`; list content joined with "\\n" when the template does not loop over
  `message['content']` (vLLM's "string" content format), tool results of text parts likewise;
* `sglang` — arguments strings parsed (objects kept); `tool_calls: []` kept; `content: None`
  becomes ""; list content joined with " " unless the template mentions images or loops over
  the content (SGLang's "openai" format); tool results of text parts joined with " ".

What the model sampled (the completion) is always verbatim.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

SERVING_STACKS = ("transformers", "vllm", "sglang")
PARSES_ARGUMENTS = frozenset({"vllm", "sglang"})
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

Message = dict[str, Any]


def template_view(messages: Sequence[Message]) -> list[Message]:
    """The messages as HF `apply_chat_template` (transformers 5) hands them to the template."""
    out = []
    for m in messages:
        if not isinstance(m, dict):
            out.append(m)
            continue
        m = {k: v for k, v in m.items() if v is not None}
        r = next((m[k] for k in REASONING_KEYS if m.get(k) is not None), None)
        if r is not None:
            m = {"thinking": r, **m, "reasoning_content": r}
        out.append(m)
    return out


def served_messages(messages: Sequence[Message], serving: str,
                    content_format: str = "string") -> list[Message]:
    """The messages as the stack `serving` passes them to `apply_chat_template`.

    `content_format` is the stack's content format for the template ("string" or "openai",
    see `content_format`); it only matters for list content."""
    if serving == "vllm":
        return [_vllm_message(m, content_format) for m in messages]
    if serving == "sglang":
        return [_sglang_message(m, content_format) for m in messages]
    return list(messages)


def history_as_served(messages: Sequence[Message], serving: str,
                      content_format: str = "string") -> list[Message] | None:
    """The prompt messages the stack `serving` renders, when they render differently from
    `messages` (None: the same). Arguments stay objects: every renderer writes an object
    argument as `tojson` does."""
    if serving not in PARSES_ARGUMENTS:
        return None
    served = served_messages(messages, serving, content_format)
    return None if template_view(served) == template_view(messages) else served


def reserialized_history(messages: Sequence[Message]) -> list[Message] | None:
    """The history with each assistant tool call's `arguments` string parsed and written
    back as `tojson` does (`json.dumps`, default separators, keys in order, non-ASCII kept);
    None when that changes nothing. The count witness's prompt-side repair for hosted
    providers (quality/repairs.py), which may run either stack."""
    out: list[Message] = []
    changed = False
    for m in messages:
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if not calls:
            out.append(m)
            continue
        new_calls = []
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(args, str):
                try:
                    text = json.dumps(json.loads(args), ensure_ascii=False)
                except ValueError:
                    text = args  # not JSON: the stack would have refused or kept it
                if text != args:
                    changed = True
                    call = {**call, "function": {**fn, "arguments": text}}
            new_calls.append(call)
        out.append({**m, "tool_calls": new_calls})
    return out if changed else None


def may_be_served_differently(messages: Sequence[Message]) -> bool:
    """Whether some stack could render these messages differently from transformers: an
    assistant message with tool calls (or an empty list of them), or list or null content."""
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list) or content is None or "tool_calls" in m:
            return True
    return False


def content_format(serving: str, template: str | None) -> str:
    """The stack's content format for a chat template: "openai" (list content handed to the
    template as parts) or "string" (text parts joined). vLLM: "openai" when the template
    loops over a message's content; SGLang: also when the template mentions media."""
    if serving not in PARSES_ARGUMENTS or not template:
        return "string"
    if serving == "sglang" and re.search(r"image|audio|video|vision", template):
        return "openai"
    return "openai" if _loops_over_content(template) else "string"


# -- the stacks ------------------------------------------------------------------------------
def _parsed_arguments(args: Any, *, strict_object: bool) -> Any:
    if isinstance(args, dict):
        return args
    if not isinstance(args, str) or not args:
        return {} if strict_object else args
    try:
        value = json.loads(args)
    except ValueError:
        return {} if strict_object else args
    if strict_object and not isinstance(value, dict):
        return {}
    return value


def parsed_calls(calls: Any, *, strict_object: bool = False) -> list[Any]:
    """Tool calls with their `arguments` parsed into objects (SGLang's rule; with
    `strict_object` vLLM's: empty, non-JSON or not an object -> {}; else the string kept)."""
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            out.append(call)
            continue
        args = _parsed_arguments(fn.get("arguments"), strict_object=strict_object)
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


def _joined(content: Any, sep: str) -> Any:
    """Text parts joined with `sep`; a list holding anything but text parts is kept."""
    if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type", "text") == "text" for p in content):
        return sep.join(str(p.get("text", "")) for p in content)
    return content


def _vllm_message(m: Message, fmt: str) -> Message:
    if not isinstance(m, dict):
        return m
    role = m.get("role")
    content = m.get("content")
    if role == "tool":  # a tool result of text parts is one string first
        content = _joined(content, "\n")
    if content is None:
        content = "" if fmt == "string" else []
    elif isinstance(content, str):
        content = content if fmt == "string" else [{"type": "text", "text": content}]
    elif fmt == "string":
        content = _joined(content, "\n")
    out: Message = {"role": role, "content": content}
    if role == "assistant":
        calls = m.get("tool_calls")
        if calls:
            out["tool_calls"] = parsed_calls(calls, strict_object=True)
        reasoning = next((m[k] for k in ("reasoning", "reasoning_content")
                          if m.get(k) is not None), None)
        if reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = reasoning
    elif role == "tool" and "tool_call_id" in m:
        out["tool_call_id"] = m["tool_call_id"]
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    return out


def _sglang_message(m: Message, fmt: str) -> Message:
    if not isinstance(m, dict):
        return m
    out = {k: v for k, v in m.items() if v is not None and k != "reasoning"}
    if m.get("role") == "assistant" and m.get("reasoning_content") is None \
            and m.get("reasoning") is not None:
        out["reasoning_content"] = m["reasoning"]  # specgen sends both keys
    content = m.get("content")
    if content is None:
        out["content"] = ""
    elif isinstance(content, list) and (fmt == "string" or m.get("role") == "tool"):
        out["content"] = _joined(content, " ")
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = parsed_calls(out["tool_calls"])
    return out


_CONTENT_LOOP = re.compile(
    r"{%-?\s*for\s+\w+\s+in\s+(\w+)\s*(?:\[\s*['\"]content['\"]\s*\]|\.content)\b")
_MESSAGE_LOOP = re.compile(r"{%-?\s*for\s+(\w+)\s+in\s+(?:messages|loop_messages)\b")


def _loops_over_content(template: str) -> bool:
    """Whether the template has `{% for x in msg['content'] %}` (or `.content`) with `msg`
    a loop variable over the messages, as vLLM's content-format detection looks for."""
    loop_vars = set(_MESSAGE_LOOP.findall(template)) | {"message", "msg", "m"}
    return any(name in loop_vars for name in _CONTENT_LOOP.findall(template))
