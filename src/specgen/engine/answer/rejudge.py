"""Samples judged again: a pending prompt side (its request shape's rendering not known when
it arrived, `quality.shapes`) gets its verdict once the shape's rendering is known, or when the
session ends (`settle`). What changes is the row's `count_check` and `prompt_check`; the ids
were judged on the completion side at once and stay.
"""

from __future__ import annotations

from ...quality.shapes import Resolved, combine
from ...quality.witness import CountWitness


def take(witness: CountWitness) -> dict[int, tuple[str, str]]:
    """The samples the witness judged again since the last call: task -> (count_check,
    prompt_check)."""
    return _rows(witness.shapes.take_resolved())


def settle(witness: CountWitness) -> dict[int, tuple[str, str]]:
    """Final verdicts of every sample still pending (the session ends)."""
    return _rows(witness.shapes.settle())


def _rows(resolved: list[Resolved]) -> dict[int, tuple[str, str]]:
    return {r.key: (combine(r.completion_check, r.prompt_check), r.prompt_check)
            for r in resolved if isinstance(r.key, int)}
