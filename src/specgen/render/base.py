"""The renderer interface: conversation -> exact token ids of one forward pass of the target.

A *sample* is one forward pass: the ids of the prompt the server fed the model (loss mask 0)
followed by the ids the model sampled (loss mask 1). See docs/design.md, "Samples".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..conversation import AssistantMessage, Message, Tool
from ..tokenizer import MAX_RUN, Tokenizer


class RenderError(ValueError):
    """A conversation cannot be rendered (bad message shape, unsupported option)."""


class NotPrefixExtendingError(RenderError):
    """The template re-renders history, so one sequence cannot hold every assistant turn."""


def first_difference(a: Sequence, b: Sequence) -> int:
    """Index of the first position where two sequences differ (the shorter length if one is
    a prefix of the other)."""
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return k
    return min(len(a), len(b))


@dataclass(slots=True)
class Sample:
    """Token ids of one training sample and the loss mask over them."""

    input_ids: list[int]
    loss_mask: list[int]

    @property
    def n_prompt(self) -> int:
        """Length of the leading mask-0 run (the prompt of a single-forward-pass sample)."""
        try:
            return self.loss_mask.index(1)
        except ValueError:
            return len(self.loss_mask)

    @classmethod
    def from_parts(cls, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Sample:
        return cls(
            input_ids=[*prompt_ids, *completion_ids],
            loss_mask=[0] * len(prompt_ids) + [1] * len(completion_ids),
        )


def stray_stop_ids(sample: Sample, stop_ids: frozenset[int] | set[int]) -> list[int]:
    """Positions of stop ids inside a sampled run (mask 1) before the run's end: the
    message held an end-of-turn text (a literal `<|im_end|>`), which every renderer keeps as
    the template renders it, though a model stops there. `specgen tokenize` warns of them;
    the engine never meets them (normalise quarantines such answers: stray_special_token)."""
    ids, mask = sample.input_ids, sample.loss_mask
    n = len(ids)  # a stop id that ends a sampled run (each turn's own stop) is not stray
    return [k for k in range(n - 1) if mask[k] and mask[k + 1] and ids[k] in stop_ids]


@dataclass
class Renderer:
    """Base class of all renderers. Subclasses implement the four abstract methods.

    `thinking` selects the model's thinking mode where the template has one (e.g. K2.5's
    generation prompt ends with `<think>` when on, `<think></think>` when off).
    """

    tokenizer: Tokenizer
    thinking: bool = True
    name: str = field(default="base", init=False)

    # -- abstract ---------------------------------------------------------------------------
    def render_text(
        self, messages: Sequence[Message], tools: Sequence[Tool] | None = None, *,
        add_generation_prompt: bool,
    ) -> str:
        """The template's text for these messages (what the server would tokenize)."""
        raise NotImplementedError

    def completion_text(
        self, message: Message | AssistantMessage, *,
        context: Sequence[Message] | None = None, tools: Sequence[Tool] | None = None,
    ) -> str:
        """Text the model samples for this assistant message after the generation prompt,
        up to and including the stop token (e.g. `<|im_end|>`).

        `context` (the messages before it) and `tools` matter only for templates whose
        assistant render depends on history (the `hf` renderer); the Kimi renderers ignore them.
        """
        raise NotImplementedError

    def parse_completion(self, ids: Sequence[int]) -> AssistantMessage:
        """Inverse of `completion_ids`: sampled ids back to reasoning, content, tool calls."""
        raise NotImplementedError

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """Ids that end a completion (the server's stop tokens)."""
        raise NotImplementedError

    def content_format(self, serving: str) -> str:
        """How the stack `serving` hands list content to this template: "string" (text parts
        joined) or "openai" (as parts); see render.serving.content_format."""
        return "string"

    # -- derived ----------------------------------------------------------------------------
    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Tool] | None = None) -> list[int]:
        """Ids of the generation prompt for these messages (what the server feeds the model)."""
        return self.tokenizer.encode(self.render_text(messages, tools, add_generation_prompt=True))

    def completion_ids(
        self, message: Message | AssistantMessage, *,
        context: Sequence[Message] | None = None, tools: Sequence[Tool] | None = None,
    ) -> list[int]:
        """Ids the model samples for this assistant message (canonical segmentation)."""
        text = self.completion_text(message, context=context, tools=tools)
        return self.encode_completion(text, context=context, tools=tools)

    def completion_variants(
        self, message: Message | AssistantMessage, *,
        context: Sequence[Message] | None = None, tools: Sequence[Tool] | None = None,
    ) -> dict[str, str]:
        """Every form the model may have sampled for this message that gives the same API
        answer, by name, the canonical `completion_text` first. One form unless the template
        has markers a serving stack's parser does not require (the Kimi renderers)."""
        return {"canonical": self.completion_text(message, context=context, tools=tools)}

    def completion_variant_ids(
        self, message: Message | AssistantMessage, *,
        context: Sequence[Message] | None = None, tools: Sequence[Tool] | None = None,
    ) -> dict[str, list[int]]:
        """`completion_variants` encoded as the completion is (`encode_completion`)."""
        forms = self.completion_variants(message, context=context, tools=tools)
        return {name: self.encode_completion(text, context=context, tools=tools)
                for name, text in forms.items()}

    def encode_completion(
        self, text: str, *, context: Sequence[Message] | None = None,
        tools: Sequence[Tool] | None = None,
    ) -> list[int]:
        """Ids of completion text, as the model sampled it: encoded on its own, special tokens
        split off first. A served model samples the completion after the prompt (the prompt is
        encoded, the completion is not), so the Kimi encoder's long-run rule counts no text of
        the prompt and no special token's text into a run of the completion (docs/renderers.md,
        "Long runs in a completion"). `context`/`tools` are accepted for subclasses."""
        tok = self.tokenizer
        if tok.prefix_sensitive and len(text) > MAX_RUN:
            tok = tok.with_encode("split_special")
        return tok.encode(text)

    def sample(self, messages: Sequence[Message], tools: Sequence[Tool] | None = None) -> Sample:
        """One forward pass: prompt of messages[:-1] (mask 0) + sampled ids of messages[-1]
        (mask 1) when the last message is an assistant message; else the prompt alone."""
        if messages and messages[-1].get("role") == "assistant":
            context = messages[:-1]
            return Sample.from_parts(
                self.prompt_ids(context, tools),
                self.completion_ids(messages[-1], context=context, tools=tools),
            )
        return Sample.from_parts(self.prompt_ids(messages, tools), [])

    def sample_all_turns(
        self, messages: Sequence[Message], tools: Sequence[Tool] | None = None
    ) -> Sample:
        """Every assistant turn masked in one sequence ending with the last assistant turn.

        Only defined where the template is prefix-extending: the ids of turn i's prompt
        followed by the ids the model sampled for turn i must be a prefix of turn i+1's
        prompt. Then the last turn's forward pass contains every earlier one, and one
        sequence trains on all of them. Templates that re-render history (K2.5 drops the
        reasoning of finished turns) are refused: NotPrefixExtendingError names the first
        turn that breaks the prefix property. With no assistant message the sample is the
        generation prompt alone (mask all 0), as for `sample`.
        """
        turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if not turns:
            return self.sample(messages, tools)
        input_ids: list[int] = []
        loss_mask: list[int] = []
        prev_turn = None
        for turn in turns:
            context = messages[:turn]
            prompt = self.prompt_ids(context, tools)
            n = len(input_ids)
            if prompt[:n] != input_ids:
                at = first_difference(prompt, input_ids)
                raise NotPrefixExtendingError(
                    f"renderer {self.name!r} is not prefix-extending for this conversation: "
                    f"the prompt of the assistant turn at message {turn} does not start with "
                    f"the ids of the turn at message {prev_turn} (prompt + sampled ids); they "
                    f"differ at token {at} ({self._shown(prompt, at)} vs "
                    f"{self._shown(input_ids, at)}). The template re-renders history (e.g. "
                    "drops reasoning); use one sample per turn")
            completion = self.completion_ids(messages[turn], context=context, tools=tools)
            input_ids.extend(prompt[n:])
            loss_mask.extend([0] * (len(prompt) - n))
            input_ids.extend(completion)
            loss_mask.extend([1] * len(completion))
            prev_turn = turn
        return Sample(input_ids=input_ids, loss_mask=loss_mask)

    def _shown(self, ids: list[int], at: int) -> str:
        window = ids[at:at + 8]
        return repr(self.tokenizer.decode(window)) if window else "end of sequence"
