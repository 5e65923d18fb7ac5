"""How the serving stack turns a chat request's history into the prompt the model sees.

`[target] serving` names the stack (docs/renderers.md, "Serving dialects"):

* `transformers` — `apply_chat_template` on the messages as given: history tool-call
  `arguments` strings are written verbatim;
* `vllm`, `sglang` — both parse every history tool call's `arguments` string into an object
  before the template runs, and the template writes it back with `tojson` (`{"a": 1}`:
  `", "` / `": "` separators, keys in order, non-ASCII kept), so the model sees that text.

Object arguments render as `tojson` writes them in every dialect; what the model sampled (the
completion) is always verbatim.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

SERVING_STACKS = ("transformers", "vllm", "sglang")
PARSES_ARGUMENTS = frozenset({"vllm", "sglang"})

Message = dict[str, Any]


def reserialized_history(messages: Sequence[Message]) -> list[Message] | None:
    """The history as a vLLM/SGLang stack feeds it to the template: each assistant tool
    call's `arguments` parsed and written back as `tojson` does (`json.dumps`, default
    separators, keys in order, non-ASCII kept); None when that changes nothing."""
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


def history_as_served(messages: Sequence[Message], serving: str) -> list[Message] | None:
    """The prompt messages the stack `serving` renders, when they differ from `messages`
    (None: the same)."""
    if serving in PARSES_ARGUMENTS:
        return reserialized_history(messages)
    return None
