"""One conversation through specgen's native Kimi renderer and the official template.

Shared by tests/test_official_kimi_random.py (a seeded slice) and bench/official_kimi_diff.py
(thousands). `difference(...)` returns None when specgen's ids equal the official template's
(or both refuse the conversation), else a short description of the first difference.

Compared: the prompt before every assistant message and at an open end, and the sample of the
final assistant turn where the template renders it as it was sampled (a tool-call turn; any
turn with K2.5 thinking off; every turn on K2-Instruct). The official side encodes the prompt
with the tokenizer's own encode and the completion as sampled (`OfficialKimi.sample_ids`).

Documented choices (docs/renderers.md, "Checked against the official templates"):
* K2-Thinking: the tool declaration is compact JSON (the llama.cpp copy of the template writes
  `tojson()` with spaces): the official text is compared with its JSON written compact;
* K2-Instruct: the conversations have no tool calls, tool results or names (specgen follows the
  later K2 templates there) and no null content (the original template fails on it).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from official_kimi import OfficialKimi, deep_sorted


def _fix_tools_json(tools) -> Callable[[str], str]:
    if not tools:
        return lambda text: text
    spaced = json.dumps(deep_sorted(list(tools)), ensure_ascii=False)
    compact = json.dumps(deep_sorted(list(tools)), ensure_ascii=False, separators=(",", ":"))
    return lambda text: text.replace(spaced, compact)


def _official(official: OfficialKimi, fix, msgs, tools, kw, *, prompt: bool) -> list[int]:
    if prompt:
        return official.encode(fix(official.render(msgs, tools, add_generation_prompt=True, **kw)))
    head = fix(official.render(msgs[:-1], tools, add_generation_prompt=True, **kw))
    full = fix(official.render(msgs, tools, add_generation_prompt=False, **kw))
    if not full.startswith(head):
        raise AssertionError("the generation prompt is not a prefix of the full render")
    return official.encode(head) + official.encode_sampled(full[len(head):])


def difference(native, official: OfficialKimi, msgs, tools, *, variant: str,
               thinking: bool = True) -> str | None:
    kw = {} if thinking or variant != "kimi-k2.5" else {"thinking": False}
    fix = _fix_tools_json(tools) if variant == "kimi-k2-thinking" else (lambda t: t)
    checks: list[tuple[str, Callable[[], list[int]], Callable[[], list[int]]]] = []
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            ctx = msgs[:i]
            checks.append((f"prompt before message {i}",
                           lambda ctx=ctx: native.prompt_ids(ctx, tools),
                           lambda ctx=ctx: _official(official, fix, ctx, tools, kw, prompt=True)))
    last = msgs[-1]
    if last["role"] != "assistant":
        checks.append(("prompt at the open end", lambda: native.prompt_ids(msgs, tools),
                       lambda: _official(official, fix, msgs, tools, kw, prompt=True)))
    elif (variant == "kimi-k2-instruct" or bool(last.get("tool_calls"))
          or (variant == "kimi-k2.5" and not thinking)):
        checks.append(("sample of the final turn", lambda: native.sample(msgs, tools).input_ids,
                       lambda: _official(official, fix, msgs, tools, kw, prompt=False)))
    for what, ours, theirs in checks:
        got, want, errors = None, None, []
        try:
            got = ours()
        except ValueError as exc:  # RenderError
            errors.append(f"specgen refused: {exc}")
        try:
            want = theirs()
        except Exception as exc:  # noqa: BLE001 - whatever the template raises
            errors.append(f"template failed: {type(exc).__name__}: {exc}")
        if got is None and want is None:
            return None  # both refuse this conversation
        if errors:
            return f"{what}: " + "; ".join(errors)
        if got != want:
            at = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                      min(len(got), len(want)))
            return f"{what}: ids differ at {at} of {len(got)}/{len(want)}"
    return None
