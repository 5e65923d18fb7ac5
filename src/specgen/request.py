"""The exact JSON body sent for one turn (docs/datasets.md, "Request body").

Two dialects, chosen by `endpoint.dialect`, or (`auto`) from the base URL:

* `openrouter` (OpenRouter and the built-in simulator, `base_url = "sim"`): `reasoning` object,
  `provider` routing object, `usage: {"include": true}`, `transforms: []` (context compression
  off); history assistant turns carry their reasoning in both `reasoning_content` and
  `reasoning`. A `models` fallback list is never sent.
* `openai` (anything else: vLLM, SGLang, other OpenAI-compatible servers): no OpenRouter-only
  fields; thinking on/off becomes `chat_template_kwargs: {"thinking": x, "enable_thinking": x}`
  (Kimi templates read `thinking`, Qwen-style ones `enable_thinking`) with
  `[target] chat_template_kwargs` over them; history reasoning goes in both `reasoning` (what
  vLLM reads) and `reasoning_content` (what SGLang reads).

Tools always travel as the `tools` parameter, never as system text. The body never holds
secrets: keys go in headers (the client's job).

`build_token_request` is the token-in body (`[endpoint] mode = "tokens"`): our renderer's
prompt ids for vLLM's `/v1/completions` or SGLang's `/generate`; no template runs on the server.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlparse

from .config import DatasetConfig, RunConfig, is_openrouter_url
from .conversation import Message, content_text, message_reasoning
from .planner import TurnRequest
from .render import template_switches
from .sampling import SampleSettings, sample_settings

PROTECTED = frozenset({"model", "messages", "tools"})  # `sampling.extra` cannot replace these
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed")  # sent when set


def dialect(base_url: str) -> str:
    """`openrouter` for OpenRouter and the simulator, else `openai`."""
    if base_url == "sim":
        return "openrouter"
    return "openrouter" if is_openrouter_url(base_url) else "openai"


LOCAL_SUFFIXES = (".local", ".internal", ".localdomain", ".lan", ".svc", ".cluster.local")


def is_local_url(base_url: str) -> bool:
    """Whether a base URL names a machine of one's own: localhost, a loopback, private or
    link-local address, a single-label host name (`vllm-0`) or a local-only domain."""
    if base_url == "sim":
        return False
    host = (urlparse(base_url).hostname or "").lower().rstrip(".")
    if not host:
        return False
    if host == "localhost" or host.endswith(".localhost") or host.endswith(LOCAL_SUFFIXES):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "." not in host
    return ip.is_loopback or ip.is_private or ip.is_link_local


def local_engines(base_urls: Iterable[str]) -> bool:
    """Every base URL is a local server (so vLLM/SGLang-style fields are safe to send)."""
    urls = list(base_urls)
    return bool(urls) and all(is_local_url(u) for u in urls)


def request_dialect(cfg: RunConfig, base_url: str | None = None) -> str:
    """`endpoint.dialect` when set to openrouter/openai, else from the base URL."""
    mode = getattr(cfg.endpoint, "dialect", "auto")
    if mode in ("openrouter", "openai"):
        return mode
    return dialect(base_url or cfg.endpoint.base_url[0])


def sampling_fields(cfg: RunConfig, st: SampleSettings) -> dict[str, Any]:
    """The numeric sampling fields sent (temperature, top_p from the sample's settings; top_k,
    min_p, seed from [sampling]), those that are set."""
    s = cfg.sampling
    values = {"temperature": st.temperature, "top_p": st.top_p, "top_k": s.top_k,
              "min_p": s.min_p, "seed": s.seed}
    return {k: values[k] for k in SAMPLING_KEYS if values[k] is not None}


def build_request(
    cfg: RunConfig, ds: DatasetConfig, req: TurnRequest, *, base_url: str | None = None,
    settings: SampleSettings | None = None,
) -> dict[str, Any]:
    """The exact JSON body sent for this turn (no secrets in it).

    `base_url` picks the dialect when `endpoint.dialect` is auto (default: the first base URL).
    `settings`: the sample's sampling (specgen.sampling; default: the dataset's, drawn for an
    anonymous conversation).
    """
    kind = request_dialect(cfg, base_url)
    s = cfg.sampling
    st = settings or sample_settings(cfg, ds, "", req.turn)
    body: dict[str, Any] = {
        "model": cfg.target.model,
        "messages": [request_message(m, kind) for m in req.messages],
    }
    if req.tools:
        body["tools"] = req.tools
    body["max_tokens"] = cfg.max_tokens_for(ds)
    body.update(sampling_fields(cfg, st))
    if s.stop is not None:
        body["stop"] = s.stop
    if kind == "openrouter":
        body["reasoning"] = reasoning_object(st.reasoning)
        if cfg.endpoint.provider:
            body["provider"] = cfg.endpoint.provider
        body["usage"] = {"include": True}
        body["transforms"] = []  # no context compression: the prompt must reach the model whole
    else:
        body["chat_template_kwargs"] = template_switches(st.thinking,
                                                         cfg.target.chat_template_kwargs)
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


def build_token_request(
    cfg: RunConfig, ds: DatasetConfig, prompt_ids: Sequence[int], stop_ids: Iterable[int],
    settings: SampleSettings | None = None,
) -> dict[str, Any]:
    """The token-in body for `endpoint.token_api` (docs/client.md, "Token-in mode").

    vLLM `/v1/completions`: `prompt` is the id list; the stop ids are asked to stay in the
    returned ids (`include_stop_str_in_output`), special tokens in the text. SGLang `/generate`:
    `input_ids` and a `sampling_params` object. Both ask for the ids, never for a template."""
    s = cfg.sampling
    stops = sorted(int(i) for i in stop_ids)
    max_tokens = cfg.max_tokens_for(ds)
    params = sampling_fields(cfg, settings or sample_settings(cfg, ds, "", 0))
    if cfg.endpoint.token_api_name == "sglang":
        sampling: dict[str, Any] = {"max_new_tokens": max_tokens, **params,
                                    "stop_token_ids": stops, "skip_special_tokens": False,
                                    "no_stop_trim": True}
        sampling.pop("seed", None)  # SGLang's per-request seed is `sampling_seed`
        if s.seed is not None:
            sampling["sampling_seed"] = s.seed
        if s.stop:
            sampling["stop"] = list(s.stop)
        body: dict[str, Any] = {"input_ids": list(prompt_ids), "sampling_params": sampling,
                                "stream": False}
    else:
        body = {"model": cfg.target.model, "prompt": list(prompt_ids),
                "max_tokens": max_tokens, **params, "stop_token_ids": stops,
                "include_stop_str_in_output": True, "skip_special_tokens": False,
                "spaces_between_special_tokens": False, "return_token_ids": True,
                "stream": bool(cfg.endpoint.stream)}
        if s.stop:
            body["stop"] = list(s.stop)
        if cfg.endpoint.stream:
            body["stream_options"] = {"include_usage": True}
    for key, value in (s.extra or {}).items():
        if key not in PROTECTED and key not in TOKEN_PROTECTED:
            body[key] = value
    return body


TOKEN_PROTECTED = frozenset({"prompt", "input_ids", "return_token_ids"})


def with_max_tokens(body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """A copy of a chat or token-in body with another completion limit (SGLang's lives in
    `sampling_params.max_new_tokens`)."""
    if "input_ids" in body and isinstance(body.get("sampling_params"), dict):
        return {**body, "sampling_params": {**body["sampling_params"],
                                            "max_new_tokens": max_tokens}}
    return {**body, "max_tokens": max_tokens}


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
            # both names: OpenRouter and vLLM read `reasoning`, SGLang `reasoning_content`
            out["reasoning_content"] = out["reasoning"] = reasoning
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
