"""What the quality monitor learns from one answer, and the rolling shares it keeps.

`Observation.of_answer` turns an answer (its raw API fields, how the engine treated it) into
the few facts policing (`quality.policing`) and alarms (`quality.alarms`) count; `Rolling` is
a share over the last N relevant answers plus totals, with the task ids of recent failures
as examples.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Tool-call marker text that must never reach content or reasoning: the serving stack's tool
# parser did not run (tools ignored, or called as text), so the calls are raw Kimi markers.
RAW_TOOL_MARKERS = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>",
                    "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                    "<|tool_calls_section_end|>")
# Normaliser outcomes that say the same: calls recovered from marker text, or broken markup.
MARKER_REPAIRS = frozenset({"tool_calls_from_content", "tool_calls_from_reasoning"})
MARKER_QUARANTINES = frozenset({"bad_tool_call_markup"})
# Quarantine reasons that mean "the calls do not fit the declared tools".
SCHEMA_FAILURES = frozenset({"schema_mismatch", "bad_tool_arguments", "unknown_tool"})
JUDGED = frozenset({"exact", "repaired", "mismatch"})  # count-witness verdicts that judge
# Quarantine reasons another figure watches (schema, count, markers, empty, length): the
# quarantine rate counts the others, so one cause never trips two figures.
OWN_FIGURE = SCHEMA_FAILURES | MARKER_QUARANTINES | {"count_mismatch", "empty", "length",
                                                      "repetition", "secret_in_answer"}
UNKNOWN = "(unknown)"


def has_raw_markers(*texts: str | None) -> bool:
    """Whether any text holds a raw tool-call marker."""
    return any(text and "<|tool_call" in text and any(m in text for m in RAW_TOOL_MARKERS)
               for text in texts)


@dataclass(frozen=True, slots=True)
class Observation:
    """One answer as quality counts it.

    `outcome`: ok (kept), quarantined or rejected (provider policy / model check); `reason`:
    the quarantine or rejection reason. `calls`: the answer holds tool calls (the normalised
    message's; for a quarantined answer, the API's or marker text). `count_check`: the count
    witness's verdict when it judged (exact, repaired, mismatch), None when it did not or the
    provider's counting was not settled yet. `quantization_mismatch`: the answer revealed a
    quantization its provider's endpoints do not declare. `after_tool_result`: the request's
    last message is a tool result (a model then mostly answers without calling again)."""

    provider: str
    dataset: str
    task: int
    outcome: str
    reason: str | None = None
    tools_offered: bool = False
    calls: bool = False
    raw_markers: bool = False
    count_check: str | None = None
    truncated: bool = False
    quantization_mismatch: bool = False
    after_tool_result: bool = False  # the request's last message is a tool result
    repetition: bool = False  # a repetition loop was found in the sampled ids
    # the count witness's verdict whatever the provider's counting state (None: not judged,
    # or true ids), and whether that provider's counts turned out unusable
    witness: str | None = None
    counts_unusable: bool = False
    # a sample stored pending and judged again: only its count verdict counts (its other
    # figures were counted when it arrived, its count verdict was not)
    rejudged: bool = False

    @classmethod
    def of_answer(cls, *, provider: str | None, dataset: str, task: int, outcome: str,
                  reason: str | None = None, tools_offered: bool = False,
                  content: str | None = None, reasoning: str | None = None,
                  api_calls: bool = False, message_calls: bool | None = None,
                  repairs: Sequence[str] = (), count_check: str | None = None,
                  finish_reason: str | None = None, quantization_mismatch: bool = False,
                  after_tool_result: bool = False, repetition: bool = False,
                  witness: str | None = None,
                  counts_unusable: bool = False) -> Observation:
        """The observation of an answer from its raw fields (`content`, `reasoning`,
        `api_calls`: the API returned structured calls) and what the engine made of it
        (`message_calls`: the kept message has calls; `repairs`; `count_check`)."""
        markers = (has_raw_markers(content, reasoning)
                   or any(r in MARKER_REPAIRS for r in repairs)
                   or (reason in MARKER_QUARANTINES))
        calls = bool(message_calls) if message_calls is not None else (
            api_calls or markers or reason in SCHEMA_FAILURES)
        return cls(provider=provider or UNKNOWN, dataset=dataset, task=task, outcome=outcome,
                   reason=reason, tools_offered=tools_offered, calls=calls,
                   raw_markers=markers,
                   count_check=count_check if count_check in JUDGED else None,
                   truncated=finish_reason == "length",
                   quantization_mismatch=quantization_mismatch,
                   after_tool_result=after_tool_result,
                   repetition=repetition or reason == "repetition",
                   witness=witness, counts_unusable=counts_unusable)


class Rolling:
    """The share of failures over the last `size` relevant answers, and totals. Each entry
    keeps the answer's task id, provider and a label (a reason) for examples and breakdowns."""

    __slots__ = ("recent", "fails", "total", "total_fails", "labels")

    def __init__(self, size: int):
        self.recent: deque[tuple[bool, int, str, str | None]] = deque(maxlen=size)
        self.fails = 0  # failures in the window
        self.total = 0
        self.total_fails = 0
        self.labels: Counter[str] = Counter()  # failure labels over all answers

    def add(self, failed: bool, task: int, provider: str, label: str | None = None) -> None:
        recent = self.recent
        if len(recent) == recent.maxlen and recent[0][0]:
            self.fails -= 1
        recent.append((failed, task, provider, label))
        self.total += 1
        if failed:
            self.fails += 1
            self.total_fails += 1
            if label:
                self.labels[label] += 1

    def forget(self, providers: set[str]) -> int:
        """Drop the window's entries of `providers` (names compared case-insensitively), so
        the share is judged again over the others' answers; the entries dropped."""
        keep = [e for e in self.recent if e[2].lower() not in providers]
        dropped = len(self.recent) - len(keep)
        if dropped:
            self.recent = deque(keep, maxlen=self.recent.maxlen)
            self.fails = sum(1 for e in keep if e[0])
        return dropped

    @property
    def n(self) -> int:
        return len(self.recent)

    @property
    def share(self) -> float:
        """The failure share in the window (0 when empty)."""
        return self.fails / len(self.recent) if self.recent else 0.0

    def examples(self, k: int = 5) -> list[dict[str, Any]]:
        """The latest failures in the window: [{"task", "provider", "reason"}]."""
        out = [{"task": t, "provider": p, **({"reason": lab} if lab else {})}
               for failed, t, p, lab in reversed(self.recent) if failed]
        return out[:k]

    def window_labels(self) -> dict[str, int]:
        """Failure labels in the window, most frequent first."""
        return dict(Counter(lab for failed, _, _, lab in self.recent
                            if failed and lab).most_common())

    def to_json(self) -> dict[str, Any]:
        return {"window": self.n, "failures": self.fails, "share": round(self.share, 4),
                "total": self.total, "total_failures": self.total_fails}
