"""Model cards and the shape of a `reasoning` setting: the facts about a target model that the
config checks and the sampling resolve both need (so neither imports the other for them)."""

from __future__ import annotations

from typing import Any

# Model-card sampling per (name pattern, thinking mode): the vendor's recommended settings.
# Kimi K2.5 (model card / K2 Vendor Verifier): thinking temperature 1.0 and top_p 0.95 (Moonshot
# enforces them), instant mode temperature 0.6 (top_p 0.95 as well).
MODEL_CARDS: tuple[tuple[tuple[str, ...], str, dict[bool, dict[str, float]]], ...] = (
    (("kimi-k2.5", "kimi-k2-5", "kimi-k2.6", "kimi-k2-6"), "Kimi K2.5 model card",
     {True: {"temperature": 1.0, "top_p": 0.95}, False: {"temperature": 0.6, "top_p": 0.95}}),
)
GENERIC_TEMPERATURE = 1.0  # a silent temperature without a model card (and before them)
REASONING_KEYS = ("enabled", "effort", "max_tokens", "exclude")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def model_card(model: str) -> tuple[str, dict[bool, dict[str, float]]] | None:
    """(source, {thinking: defaults}) of the model card matching `model`, or None."""
    m = model.lower()
    for patterns, source, table in MODEL_CARDS:
        if any(p in m for p in patterns):
            return source, table
    return None


def thinking_of(reasoning: bool | dict[str, Any]) -> bool:
    """Whether a `reasoning` setting (a bool or OpenRouter's object) turns thinking on."""
    if isinstance(reasoning, dict):
        if reasoning.get("effort") == "none" or reasoning.get("max_tokens") == 0:
            return False
        return bool(reasoning.get("enabled", True))
    return bool(reasoning)


def silent_card(model: str, defaults_on: bool, temperature: Any, top_p: Any,
                dataset_temperatures: list[Any]) -> str | None:
    """The model card that decides a value the config leaves silent (the run's or a dataset's
    temperature, or top_p), or None: off, no card, or nothing silent."""
    found = model_card(model) if defaults_on else None
    if found is None:
        return None
    silent = top_p is None or (temperature is None
                               and any(t is None for t in dataset_temperatures))
    return found[0] if silent else None


def check_reasoning(value: Any, key: str) -> str | None:
    """Why a `reasoning` value (bool or OpenRouter's object) is invalid, or None."""
    if isinstance(value, bool):
        return None
    if not isinstance(value, dict):
        return f"{key} must be true, false or a table like {{ effort = \"high\" }}, not {value!r}"
    unknown = sorted(set(value) - set(REASONING_KEYS))
    if unknown:
        return f"{key} has unknown key(s) {', '.join(unknown)} (known: {', '.join(REASONING_KEYS)})"
    if "effort" in value and value["effort"] not in EFFORTS:
        return f"{key}.effort must be one of {', '.join(EFFORTS)}, not {value['effort']!r}"
    mt = value.get("max_tokens")
    if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 0):
        return f"{key}.max_tokens must be an integer >= 0, not {mt!r}"
    for flag in ("enabled", "exclude"):
        if flag in value and not isinstance(value[flag], bool):
            return f"{key}.{flag} must be true or false, not {value[flag]!r}"
    return None
