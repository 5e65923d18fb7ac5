"""The "all assistant turns" form: one sequence, every assistant turn's sampled ids masked 1.

Only defined where the template is prefix-extending: the ids of turn i's prompt followed by
the ids the model sampled for turn i must be a prefix of turn i+1's prompt. Then the last
turn's forward pass contains every earlier one, and one sequence trains on all of them.
Templates that re-render history (K2.5 drops reasoning of finished turns) are refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..conversation import Message, Tool
from .base import NotPrefixExtendingError, Renderer, Sample, first_difference


def sample_all_turns(
    renderer: Renderer, messages: Sequence[Message], tools: Sequence[Tool] | None = None
) -> Sample:
    """Every assistant turn masked in one sequence ending with the last assistant turn.

    With no assistant message the sample is the generation prompt alone (mask all 0), as for
    `Renderer.sample`. Raises NotPrefixExtendingError naming the first turn that breaks the
    prefix property.
    """
    turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not turns:
        return renderer.sample(messages, tools)
    input_ids: list[int] = []
    loss_mask: list[int] = []
    prev_turn = None
    for turn in turns:
        context = messages[:turn]
        prompt = renderer.prompt_ids(context, tools)
        n = len(input_ids)
        if prompt[:n] != input_ids:
            at = first_difference(prompt, input_ids)
            raise NotPrefixExtendingError(
                f"renderer {renderer.name!r} is not prefix-extending for this conversation: the "
                f"prompt of the assistant turn at message {turn} does not start with the ids of "
                f"the turn at message {prev_turn} (prompt + sampled ids); they differ at token "
                f"{at} ({_show(renderer, prompt, at)} vs {_show(renderer, input_ids, at)}). "
                "The template re-renders history (e.g. drops reasoning); use one sample per turn"
            )
        completion = renderer.completion_ids(messages[turn], context=context, tools=tools)
        input_ids.extend(prompt[n:])
        loss_mask.extend([0] * (len(prompt) - n))
        input_ids.extend(completion)
        loss_mask.extend([1] * len(completion))
        prev_turn = turn
    return Sample(input_ids=input_ids, loss_mask=loss_mask)


def _show(renderer: Renderer, ids: list[int], at: int) -> str:
    window = ids[at:at + 8]
    return repr(renderer.tokenizer.decode(window)) if window else "end of sequence"
