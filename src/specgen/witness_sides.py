"""Both sides of the count witness for one provider's samples (docs/quality.md, "Two sides"):
`{"prompt": {check: n}, "completion": {check: n}, "prompt_deltas": {"+9": n}}`, counted the
same way by `status`, the report, the export manifest and `verify`."""

from __future__ import annotations

from typing import Any

RENDERED = ("rendering", "exact")  # prompt verdicts whose delta is the provider's rendering


def empty() -> dict[str, dict[str, int]]:
    return {"prompt": {}, "completion": {}, "prompt_deltas": {}}


def add(sides: dict[str, dict[str, int]], prompt_check: str | None,
        completion_check: str | None, prompt_delta: int | None, n: int = 1) -> None:
    """Count `n` samples with these verdicts (a delta counts when it is a rendering)."""
    for side, check in (("prompt", prompt_check), ("completion", completion_check)):
        key = check or "unchecked"
        sides[side][key] = sides[side].get(key, 0) + n
    if prompt_delta is not None and prompt_check in RENDERED:
        key = f"{prompt_delta:+d}"
        sides["prompt_deltas"][key] = sides["prompt_deltas"].get(key, 0) + n


def merge(into: dict[str, dict[str, dict[str, int]]],
          other: dict[str, dict[str, dict[str, int]]]) -> None:
    """Add per-provider sides `other` into `into`."""
    for provider, sides in other.items():
        target = into.setdefault(provider, empty())
        for part, counts in sides.items():
            for key, n in counts.items():
                target[part][key] = target[part].get(key, 0) + n


def ordered(by_provider: dict[str, dict[str, dict[str, int]]]) -> dict[str, Any]:
    """The same, providers and keys sorted (stable JSON)."""
    return {p: {part: dict(sorted(c.items())) for part, c in sides.items()}
            for p, sides in sorted(by_provider.items())}


def describe(sides: dict[str, Any] | None) -> str:
    """`prompt rendering 6, exact 3 · completion repaired 9 · deltas +9 ×6`."""
    if not sides:
        return "—"
    parts = [f"{side} " + ", ".join(f"{k} {n}" for k, n in sorted(sides[side].items()))
             for side in ("prompt", "completion") if sides.get(side)]
    if sides.get("prompt_deltas"):
        parts.append("deltas " + ", ".join(f"{d} ×{n}" for d, n in sorted(
            sides["prompt_deltas"].items())))
    return " · ".join(parts) or "—"
