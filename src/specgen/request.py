"""The exact JSON body sent for one turn (docs/datasets.md, "Request body").

Two dialects, chosen by `endpoint.dialect`, or (`auto`) from the base URL:

* `openrouter` (OpenRouter and the built-in simulator, `base_url = "sim"`): `reasoning` object,
  `provider` routing object, `usage: {"include": true}`, `transforms: []` (context compression
  off); history assistant turns carry their reasoning in both `reasoning_content` and
  `reasoning`. A `models` fallback list is never sent.
* `openai` (anything else: vLLM, SGLang, other OpenAI-compatible servers): no OpenRouter-only
  fields; thinking on/off becomes `chat_template_kwargs: {"thinking": x, "enable_thinking": x}`
  (Kimi templates read `thinking`, Qwen-style ones `enable_thinking`); history reasoning goes
  in `reasoning_content`, the field those chat templates read.

Tools always travel as the `tools` parameter, never as system text. The body never holds
secrets: keys go in headers (the client's job).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from .config import DatasetConfig, RunConfig
from .conversation import Message, content_text, message_reasoning
from .planner import TurnRequest

PROTECTED = frozenset({"model", "messages", "tools"})  # `sampling.extra` cannot replace these


def dialect(base_url: str) -> str:
    """`openrouter` for OpenRouter and the simulator, else `openai`."""
    if base_url == "sim":
        return "openrouter"
    host = (urlparse(base_url).hostname or "").lower()
    return "openrouter" if host == "openrouter.ai" or host.endswith(".openrouter.ai") else "openai"


def request_dialect(cfg: RunConfig, base_url: str | None = None) -> str:
    """`endpoint.dialect` when set to openrouter/openai, else from the base URL."""
    mode = getattr(cfg.endpoint, "dialect", "auto")
    if mode in ("openrouter", "openai"):
        return mode
    return dialect(base_url or cfg.endpoint.base_url[0])


def build_request(
    cfg: RunConfig, ds: DatasetConfig, req: TurnRequest, *, base_url: str | None = None
) -> dict[str, Any]:
    """The exact JSON body sent for this turn (no secrets in it).

    `base_url` picks the dialect when `endpoint.dialect` is auto (default: the first base URL).
    """
    kind = request_dialect(cfg, base_url)
    s = cfg.sampling
    body: dict[str, Any] = {
        "model": cfg.target.model,
        "messages": [request_message(m, kind) for m in req.messages],
    }
    if req.tools:
        body["tools"] = req.tools
    body["max_tokens"] = cfg.max_tokens_for(ds)
    for key in ("temperature", "top_p", "top_k", "min_p", "seed", "stop"):
        value = getattr(s, key)
        if value is not None:
            body[key] = value
    if kind == "openrouter":
        body["reasoning"] = reasoning_object(s.reasoning)
        if cfg.endpoint.provider:
            body["provider"] = cfg.endpoint.provider
        body["usage"] = {"include": True}
        body["transforms"] = []  # no context compression: the prompt must reach the model whole
    else:
        body["chat_template_kwargs"] = {"thinking": s.thinking, "enable_thinking": s.thinking}
    body["stream"] = bool(cfg.endpoint.stream)
    if cfg.endpoint.stream:
        body["stream_options"] = {"include_usage": True}
    if cfg.endpoint.return_token_ids:
        body["return_token_ids"] = True
    for key, value in (s.extra or {}).items():
        if key not in PROTECTED:
            body[key] = value
    body.pop("models", None)  # never a fallback to other models (the config refuses it too)
    return body


def reasoning_object(setting: bool | dict[str, Any]) -> dict[str, Any]:
    """OpenRouter's `reasoning` object for `sampling.reasoning` (a bool or the object itself)."""
    if isinstance(setting, dict):
        return dict(setting)
    return {"enabled": bool(setting)}


def request_message(m: Message, kind: str = "openrouter") -> Message:
    """A conversation message as sent: only the fields the API knows."""
    role = m.get("role")
    out: Message = {"role": role}
    if role == "assistant":
        out["content"] = content_text(m.get("content"))
        calls = m.get("tool_calls")
        reasoning = message_reasoning(m)
        if reasoning is None and calls:
            reasoning = ""  # some Kimi providers reject a tool-call turn without reasoning
        if reasoning is not None:
            out["reasoning_content"] = reasoning
            if kind == "openrouter":
                out["reasoning"] = reasoning
        if calls:
            out["tool_calls"] = [
                {"id": c.get("id") or "", "type": "function",
                 "function": {"name": c["function"]["name"],
                              "arguments": c["function"].get("arguments", "")}}
                for c in calls
            ]
        return out
    out["content"] = m.get("content") if m.get("content") is not None else ""
    if role == "tool":
        out["tool_call_id"] = m.get("tool_call_id") or ""
    elif m.get("name"):
        out["name"] = m["name"]
    return out
