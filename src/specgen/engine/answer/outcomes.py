"""What the answer path decides about one answer: a small closed set of outcomes.

Every stage of the answer path (`specgen.engine.answer.pipeline`) returns one of these to end
the answer's journey, or None to hand it to the next stage; the last stage (record) always
returns `Kept`. The engine carries an outcome out and decides nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ...conversation import AssistantMessage
from ...records import ResultRecord


@dataclass(frozen=True, slots=True)
class Kept:
    """The answer is a sample: `record` is its results row."""

    record: ResultRecord
    message: AssistantMessage  # what the conversation's next turn holds
    repairs: tuple[str, ...]
    count_check: str


@dataclass(frozen=True, slots=True)
class Quarantined:
    """The answer is set aside with a reason; the task is retried while its quarantine
    retries last, then ends. `detail` holds the reason's figures (stored as JSON)."""

    reason: str
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def message(self) -> str:
        return str(self.detail.get("message", ""))

    def detail_json(self) -> str | None:
        """`quarantine.detail`: the figures as JSON (None when there are none)."""
        return orjson.dumps(self.detail, default=str).decode() if self.detail else None


@dataclass(frozen=True, slots=True)
class Rejected:
    """The answer is outside the provider policy or from another model: its cost is counted
    and the task is retried (`what` names who answered)."""

    reason: str
    what: str


@dataclass(frozen=True, slots=True)
class Fatal:
    """The run must stop because of this answer (`rejected`: the answer that tripped it)."""

    message: str
    rejected: Rejected | None = None


Outcome = Kept | Quarantined | Rejected | Fatal
