"""The `hf` renderer: any model with a jinja chat template, rendered the way HF transformers does.

The template comes from the tokenizer (`chat_template.jinja` or the `chat_template` key of
`tokenizer_config.json`) and is rendered in jinja2's ImmutableSandboxedEnvironment with HF's
settings: `trim_blocks`, `lstrip_blocks`, the `loopcontrols` extension, HF's `tojson` filter,
`raise_exception`, `strftime_now`, and a pass-through `{% generation %}` block. The messages
are handed over as transformers 5 does (`serving.template_view`: None-valued keys dropped,
reasoning aliased). Variables: `messages`, `tools`, `documents`, `add_generation_prompt`, the
special tokens (`bos_token`, `eos_token`, ...), and the template switches: `chat_template_kwargs`
when given (exactly what the server gets), else `thinking` / `enable_thinking` from the
renderer's thinking flag.

The loss mask comes from the structure of the render, never from patterns in the text: the
sampled part of an assistant message is render(context + [message]) minus the prefix
render(context, add_generation_prompt=True), cut right after the first stop token (what the
model samples ends there; e.g. the "\\n" ChatML templates write after `<|im_end|>` is not
sampled). A template whose generation prompt is not a prefix of the full render cannot be
split this way and raises RenderError.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Any

from ..conversation import AssistantMessage, Message, ToolCall, message_reasoning
from .base import Renderer, RenderError, Sample, first_difference
from .serving import content_format, parsed_calls, template_view

# Added tokens that end an assistant turn in the common template families. A token only counts
# when the tokenizer has it as an added/special token; the config's eos token always counts.
END_OF_TURN_TOKENS = (
    "<|im_end|>",  # ChatML (Qwen, Yi, ...), Kimi
    "<|eot_id|>",  # Llama 3
    "<|eom_id|>",  # Llama 3.1 tool calls
    "<|end|>",  # Phi-3
    "<end_of_turn>",  # Gemma
    "<|end_of_text|>",
    "<|endoftext|>",
    "<｜end▁of▁sentence｜>",  # DeepSeek
    "</s>",
    "<|return|>",  # gpt-oss
    "<|call|>",
)

# Where no context is given, a completion is rendered after this one message.
DEFAULT_CONTEXT: tuple[Message, ...] = ({"role": "user", "content": ""},)


def hf_tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
              separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """HF transformers' `tojson` filter: json.dumps, no HTML escaping, non-ASCII kept."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@lru_cache(maxsize=16)
def compile_template(source: str):
    """Compile a chat template in HF's sandboxed environment (cached by source)."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}` (HF's assistant-mask marker): renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = hf_tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(f"chat template does not compile: {exc} (line {exc.lineno})") from None


@dataclass
class HFRenderer(Renderer):
    """Renders with the tokenizer's own jinja chat template (or `template` when given)."""

    name: str = field(default="hf", init=False)
    template: str | None = None
    # The template switches exactly as the server gets them (`chat_template_kwargs`); None:
    # `thinking` and `enable_thinking` from the thinking flag.
    chat_template_kwargs: dict[str, Any] | None = None
    # Hand the template tool-call arguments parsed into objects (what vLLM/SGLang do; in a run
    # `[target] serving` does this for the whole history, render.serving). False: as given.
    parse_tool_arguments: bool = False

    def __post_init__(self) -> None:
        source = self.template if self.template is not None else self.tokenizer.chat_template
        if not source:
            raise RenderError(
                f"tokenizer {self.tokenizer.name!r} has no chat template (no chat_template.jinja "
                "and no 'chat_template' in tokenizer_config.json); the 'hf' renderer needs one"
            )
        self.template = source
        self._compiled = compile_template(source)

    # -- text -------------------------------------------------------------------------------
    def render_text(self, messages, tools=None, *, add_generation_prompt: bool) -> str:
        import jinja2

        variables = dict(self._special_variables)
        if self.chat_template_kwargs is None:
            variables.update(thinking=self.thinking, enable_thinking=self.thinking)
        else:
            variables.update(self.chat_template_kwargs)
        variables.update(
            messages=template_view([self._template_message(m) for m in messages]),
            tools=list(tools) if tools else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
        )
        try:
            return self._compiled.render(**variables)
        except jinja2.TemplateError as exc:
            raise RenderError(f"chat template raised: {exc}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            raise RenderError(f"chat template failed on this conversation: {exc!r}") from None

    def content_format(self, serving: str) -> str:
        return content_format(serving, self.template)

    def completion_text(self, message, *, context=None, tools=None) -> str:
        """What the model samples for `message` after `context` (default: one empty user
        message): the full render minus the generation prompt, cut after the stop token."""
        ctx = list(DEFAULT_CONTEXT if context is None else context)
        return self._split(ctx, _as_message(message), tools)[1]

    def sample(self, messages, tools=None) -> Sample:
        if messages and messages[-1].get("role") == "assistant":
            prompt, completion = self._split(list(messages[:-1]), messages[-1], tools)
            return Sample.from_parts(self.tokenizer.encode(prompt),
                                     self.encode_completion(completion))
        return Sample.from_parts(self.prompt_ids(messages, tools), [])

    def _split(self, context: list[Message], message: Message, tools) -> tuple[str, str]:
        prompt = self.render_text(context, tools, add_generation_prompt=True)
        full = self.render_text([*context, message], tools, add_generation_prompt=False)
        if not full.startswith(prompt):
            at = first_difference(prompt, full)
            raise RenderError(
                "the chat template's generation prompt is not a prefix of the render with the "
                f"assistant message (they differ at character {at}: prompt has "
                f"{prompt[at:at + 40]!r}, full render has {full[at:at + 40]!r}), so the sampled "
                "part cannot be told apart"
            )
        return prompt, self._cut_after_stop(full[len(prompt):], message)

    def _cut_after_stop(self, text: str, message: Message | None = None) -> str:
        """The sampled text ends with the template's own stop after the message (what the
        template writes after that, e.g. Qwen's "\n", was never sampled). Stop strings the
        message itself holds (a literal `<|im_end|>` in its content) come first and are kept,
        as the Kimi renderers and the official templates keep them: the rule is the same
        for every renderer, and `specgen tokenize` warns of such samples
        (`render.stray_stop_ids`)."""
        literal = _stop_texts_in(message, self._stop_strings) if message else 0
        at = 0
        while True:
            hits = [(i, s) for s in self._stop_strings if (i := text.find(s, at)) >= 0]
            if not hits:
                return text
            i, stop = min(hits)
            at = i + len(stop)
            if literal <= 0:
                return text[:at]
            literal -= 1

    def _template_message(self, m: Message) -> Message:
        if not isinstance(m, dict):
            raise RenderError(f"a message must be an object, not {type(m).__name__}")
        if m.get("role") != "assistant" or not self.parse_tool_arguments or not m.get("tool_calls"):
            return m
        return {**m, "tool_calls": parsed_calls(m["tool_calls"])}

    # -- tokens -----------------------------------------------------------------------------
    @cached_property
    def _special_variables(self) -> dict[str, Any]:
        cfg = self.tokenizer.config
        out: dict[str, Any] = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                    "cls_token", "mask_token"):
            value = _token_text(cfg.get(key))
            if value is not None:
                out[key] = value
        extra = cfg.get("additional_special_tokens")
        if isinstance(extra, list):
            out["additional_special_tokens"] = [t for t in map(_token_text, extra) if t]
        return out

    @cached_property
    def _stop_strings(self) -> tuple[str, ...]:
        tok = self.tokenizer
        return tuple(tok.id_to_special[i] for i in sorted(self.stop_token_ids))

    @cached_property
    def stop_token_ids(self) -> frozenset[int]:
        tok = self.tokenizer
        ids = {tok.special_tokens[t] for t in END_OF_TURN_TOKENS if t in tok.special_tokens}
        eos = tok.eos_token
        if eos in tok.special_tokens:
            ids.add(tok.special_tokens[eos])
        ids.update(i for i in _generation_config_eos(tok) if i in tok.id_to_special)
        if not ids:
            raise RenderError(
                f"tokenizer {tok.name!r} has no end-of-turn token (no eos_token in "
                "tokenizer_config.json and none of the usual end-of-turn tokens)"
            )
        return frozenset(ids)

    # -- parsing ----------------------------------------------------------------------------
    def parse_completion(self, ids: Sequence[int]) -> AssistantMessage:
        """Best effort: reasoning between `<think>`/`</think>` (when they are tokens of this
        vocabulary; the prompt may have opened `<think>`), Hermes/Qwen `<tool_call>{json}
        </tool_call>` blocks (when those are tokens), everything else is content. Ids from the
        first stop token on are dropped; newlines the templates put around the think block and
        the tool-call JSON are stripped."""
        tok = self.tokenizer
        ids = list(ids)
        stop = next((k for k, i in enumerate(ids) if i in self.stop_token_ids), None)
        if stop is not None:
            ids = ids[:stop]
        reasoning = None
        think, end_think = tok.special_tokens.get("<think>"), tok.special_tokens.get("</think>")
        if end_think is not None and end_think in ids:
            j = ids.index(end_think)
            start = ids.index(think) + 1 if think is not None and think in ids[:j] else 0
            reasoning = tok.decode(ids[start:j]).strip("\n")
            ids = ids[j + 1:]
        text = tok.decode(ids)
        calls: list[ToolCall] = []
        if "<tool_call>" in tok.special_tokens and "</tool_call>" in tok.special_tokens:
            text, calls = _hermes_tool_calls(text)
        content = text.lstrip("\n") if reasoning is not None else text
        return AssistantMessage(content=content.rstrip("\n") if calls else content,
                                reasoning=reasoning, tool_calls=tuple(calls))


def _stop_texts_in(message: Message, stops: Sequence[str]) -> int:
    """How many stop strings the message's own text holds (content, reasoning, calls)."""
    pieces: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        pieces.append(content)
    elif isinstance(content, list):
        pieces += [p.get("text", "") for p in content if isinstance(p, dict)
                   and isinstance(p.get("text"), str)]
    reasoning = message_reasoning(message)
    if reasoning:
        pieces.append(reasoning)
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            pieces.append(fn["arguments"])
    return sum(piece.count(s) for piece in pieces for s in stops)


def _as_message(m: Message | AssistantMessage) -> Message:
    return m.to_openai() if isinstance(m, AssistantMessage) else m


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _generation_config_eos(tok) -> list[int]:
    path = tok.path / "generation_config.json"
    if not path.exists():
        return []
    try:
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (ValueError, OSError, AttributeError):
        return []
    if isinstance(eos, int):
        return [eos]
    return [i for i in eos if isinstance(i, int)] if isinstance(eos, list) else []


def _hermes_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks out of text."""
    calls: list[ToolCall] = []
    rest: list[str] = []
    pos = 0
    while (start := text.find("<tool_call>", pos)) >= 0:
        end = text.find("</tool_call>", start)
        if end < 0:
            break
        try:
            obj = json.loads(text[start + len("<tool_call>"):end])
            name, args = obj["name"], obj.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            break  # not a well-formed call: leave the rest as content
        rest.append(text[pos:start])
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append(ToolCall(id="", name=str(name), arguments=arguments))
        pos = end + len("</tool_call>")
    rest.append(text[pos:])
    return "".join(rest), calls
