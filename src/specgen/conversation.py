"""Core conversation types shared by every stage of the pipeline.

Messages are kept in OpenAI chat format (plain dicts) because that is what datasets, APIs and
exporters speak; the typed helpers here only normalise what an assistant message carries.

An OpenAI message dict may hold:
  role: "system" | "user" | "assistant" | "tool" (others are rendered as system-like roles)
  content: str | list[part] | None
  name: str                               (optional speaker name)
  reasoning_content / reasoning: str      (assistant reasoning; both spellings are read)
  tool_calls: [{"id", "type": "function", "function": {"name", "arguments": str}}]
  tool_call_id: str                       (tool results)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from . import jsonexact

Message = dict[str, Any]
Tool = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call exactly as the model produced it: `arguments` is the raw string."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_openai(cls, call: dict[str, Any]) -> ToolCall:
        fn = call.get("function") or {}
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            # Some datasets store parsed arguments: written as the chat template's `tojson`
            # writes them (`{"a": 1}`: default separators, keys in order, non-ASCII kept).
            args = json.dumps(args, ensure_ascii=False)
        return cls(id=str(call.get("id") or ""), name=str(fn.get("name") or ""), arguments=args)


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    """What the target model sampled for one assistant turn.

    `reasoning` is None when the turn carried no reasoning field at all, "" when it was empty.
    """

    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()

    def to_openai(self) -> Message:
        msg: Message = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return msg

    @classmethod
    def from_openai(cls, msg: Message) -> AssistantMessage:
        return cls(
            content=content_text(msg.get("content")),
            reasoning=message_reasoning(msg),
            tool_calls=tuple(ToolCall.from_openai(c) for c in msg.get("tool_calls") or ()),
        )


@dataclass(slots=True)
class Conversation:
    """One dataset row after normalisation: the unit of resume, dedupe and sharding."""

    id: str
    messages: list[Message]
    tools: list[Tool] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "messages": self.messages}
        if self.tools:
            out["tools"] = self.tools
        if self.meta:
            out["meta"] = self.meta
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Conversation:
        return cls(
            id=str(obj["id"]),
            messages=list(obj["messages"]),
            tools=obj.get("tools") or None,
            meta=dict(obj.get("meta") or {}),
        )


# The names reasoning goes by in a message, in the order transformers 5 reads them (it hands
# the first one set to the template as `reasoning_content`); every renderer reads the same.
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def message_reasoning(msg: Message) -> str | None:
    """Reasoning of an assistant message, whichever field name the source used."""
    for key in REASONING_KEYS:
        value = msg.get(key)
        if isinstance(value, str):
            return value
    return None


def content_text(content: Any) -> str:
    """Plain text of a message content (string, None, or list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in content
        )
    return str(content)


def stable_id(obj: Any) -> str:
    """Content hash used as a conversation id when the row has none (stable across runs)."""
    return hashlib.sha256(jsonexact.dumps(obj, sort_keys=True)).hexdigest()[:24]
