"""A chat-completions request body, validated into what the simulator needs.

Invalid bodies raise `BadRequest` with a message naming the field (answered with HTTP 400).
Fields the simulator has no use for (temperature, top_p, ...) are type-checked lightly and
otherwise ignored, as a provider ignores what it does not support.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import DEFAULT_SUPPORTED_PARAMETERS, SimConfig
from .routing import VARIANT_SORT, BadRequest, parse_preferences

# Body keys that count as "parameters" for provider.require_parameters.
PARAMETER_NAMES = frozenset(DEFAULT_SUPPORTED_PARAMETERS) | {"max_completion_tokens"}
_NUMERIC = frozenset({"temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                      "presence_penalty", "repetition_penalty"})
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


@dataclass(slots=True)
class ChatRequest:
    model: str  # the served model slug (variant and date stripped)
    sort: str | None  # from a :nitro / :floor variant
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: Any
    parallel_tool_calls: bool
    stream: bool
    max_tokens: int | None
    stop: list[str]
    thinking: bool
    effort: str | None
    reasoning_max_tokens: int | None
    exclude_reasoning: bool
    provider: dict[str, Any]
    params: set[str]
    want_ids: bool
    seed: int | None
    prior_tool_calls: int  # tool calls in the conversation so far (k of functions.name:k)
    history_tool: str | None  # name of the last tool called in the conversation


def parse_chat_request(body: Any, cfg: SimConfig, *, ids_header: bool = False) -> ChatRequest:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: required string")
    base, _, variant = model.partition(":")
    sort = None
    if variant:
        if variant not in VARIANT_SORT:
            raise BadRequest(f"model: unknown variant ':{variant}' (supported: "
                             f"{', '.join(':' + v for v in VARIANT_SORT)})")
        sort = VARIANT_SORT[variant]
    served = _served_model(base, cfg)
    if served is None:
        raise BadRequest(f"{model} is not a valid model ID")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: required non-empty array")
    prior_calls = 0
    history_tool = None
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}]: expected an object with a string 'role'")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):  # noqa: UP038
            raise BadRequest(f"messages[{i}].content: expected a string, an array or null")
        calls = m.get("tool_calls")
        if calls and isinstance(calls, list):
            if m["role"] == "assistant":
                prior_calls += len(calls)
            history_tool = _last_tool_name(calls) or history_tool
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("tools: expected an array")
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise BadRequest(f"tools[{i}]: expected {{type: 'function', function: {{name, "
                                 "parameters}}}")
            if "parameters" in fn and not isinstance(fn["parameters"], dict):
                raise BadRequest(f"tools[{i}].function.parameters: expected an object")
        tools = tools or None
    tool_choice = body.get("tool_choice")
    if tool_choice is not None and tool_choice not in ("none", "auto", "required") and not (
        isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict)
    ):
        raise BadRequest("tool_choice: expected 'none', 'auto', 'required' or "
                         "{type: 'function', function: {name}}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream: expected a boolean")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise BadRequest("max_tokens: expected an integer >= 1")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise BadRequest("stop: expected a string or an array of strings")
    for key in _NUMERIC.intersection(body):
        value = body[key]
        if value is not None and (not isinstance(value, (int, float))  # noqa: UP038
                                  or isinstance(value, bool)):
            raise BadRequest(f"{key}: expected a number")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest("seed: expected an integer")
    thinking, effort, r_max, exclude = _reasoning(body, cfg)
    want = body.get("return_token_ids", False)
    if not isinstance(want, bool):
        raise BadRequest("return_token_ids: expected a boolean")
    return ChatRequest(
        model=served, sort=sort, messages=messages, tools=tools, tool_choice=tool_choice,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False, stream=stream,
        max_tokens=max_tokens, stop=[s for s in stop if s], thinking=thinking, effort=effort,
        reasoning_max_tokens=r_max, exclude_reasoning=exclude,
        provider=parse_preferences(body.get("provider")),
        params={("max_tokens" if k == "max_completion_tokens" else k)
                for k in PARAMETER_NAMES.intersection(body)},
        want_ids=want or ids_header, seed=seed,
        prior_tool_calls=prior_calls, history_tool=history_tool,
    )


def _last_tool_name(calls: list[Any]) -> str | None:
    for call in reversed(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and name:
            return name
    return None


def _served_model(name: str, cfg: SimConfig) -> str | None:
    for m in cfg.models:
        if name == m or name == cfg.dated(m):
            return m
    return None


def _reasoning(body: dict[str, Any], cfg: SimConfig) -> tuple[bool, str | None, int | None, bool]:
    r = body.get("reasoning")
    exclude = body.get("include_reasoning") is False
    if r is None:
        return cfg.default_thinking, None, None, exclude
    if not isinstance(r, dict):
        raise BadRequest("reasoning: expected an object")
    effort = r.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise BadRequest(f"reasoning.effort: expected one of {', '.join(EFFORTS)}")
    r_max = r.get("max_tokens")
    if r_max is not None and (not isinstance(r_max, int) or isinstance(r_max, bool) or r_max < 0):
        raise BadRequest("reasoning.max_tokens: expected an integer >= 0")
    enabled = r.get("enabled")
    if enabled is not None and not isinstance(enabled, bool):
        raise BadRequest("reasoning.enabled: expected a boolean")
    if r.get("exclude") is True:
        exclude = True
    thinking = enabled if enabled is not None else True
    if effort == "none" or r_max == 0:
        thinking = False
    return thinking, effort, r_max or None, exclude
