"""Native renderers for the Kimi K2 family (K2.5, K2-Thinking, K2-Instruct).

Written from ../shared/reference/kimi-k2-format.md (see docs/renderers.md). Every message is
`ROLE name <|im_middle|> body <|im_end|>` with no separator; the whole render is one string
that the tokenizer encodes with all special tokens allowed, exactly as the serving stack does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..conversation import AssistantMessage, Message, Tool, ToolCall, message_reasoning
from .base import Renderer, RenderError
from .kimi_tools import deep_sort, kimi_k25_tool_declaration, tools_json  # noqa: F401

IM_END = "<|im_end|>"
IM_USER = "<|im_user|>"
IM_ASSISTANT = "<|im_assistant|>"
IM_SYSTEM = "<|im_system|>"
IM_MIDDLE = "<|im_middle|>"
THINK = "<think>"
END_THINK = "</think>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_ARG = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
MEDIA_IMAGE = "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>\n"
# K2-Thinking's template writes `<|media_start|>` (plain text in this vocabulary: the model has
# no vision) and also takes a part with an `image`/`image_url` key as an image.
K2_THINKING_MEDIA_IMAGE = "<|media_start|>image<|media_content|><|media_pad|><|media_end|>\n"

ROLE_TOKEN = {"user": IM_USER, "assistant": IM_ASSISTANT}

K2_THINKING_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."
K2_INSTRUCT_SYSTEM = "You are a helpful assistant"
# [unsure] K2.5 has no default system prompt (4 sources; 1 shows K2_THINKING_SYSTEM). Set this
# to K2_THINKING_SYSTEM to inject it when the first message is not a system message.
K25_DEFAULT_SYSTEM: str | None = None


def content_with_media(content, media_image: str = MEDIA_IMAGE, image_keys: bool = False) -> str:
    """Message content as template text: text parts concatenated, images as `media_image`
    (a part is an image by its type, or with `image_keys` also by an image/image_url key).

    A bare string inside list content has no `type` or `text` for the templates to read: K2.5
    writes nothing for it; K2-Thinking and K2-Instruct (`image_keys`) test `'image' in part`,
    a substring test on a string, so one containing "image" becomes the media placeholder."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RenderError(f"message content must be a string or a list of parts, not {type(content).__name__}")
    out = []
    for part in content:
        if isinstance(part, str):
            if image_keys and "image" in part:
                out.append(media_image)
        elif not isinstance(part, dict):
            raise RenderError(f"content part must be an object, not {type(part).__name__}")
        elif part.get("type") in ("image", "image_url") or image_keys and (
                "image" in part or "image_url" in part):
            out.append(media_image)
        elif part.get("type") in ("video", "video_url") or "video" in part or "video_url" in part:
            # K2.5 expands videos into frames with its processor; the ids are not knowable here.
            raise RenderError("video content parts are not supported by the Kimi renderers")
        else:
            out.append(str(part.get("text", "")))
    return "".join(out)


@dataclass
class KimiRenderer(Renderer):
    """Kimi K2.5 (default). Subclasses switch the few places where the variants differ."""

    name: str = field(default="kimi-k2.5", init=False)
    # Variant switches (see the module docstring of each subclass).
    has_thinking: bool = field(default=True, init=False)
    prompt_opens_think: bool = field(default=True, init=False)  # K2.5: prompt ends in <think>
    # Read when the renderer is built, so the module switch K25_DEFAULT_SYSTEM takes effect.
    default_system: str | None = field(default_factory=lambda: K25_DEFAULT_SYSTEM, init=False)
    media_image: str = field(default=MEDIA_IMAGE, init=False)
    image_keys: bool = field(default=False, init=False)  # an image/image_url key marks an image

    # Roles that get a `ROLE name <|im_middle|>` header (None: every role).
    header_roles: frozenset[str] | None = field(default=None, init=False)

    # The template loops over `message['content']` (K2-Instruct) or over a variable set from
    # it (K2.5, K2-Thinking): vLLM hands list content as parts only in the first case; SGLang
    # always, as every Kimi template mentions images.
    loops_over_content: bool = field(default=False, init=False)

    def content_text(self, content) -> str:
        return content_with_media(content, self.media_image, self.image_keys)

    def assistant_message(self, m: Message | AssistantMessage) -> AssistantMessage:
        """An assistant message as this template sees it (its own media rule for images)."""
        if isinstance(m, AssistantMessage):
            return m
        return _assistant(m, self.content_text)

    def content_format(self, serving: str) -> str:
        return "openai" if serving == "sglang" or self.loops_over_content else "string"

    # -- text -------------------------------------------------------------------------------
    def tool_declaration(self, tools: Sequence[Tool]) -> str:
        """Body of the `tool_declare` message (K2.5: TypeScript, JSON when that fails)."""
        return kimi_k25_tool_declaration(tools)

    def render_text(self, messages, tools=None, *, add_generation_prompt: bool) -> str:
        out: list[str] = []
        if tools:
            out.append(f"{IM_SYSTEM}tool_declare{IM_MIDDLE}{self.tool_declaration(tools)}{IM_END}")
        if self.default_system is not None and (
            not messages or messages[0].get("role") != "system"
        ):
            out.append(f"{IM_SYSTEM}system{IM_MIDDLE}{self.default_system}{IM_END}")
        last_plain = -1  # last assistant message without tool calls: history before it is dropped
        for i, m in enumerate(messages):
            if m.get("role") == "assistant" and not m.get("tool_calls"):
                last_plain = i
        for i, m in enumerate(messages):
            out.append(self._message_text(m, keep_reasoning=i > last_plain))
        if add_generation_prompt:
            out.append(self.generation_prompt())
        return "".join(out)

    def generation_prompt(self) -> str:
        head = f"{IM_ASSISTANT}assistant{IM_MIDDLE}"
        if not self.has_thinking or not self.prompt_opens_think:
            return head
        return head + (THINK if self.thinking else THINK + END_THINK)

    def _message_text(self, m: Message, *, keep_reasoning: bool) -> str:
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise RenderError(f"message has no role: {str(m)[:80]}")
        name = m.get("name") or role
        head = f"{ROLE_TOKEN.get(role, IM_SYSTEM)}{name}{IM_MIDDLE}"
        if self.header_roles is not None and role not in self.header_roles:
            head = ""  # K2-Instruct's template writes no header for other roles (developer…)
        if role == "assistant":
            return head + self._assistant_body(m, keep_reasoning=keep_reasoning) + IM_END
        if role == "tool":
            return head + self.tool_result_body(m) + IM_END
        return head + self.content_text(m.get("content")) + IM_END

    def tool_result_body(self, m: Message) -> str:
        # One plain-text piece: header and content are joined before encoding.
        return f"## Return of {m.get('tool_call_id') or ''}\n{self.content_text(m.get('content'))}"

    def _assistant_body(self, m: Message | AssistantMessage, *, keep_reasoning: bool) -> str:
        msg = self.assistant_message(m)
        body = msg.content + tool_call_section(msg.tool_calls)
        if not self.has_thinking:
            return body
        reasoning = (msg.reasoning or "") if keep_reasoning and self.thinking else ""
        return f"{THINK}{reasoning}{END_THINK}{body}"

    def completion_text(self, message, *, context=None, tools=None) -> str:
        # Kimi renders an assistant message the same whatever came before it.
        msg = self.assistant_message(message)
        body = msg.content + tool_call_section(msg.tool_calls) + IM_END
        if not self.has_thinking:
            return body
        reasoning = msg.reasoning or ""
        if self.prompt_opens_think:
            # The prompt already holds `<think>` (thinking on) or `<think></think>` (off).
            return f"{reasoning}{END_THINK}{body}" if self.thinking else body
        return f"{THINK}{reasoning}{END_THINK}{body}"  # K2-Thinking opens <think> itself

    def completion_variants(self, message, *, context=None, tools=None) -> dict[str, str]:
        """Every form the model may have sampled for this assistant message, by name; the
        canonical one (`completion_text`) first. The API answer is the same for all of them,
        only the count witness can tell them apart (docs/renderers.md, "What the model
        samples"):

        * `no_section_end` — the last call closed and the turn ended without
          `<|tool_calls_section_end|>` (no Kimi tool parser requires it);
        * `no_think_end` — a reasoning turn with no content opened the tool-call section
          without `</think>` (the stacks' Kimi reasoning parsers end reasoning there);
        * `no_think_end+no_section_end` — both.
        """
        msg = self.assistant_message(message)
        canonical = self.completion_text(msg)
        out = {"canonical": canonical}
        if not msg.tool_calls:
            return out
        end = SECTION_END + IM_END
        out["no_section_end"] = canonical[: -len(end)] + IM_END
        think_end = f"{END_THINK}{SECTION_BEGIN}"
        if (self.has_thinking and self.thinking and msg.reasoning and not msg.content
                and think_end in canonical):
            at = canonical.rindex(think_end)
            for name in ("canonical", "no_section_end"):
                text = out[name]
                key = "no_think_end" if name == "canonical" else "no_think_end+no_section_end"
                out[key] = text[:at] + text[at + len(END_THINK):]
        return out

    # -- parsing ----------------------------------------------------------------------------
    @property
    def stop_token_ids(self) -> frozenset[int]:
        return frozenset({self.tokenizer.token_id(IM_END)})

    def parse_completion(self, ids: Sequence[int]) -> AssistantMessage:
        """Sampled ids -> AssistantMessage. Works on ids, so text that merely looks like a
        marker is never mistaken for one."""
        tok = self.tokenizer
        pieces = _split_special(tok, ids)
        reasoning: str | None = None
        in_reasoning = self.has_thinking and self.thinking and self.prompt_opens_think
        if in_reasoning:
            reasoning = ""
        content: list[str] = []
        calls: list[ToolCall] = []
        state = "reasoning" if in_reasoning else "content"
        call_id: list[str] = []
        call_args: list[str] = []
        for special, text in pieces:
            if special is None:
                if state == "reasoning":
                    reasoning = (reasoning or "") + text
                elif state == "content":
                    content.append(text)
                elif state == "call_id":
                    call_id.append(text)
                elif state == "call_args":
                    call_args.append(text)
                elif state == "done":
                    raise RenderError(f"text after {IM_END} in completion: {text[:40]!r}")
                else:
                    # Text between tool calls inside a section is not part of the format.
                    raise RenderError(f"unexpected text inside tool-call section: {text[:40]!r}")
                continue
            if special == THINK and state == "content" and not content and reasoning is None:
                state, reasoning = "reasoning", ""
            elif special == END_THINK and state == "reasoning":
                state = "content"
            elif special == SECTION_BEGIN and state in ("content", "reasoning"):
                # In reasoning: the model opened the section without `</think>` (the stacks'
                # Kimi reasoning parsers end reasoning there too).
                state = "section"
            elif special == CALL_BEGIN and state == "section":
                state, call_id, call_args = "call_id", [], []
            elif special == CALL_ARG and state == "call_id":
                state = "call_args"
            elif special == CALL_END and state == "call_args":
                cid = "".join(call_id)
                calls.append(ToolCall(id=cid, name=tool_name_from_id(cid), arguments="".join(call_args)))
                state = "section"
            elif special == SECTION_END and state == "section":
                state = "after_section"
            elif special == IM_END and state in ("reasoning", "content", "section", "after_section"):
                # "section": the turn ended without `<|tool_calls_section_end|>`
                state = "done"
            elif state == "reasoning":
                reasoning = (reasoning or "") + special  # control text the model wrote
            elif state == "content":
                content.append(special)
            elif state == "call_args" and special != IM_END:
                call_args.append(special)  # arguments are free text up to <|tool_call_end|>
            else:
                raise RenderError(f"unexpected {special} in completion (state {state})")
        return AssistantMessage(content="".join(content), reasoning=reasoning, tool_calls=tuple(calls))


@dataclass
class KimiK2ThinkingRenderer(KimiRenderer):
    """K2-Thinking: JSON tool declaration, default system prompt, prompt ends at <|im_middle|>.

    The model always opens `<think>` itself, so there is no thinking-off mode: `thinking` is
    always True for this renderer.
    """

    name: str = field(default="kimi-k2-thinking", init=False)
    prompt_opens_think: bool = field(default=False, init=False)
    default_system: str | None = field(default=K2_THINKING_SYSTEM, init=False)
    media_image: str = field(default=K2_THINKING_MEDIA_IMAGE, init=False)
    image_keys: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        self.thinking = True

    def tool_declaration(self, tools):
        return tools_json(tools)


@dataclass
class KimiK2InstructRenderer(KimiRenderer):
    """K2-Instruct: no thinking, JSON tool declaration, default system prompt.

    The tool JSON uses HF `tojson`'s default separators (", ", ": "), as the K2-Instruct
    template in that model's tokenizer_config.json writes `tools | tojson` (the reference doc's
    compact form belongs to the later K2 templates); `tool_json_separators` switches it.
    """

    name: str = field(default="kimi-k2-instruct", init=False)
    has_thinking: bool = field(default=False, init=False)
    default_system: str | None = field(default=K2_INSTRUCT_SYSTEM, init=False)
    # its template: `<|media_start|>` as in K2-Thinking, but no newline after the image
    media_image: str = field(default=K2_THINKING_MEDIA_IMAGE.rstrip("\n"), init=False)
    image_keys: bool = field(default=True, init=False)
    loops_over_content: bool = field(default=True, init=False)
    tool_json_separators: tuple[str, str] = field(default=(", ", ": "), init=False)
    header_roles: frozenset[str] | None = field(
        default=frozenset({"system", "user", "assistant", "tool"}), init=False)

    def tool_declaration(self, tools):
        return tools_json(tools, self.tool_json_separators)


def tool_call_section(calls: Sequence[ToolCall]) -> str:
    if not calls:
        return ""
    inner = "".join(f"{CALL_BEGIN}{c.id}{CALL_ARG}{c.arguments}{CALL_END}" for c in calls)
    return f"{SECTION_BEGIN}{inner}{SECTION_END}"


def tool_name_from_id(call_id: str) -> str:
    """`functions.get_weather:0` -> `get_weather` (the name the model wrote into the id)."""
    name = call_id.strip()
    if name.startswith("functions."):
        name = name[len("functions."):]
    head, sep, tail = name.rpartition(":")
    return head if sep and tail.isdigit() else name


def _assistant(m: Message, content_text=content_with_media) -> AssistantMessage:
    calls = m.get("tool_calls") or ()
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            raise RenderError(f"tool_calls[{j}] has no function (only function calls can be "
                              "rendered by the Kimi templates)")
        if "arguments" not in fn:
            # The official templates fail here (`arguments` undefined); never invent one.
            raise RenderError(f"tool_calls[{j}].function.arguments is missing (the template "
                              "writes the arguments string the model produced)")
    return AssistantMessage(
        content=content_text(m.get("content")),
        reasoning=message_reasoning(m),
        tool_calls=tuple(ToolCall.from_openai(c) for c in calls),
    )


def _split_special(tok, ids: Sequence[int]) -> list[tuple[str | None, str]]:
    """Group ids into (special_token_text, "") and (None, decoded_text) runs."""
    specials = tok.id_to_special
    out: list[tuple[str | None, str]] = []
    run: list[int] = []
    for i in ids:
        name = specials.get(i)
        if name is None:
            run.append(i)
            continue
        if run:
            out.append((None, tok.decode(run)))
            run = []
        out.append((name, ""))
    if run:
        out.append((None, tok.decode(run)))
    return out
