"""Planted answers, for tests and demos of the data checks (docs/sim.md, "Planted answers").

The last user message of a request may hold one directive; the simulator then answers as it
says instead of sampling:

* `[[sim:repeat N]]`: the content is one sentence said again and again, about N tokens in
  all (a repetition loop);
* `[[sim:say TEXT]]`: the content is exactly TEXT, with no reasoning and no tool call (the
  same TEXT in two prompts gives identical answers; spaces only give a whitespace answer);
* `[[sim:long N]]`: the answer is N tokens long (cut at `max_tokens` when that is less).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_PLANT = re.compile(r"\[\[sim:(repeat|say|long)(?: ([^\]]*))?\]\]")


def planted(messages: Sequence[dict[str, Any]]) -> tuple[str, str] | None:
    """(kind, argument) of a directive in the last user message, if any."""
    for m in reversed(messages or ()):
        if not isinstance(m, dict) or m.get("role") != "user":
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        found = _PLANT.search(content) if isinstance(content, str) else None
        return (found.group(1), found.group(2) or "") if found else None
    return None
