"""One answer on its way through the answer path, and what the stages share.

`Answer` is the attempt (its job, the API's response, what it was charged) plus what earlier
stages found; each stage reads it and fills in its own part. `AnswerContext` holds what the
stages consult (the config, the normaliser, the provider policy, the model check, the count
witness), built once per session.
"""

from __future__ import annotations

from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ...client.errors import Redactor
from ...client.types import ChatResponse
from ...config import RunConfig
from ...conversation import AssistantMessage
from ...quality.witness import CountWitness, Verdict
from ..budget import Charge
from ..model_check import ModelCheck
from ..policy import ProviderPolicy
from ..stages import Stages
from ..state import Job


@dataclass(frozen=True, slots=True)
class Note:
    """Something a stage wants recorded as an event (and logged); `once`: per dataset and
    provider for the session."""

    kind: str
    message: str
    once: bool = True


@dataclass(slots=True)
class Answer:
    job: Job
    resp: ChatResponse
    charge: Charge
    # normalise: the assistant message, its completion ids, whether it was cut at max_tokens
    message: AssistantMessage | None = None
    completion: list[int] | None = None
    truncated: bool = False
    repairs: list[str] = field(default_factory=list)
    # witness: its verdict; the sample's count_check; the prompt the model saw when a repair
    # found another one than ours (and the history as the serving stack rendered it)
    verdict: Verdict | None = None
    count_check: str | None = None
    prompt_ids: array | None = None
    prompt_messages: list[dict[str, Any]] | None = None
    # the message and completion ids before a count repair of the completion, with that
    # repair's names: what the sample goes back to if its form's offset is lost (a split)
    unrepaired: tuple[AssistantMessage, list[int], list[str]] | None = None
    notes: list[Note] = field(default_factory=list)
    # repetition: the loop found in the completion ids (quality.repetition.Loop), if any
    repetition: Any = None

    @property
    def sample_prompt_ids(self) -> array:
        return self.job.prompt_ids if self.prompt_ids is None else self.prompt_ids

    @property
    def settled(self) -> bool:
        """The witness judged with the provider's counting settled (False while learning)."""
        return self.verdict is None or self.verdict.settled


@dataclass(slots=True)
class AnswerContext:
    cfg: RunConfig
    stages: Stages
    policy: ProviderPolicy
    model_check: ModelCheck
    witness: CountWitness
    tokens_mode: bool
    secrets: Redactor | None = None  # the API key and proxy credentials (the secret stage)
    # per provider: its reasoning_tokens minus our count of the reasoning (witness stage)
    reasoning_deltas: dict[str, Counter] = field(default_factory=dict)
