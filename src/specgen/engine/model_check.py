"""Answers must come from the model that was asked.

A router may answer with another model (a fallback list, a misrouted provider): such an answer
is not the target's output and would teach the drafter another model. It is rejected like an
answer from an ignored provider (its cost counted, the task retried). Accepted: the requested
slug itself, its dated slugs (`moonshotai/kimi-k2.5-20260127`), the same without the author
(`kimi-k2.5`, as direct providers write it), and `[endpoint] accept_models`. A variant suffix
of the request (`:exacto`, `:nitro`) is not part of the model. An answer that names an author
must name the requested one (`attacker/kimi-k2.5` is another model); a `model` that is not a
string (`123`: the client keeps it as its JSON text) matches nothing. An answer with no `model`
field cannot be checked and is kept.
"""

from __future__ import annotations

import re

_DATED = re.compile(r"-(\d{4}[\d.\-]*)$")  # a date or version suffix: -20260127, -0905, -2025-09


def _base(slug: str) -> str:
    return slug.split(":", 1)[0].strip().lower()


def _split(slug: str) -> tuple[str | None, str]:
    """(author or None, name) of a base slug."""
    author, slash, name = slug.rpartition("/")
    return (author or None) if slash else None, name


class ModelCheck:
    def __init__(self, requested: str, accept: list[str] | tuple[str, ...] = ()):
        base = _base(requested)
        self.requested = requested
        self._author, self._name = _split(base)
        self._accept = {_base(m) for m in accept if m}

    def rejection(self, model: str | None) -> str | None:
        """None when `model` (the answer's `model` field) is acceptable, else the reason."""
        if model is None or model == "":
            return None
        if not isinstance(model, str):
            return "wrong_model"
        got = _base(model)
        if got in self._accept:
            return None
        author, name = _split(got)
        if author is not None and self._author is not None and author != self._author:
            return "wrong_model"  # the same name from another author is another model
        if name == self._name or _DATED.sub("", name) == self._name:
            return None
        return "wrong_model"
