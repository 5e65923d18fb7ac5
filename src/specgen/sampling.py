"""What each sample is sampled with: the model card's defaults, per-dataset mixes, n samples.

`sample_settings(cfg, ds, conv_id, turn)` is the one entry point. It resolves, for one request:

* `reasoning`: the dataset's value, or one drawn from its mix (`reasoning = [true, false]`
  with `reasoning_weights`), else `[sampling] reasoning`. Drawn once per conversation, so a
  conversation keeps one thinking mode across its turns (its history renders in that mode).
* `temperature`: the dataset's value or one drawn from its mix (`temperature = [0.6, 1.0]`
  with `temperature_weights`; drawn per request), else `[sampling] temperature`, else the
  model card's default for the thinking mode (`MODEL_CARDS`), else 1.0.
* `top_p`: `[sampling] top_p`, else the model card's, else unset.

`[sampling] model_defaults = false` turns the model card off (temperature 1.0 when silent, no
top_p: what specgen sent before the cards). A store made before the key resumes that way.

Draws are a pure function of the task's identity (dataset, conversation id, turn): a resumed
run, a second run and every shard draw the same values. The resolved values travel on the
request and are recorded on the sample (`SampleSettings.to_json`, `results.sampling`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .model_cards import GENERIC_TEMPERATURE, model_card, thinking_of

if TYPE_CHECKING:
    from .config import DatasetConfig, RunConfig

def draw(*identity: Any) -> float:
    """A uniform number in [0, 1) that depends on `identity` only (no state, no seed)."""
    key = "\x1f".join(str(x) for x in identity).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2.0**64


def pick(values: list[Any], weights: list[float] | None, u: float) -> Any:
    """The value a uniform draw `u` selects, by weight (equal weights when None)."""
    w = weights or [1.0] * len(values)
    target = u * sum(w)
    acc = 0.0
    for value, weight in zip(values, w, strict=True):
        acc += weight
        if target < acc:
            return value
    return values[-1]


@dataclass(frozen=True, slots=True)
class SampleSettings:
    """The sampling of one request, as sent and as recorded on its sample."""

    temperature: float | None
    top_p: float | None
    reasoning: bool | dict[str, Any]
    thinking: bool
    sample: int = 0  # which of the dataset's n samples of its prompt (0-based)
    from_model_card: tuple[str, ...] = ()  # keys the model card filled in
    drawn: tuple[str, ...] = field(default=())  # keys drawn from a dataset mix

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sample": self.sample, "temperature": self.temperature,
                               "top_p": self.top_p, "reasoning": self.reasoning,
                               "thinking": self.thinking}
        if self.from_model_card:
            out["model_card"] = list(self.from_model_card)
        if self.drawn:
            out["drawn"] = list(self.drawn)
        return out


def sample_settings(cfg: RunConfig, ds: DatasetConfig, conv_id: str, turn: int,
                    sample: int = 0) -> SampleSettings:
    """The sampling of the request for `turn` of conversation `conv_id` of dataset `ds`."""
    s = cfg.sampling
    drawn: list[str] = []
    reasoning = s.reasoning if ds.reasoning is None else ds.reasoning
    if isinstance(reasoning, list):
        reasoning = pick(reasoning, ds.reasoning_weights, draw(ds.name, conv_id, "reasoning"))
        drawn.append("reasoning")
    thinking = thinking_of(reasoning)
    card = card_defaults(cfg, thinking)
    filled: list[str] = []
    temperature = s.temperature if ds.temperature is None else ds.temperature
    if isinstance(temperature, list):
        temperature = pick(temperature, ds.temperature_weights,
                           draw(ds.name, conv_id, turn, "temperature"))
        drawn.append("temperature")
    elif temperature is None:
        temperature = card.get("temperature", GENERIC_TEMPERATURE)
        if "temperature" in card:
            filled.append("temperature")
    top_p = s.top_p
    if top_p is None and "top_p" in card:
        top_p = card["top_p"]
        filled.append("top_p")
    return SampleSettings(temperature=temperature, top_p=top_p, reasoning=reasoning,
                          thinking=thinking, sample=sample, from_model_card=tuple(filled),
                          drawn=tuple(drawn))


def defaults_on(cfg: RunConfig) -> bool:
    """`[sampling] model_defaults`: unset means on (a store made before the key pins it off)."""
    return cfg.sampling.model_defaults_on


def card_defaults(cfg: RunConfig, thinking: bool) -> dict[str, float]:
    """The model card's values for this thinking mode (empty: off, or no card)."""
    found = model_card(cfg.target.model) if defaults_on(cfg) else None
    return dict(found[1][thinking]) if found else {}


def run_defaults(cfg: RunConfig) -> dict[str, tuple[Any, str]]:
    """The run-wide temperature and top_p of a dataset that sets neither, with where each
    comes from, for preview: {"temperature": (value, origin), "top_p": (value, origin)}."""
    s = cfg.sampling
    card = card_defaults(cfg, s.thinking)
    found = model_card(cfg.target.model)
    source = found[0] if found and card else ""
    out: dict[str, tuple[Any, str]] = {}
    for key in ("temperature", "top_p"):
        value = getattr(s, key)
        if value is not None:
            out[key] = (value, "[sampling]")
        elif key in card:
            out[key] = (card[key], source)
        elif key == "temperature":
            out[key] = (GENERIC_TEMPERATURE, "specgen's default")
        else:
            out[key] = (None, "not sent: the provider's default")
    return out
