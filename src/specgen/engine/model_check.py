"""Answers must come from the model that was asked.

A router may answer with another model (a fallback list, a misrouted provider): such an answer
is not the target's output and would teach the drafter another model. It is rejected like an
answer from an ignored provider (its cost counted, the task retried). Accepted: the requested
slug itself, its dated slugs (`moonshotai/kimi-k2.5-20260127`), the same without the author
(`kimi-k2.5`, as direct providers write it), and `[endpoint] accept_models`. A variant suffix
of the request (`:exacto`, `:nitro`) is not part of the model. An answer with no `model` field
cannot be checked and is kept.
"""

from __future__ import annotations

import re

_DATED = re.compile(r"-(\d{4}[\d.\-]*)$")  # a date or version suffix: -20260127, -0905, -2025-09


def _base(slug: str) -> str:
    return slug.split(":", 1)[0].strip().lower()


class ModelCheck:
    def __init__(self, requested: str, accept: list[str] | tuple[str, ...] = ()):
        base = _base(requested)
        self.requested = requested
        self._names = {base, base.rsplit("/", 1)[-1]}
        self._accept = {_base(m) for m in accept if m}

    def rejection(self, model: str | None) -> str | None:
        """None when `model` (the answer's `model` field) is acceptable, else the reason."""
        if not model:
            return None
        got = _base(model)
        if got in self._accept:
            return None
        for name in (got, got.rsplit("/", 1)[-1]):
            if name in self._names or _DATED.sub("", name) in self._names:
                return None
        return "wrong_model"
