"""A chat-completions request body, validated into what the simulator needs.

Invalid bodies raise `BadRequest` with a message naming the field (answered with HTTP 400).
Fields the simulator has no use for (temperature, top_p, ...) are type-checked lightly and
otherwise ignored, as a provider ignores what it does not support.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import DEFAULT_SUPPORTED_PARAMETERS, SimConfig
from .plant import planted
from .routing import VARIANT_SORT, BadRequest, parse_preferences

# Body keys that count as "parameters" for provider.require_parameters.
PARAMETER_NAMES = frozenset(DEFAULT_SUPPORTED_PARAMETERS) | {"max_completion_tokens"}
_NUMERIC = frozenset({"temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                      "presence_penalty", "repetition_penalty"})
# OpenRouter-only fields the simulator accepts and ignores (type-checked): context compression
# (`transforms`, `plugins`) and model fallback (`models`).
_IGNORED_LISTS = frozenset({"transforms", "plugins", "models"})
_CHECKED = _NUMERIC | _IGNORED_LISTS
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
    # Set by the server when quirk tool_calls_in_content applies (the request has no tools):
    # the request then also serves as the model's `GenRequest`.
    force_raw_tool_call: bool = False
    after_tool_result: bool = False  # the last message is a tool result
    # Set by the server from the answering provider (GenRequest's fields of the same names).
    call_rate: float | None = None
    schema_violation_rate: float = 0.0
    tools_ignored: bool = False  # quirk tools_ignored: no declaration, no tool parser
    planted: tuple[str, str] | None = None  # a `[[sim:...]]` directive (sim.plant)


def parse_chat_request(body: Any, cfg: SimConfig, *, ids_header: bool = False) -> ChatRequest:
    """Validate a parsed request body (raises BadRequest naming the field)."""
    return ChatParser(cfg).parse(body, ids_header=ids_header)


def body_and_model(body: Any) -> tuple[Any, str]:
    """(`body.get`, the `model` string) of a request body; BadRequest naming what is wrong.
    Bodies come from orjson, so JSON types are exact: `type(x) is str` is isinstance."""
    if type(body) is not dict:
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if type(model) is not str or not model:
        raise BadRequest("model: required string")
    return body.get, model


class ChatParser:
    """`parse_chat_request` with what depends only on the config worked out once."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self._served: dict[str, str] = {}
        for m in reversed(cfg.models):  # the first served model wins, as in a linear search
            self._served[cfg.dated(m)] = m
            self._served[m] = m

    def parse(self, body: Any, *, ids_header: bool = False) -> ChatRequest:
        get, model = body_and_model(body)
        sort = None
        base = model
        if ":" in model:
            base, _, variant = model.partition(":")
            if variant:
                if variant not in VARIANT_SORT:
                    raise BadRequest(f"model: unknown variant ':{variant}' (supported: "
                                     f"{', '.join(':' + v for v in VARIANT_SORT)})")
                sort = VARIANT_SORT[variant]
        served = self._served.get(base)
        if served is None:
            raise BadRequest(f"{model} is not a valid model ID")
        messages = get("messages")
        if type(messages) is not list or not messages:
            raise BadRequest("messages: required non-empty array")
        prior_calls = 0
        history_tool = None
        for i, m in enumerate(messages):
            if type(m) is not dict or type(m.get("role")) is not str:
                raise BadRequest(f"messages[{i}]: expected an object with a string 'role'")
            content = m.get("content")
            if content is not None and type(content) is not str and type(content) is not list:
                raise BadRequest(f"messages[{i}].content: expected a string, an array or null")
            calls = m.get("tool_calls")
            if calls and type(calls) is list:
                if m["role"] == "assistant":
                    prior_calls += len(calls)
                history_tool = _last_tool_name(calls) or history_tool
        tools = get("tools")
        if tools is not None:
            if type(tools) is not list:
                raise BadRequest("tools: expected an array")
            for i, t in enumerate(tools):
                fn = t.get("function") if type(t) is dict else None
                if type(fn) is not dict or type(fn.get("name")) is not str or not fn["name"]:
                    raise BadRequest(f"tools[{i}]: expected {{type: 'function', function: {{name, "
                                     "parameters}}}")
                if "parameters" in fn and type(fn["parameters"]) is not dict:
                    raise BadRequest(f"tools[{i}].function.parameters: expected an object")
            tools = tools or None
        tool_choice = get("tool_choice")
        if tool_choice is not None and tool_choice not in ("none", "auto", "required") and not (
            type(tool_choice) is dict and type(tool_choice.get("function")) is dict
        ):
            raise BadRequest("tool_choice: expected 'none', 'auto', 'required' or "
                             "{type: 'function', function: {name}}")
        stream = get("stream", False)
        if type(stream) is not bool:
            raise BadRequest("stream: expected a boolean")
        max_tokens = get("max_tokens") if "max_tokens" in body else get("max_completion_tokens")
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            raise BadRequest("max_tokens: expected an integer >= 1")
        stop = get("stop")
        if stop is None:
            stop = []
        elif type(stop) is str:
            stop = [stop] if stop else []
        elif type(stop) is list and all(type(x) is str for x in stop):
            stop = [x for x in stop if x]
        else:
            raise BadRequest("stop: expected a string or an array of strings")
        for key in _CHECKED.intersection(body):
            value = body[key]
            if key in _IGNORED_LISTS:
                _check_ignored_list(key, value)
            elif value is not None and type(value) is not int and type(value) is not float:
                raise BadRequest(f"{key}: expected a number")
        seed = get("seed")
        if seed is not None and type(seed) is not int:
            raise BadRequest("seed: expected an integer")
        thinking, effort, r_max, exclude = _reasoning(body, self.cfg)
        want = get("return_token_ids", False)
        if type(want) is not bool:
            raise BadRequest("return_token_ids: expected a boolean")
        provider = parse_preferences(get("provider"))
        # Only provider.require_parameters looks at which parameters were sent.
        params = {("max_tokens" if k == "max_completion_tokens" else k)
                  for k in PARAMETER_NAMES.intersection(body)} if provider else _NO_PARAMS
        return ChatRequest(
            served, sort, messages, tools, tool_choice, get("parallel_tool_calls") is not False,
            stream, max_tokens, stop, thinking, effort, r_max, exclude, provider, params,
            want or ids_header, seed, prior_calls, history_tool,
            after_tool_result=messages[-1]["role"] == "tool", planted=planted(messages),
        )


_NO_PARAMS: frozenset[str] = frozenset()
_ITEM_TYPES = {"transforms": (str, "strings"), "plugins": (dict, "objects"),
               "models": (str, "strings")}


def _check_ignored_list(key: str, value: Any) -> None:
    """`transforms` / `models`: arrays of strings; `plugins`: an array of objects (null is
    accepted as absent)."""
    if value is None:
        return
    item_type, what = _ITEM_TYPES[key]
    if type(value) is not list:
        raise BadRequest(f"{key}: expected an array of {what}")
    for i, item in enumerate(value):
        if type(item) is not item_type:
            raise BadRequest(f"{key}[{i}]: expected {'a string' if item_type is str else 'an object'}")


def _last_tool_name(calls: list[Any]) -> str | None:
    for call in reversed(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and name:
            return name
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
