"""Token-in answers (`[endpoint] mode = "tokens"`) → `ChatResponse`.

Two local-engine shapes (../shared/reference/openrouter-api.md, "Local engines"):

* vLLM `/v1/completions`: `choices[0].token_ids` (the sampled ids), `finish_reason`,
  `stop_reason` (the matched stop id, or a stop string, or null for EOS), `usage`, and
  `prompt_token_ids` at the top level or in the choice. Streams are the chat SSE framing with
  `token_ids` per chunk, read by the ordinary `StreamParser`.
* SGLang `/generate`: `output_ids`, `meta_info.finish_reason` (`{"type": "stop", "matched":
  id}` or `{"type": "length", ...}`), `meta_info.prompt_tokens` / `completion_tokens`.

The answer carries the ids only (no content, reasoning or tool calls: no parser ran on the
server); `finish_token_answer` puts back a matched stop id a server left out of the ids, so the
ids are exactly what the model sampled.
"""

from __future__ import annotations

from typing import Any

import orjson
from yarl import URL

from .errors import snippet
from .parse import _failure, _ids, _invalid, _model, _opt_str
from .types import ChatResponse
from .usage import clean_usage

TOKEN_APIS = ("vllm", "sglang")


def token_url(base_url: str, api: str) -> str:
    """The token-in endpoint of a base URL: `<base_url>/completions` (vLLM), or `/generate`
    at the server's root (SGLang's native API sits beside `/v1`, not under it)."""
    if api == "sglang":
        return str(URL(base_url).origin()) + "/generate"
    return base_url.rstrip("/") + "/completions"


def parse_token_completion(data: bytes, api: str) -> ChatResponse:
    """A non-stream token-in body of `api` (`vllm` or `sglang`)."""
    if not data or not data.strip():
        raise _invalid("empty response body")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _invalid(f"response body is not valid JSON: {snippet(data, 120)}") from None
    if not isinstance(obj, dict):
        raise _invalid(f"response body must be a JSON object, got {type(obj).__name__}")
    if obj.get("error") or obj.get("object") == "error":
        raise _failure("error_in_body", obj.get("error") or obj, obj.get("usage"), None)
    resp = _sglang(obj) if api == "sglang" else _vllm(obj)
    return finish_token_answer(resp)


def _vllm(obj: dict[str, Any]) -> ChatResponse:
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _invalid("response has no choices[0] object")
    choice = choices[0]
    finish = _opt_str(choice.get("finish_reason"))
    if choice.get("error") or finish == "error":
        raise _failure("error_in_body", choice.get("error") or True, obj.get("usage"), None)
    ids = choice.get("token_ids")
    if ids is None:
        raise _invalid("choices[0].token_ids missing: the server did not return the sampled "
                       "ids (vLLM needs return_token_ids, v0.10.2 or later)")
    prompt = obj.get("prompt_token_ids")
    if prompt is None:
        prompt = choice.get("prompt_token_ids")
    usage, usage_warnings = clean_usage(obj.get("usage"))
    return ChatResponse(
        content=None, reasoning=None, reasoning_field=None, tool_calls=[],
        finish_reason=finish, native_finish_reason=None, provider=None,
        model=_model(obj.get("model")), id=_opt_str(obj.get("id")), usage=usage,
        usage_warnings=usage_warnings,
        prompt_token_ids=None if prompt is None else _ids(prompt, "prompt_token_ids").tolist(),
        completion_token_ids=_ids(ids, "choices[0].token_ids").tolist(),
        stop_reason=_stop_reason(choice.get("stop_reason")))


def _sglang(obj: dict[str, Any]) -> ChatResponse:
    ids = obj.get("output_ids")
    if ids is None:
        raise _invalid("output_ids missing from the /generate answer")
    meta = obj.get("meta_info")
    if not isinstance(meta, dict):
        raise _invalid("meta_info missing from the /generate answer")
    reason = meta.get("finish_reason")
    finish, matched = None, None
    if isinstance(reason, dict):
        kind = reason.get("type")
        finish = kind if kind in ("stop", "length") else (
            "error" if kind == "abort" else _opt_str(kind))
        matched = _stop_reason(reason.get("matched"))
    elif isinstance(reason, str):
        finish = reason
    if finish == "error":
        raise _failure("error_in_body", reason.get("message") if isinstance(reason, dict)
                       else True, None, None)
    usage: dict[str, Any] = {}
    for key in ("prompt_tokens", "completion_tokens"):
        if isinstance(meta.get(key), int) and not isinstance(meta.get(key), bool):
            usage[key] = meta[key]
    if usage:
        usage["total_tokens"] = sum(usage.values())
    return ChatResponse(
        content=None, reasoning=None, reasoning_field=None, tool_calls=[],
        finish_reason=finish, native_finish_reason=None, provider=None, model=None,
        id=_opt_str(meta.get("id")), usage=usage, prompt_token_ids=None,
        completion_token_ids=_ids(ids, "output_ids").tolist(), stop_reason=matched)


def _stop_reason(value: Any) -> int | str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    return value if isinstance(value, str) else None


def finish_token_answer(resp: ChatResponse) -> ChatResponse:
    """Append the matched stop id when the server reported it but left it out of the ids
    (SGLang always; vLLM without include_stop_str_in_output)."""
    ids = resp.completion_token_ids
    stop = resp.stop_reason
    if (ids is not None and resp.finish_reason == "stop" and isinstance(stop, int)
            and (not ids or ids[-1] != stop)):
        ids.append(stop)
        resp.stop_appended = True
    return resp
