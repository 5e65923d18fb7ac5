"""What a provider's canary answers show: one `Observation` per answer, `summarize` per
provider, `failures` against the thresholds.

* schema accuracy — of the tool calls it returned, the share whose arguments are JSON that fits
  the declared tool's schema (`quality.schema.schema_problem`), as K2 Vendor Verifier counts;
* tool-call trigger agreement — canary by canary, did it stop with tool calls when the
  reference provider did: F1 with the reference as truth (precision and recall of triggering),
  and the plain share of canaries where both agree;
* count-witness agreement — its `usage` counts against our re-render of its answer
  (`quality.witness`, its offsets learned per answer form from all its answers, the
  count-guided repairs allowed, as a session's end judges): exact or repaired over those
  judged; the offset of each form (`completion_offsets_by_form`);
* reasoning present when asked (and absent when not), finish reasons, truncation, time to
  first token, tokens per second, cost per 1,000 completion tokens.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..client.types import ChatResponse
from ..conversation import Tool
from ..quality.forms import answer_form
from ..quality.repairs import candidates as repair_candidates
from ..quality.repairs import count_repair
from ..quality.schema import schema_problem
from ..quality.shapes import shape_signature
from ..quality.witness import MAX_OFFSET, CountWitness

SKIPPED = "skipped:cost_cap"  # the error of a canary the cost cap left unsent


@dataclass(slots=True)
class Observation:
    """One canary sent to one endpoint: the answer's facts, or the error that ended it."""

    canary: str
    endpoint: str  # the endpoint tag it was pinned to
    has_tools: bool
    thinking: bool  # reasoning asked for
    ok: bool = False
    error: str | None = None  # error class (or rejected:<why>, skipped:cost_cap)
    detail: str | None = None
    provider: str | None = None  # who answered
    finish_reason: str | None = None
    triggered: bool = False
    calls: int = 0
    calls_valid: int = 0
    schema_problems: list[str] = field(default_factory=list)
    reasoning: bool = False
    truncated: bool = False
    ttft_s: float | None = None
    generation_s: float | None = None  # first token to the end of the answer
    completion_tokens: int | None = None
    cost_usd: float | None = None
    quarantine: str | None = None  # why a run would not keep this answer
    witness: str | None = None  # exact | repaired | mismatch | unverified (None: not judged)
    witness_detail: str = ""
    # for the witness: our prompt and completion ids counts, the answer's usage, its repair
    ours: tuple[int, int] | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    repair: Callable[[int], Any] | None = None
    # the prompt side: the request shape (quality.shapes), provider − ours, its verdict
    shape: str | None = None
    prompt_delta: int | None = None
    prompt_check: str | None = None
    # the completion side: provider − ours after the answer's repair (its counting offset),
    # and the answer's form (quality.forms: offsets are per form)
    count_offset: int | None = None
    form: str = "plain"

    def to_json(self) -> dict[str, Any]:
        keep = ("canary", "endpoint", "ok", "error", "detail", "provider", "finish_reason",
                "has_tools", "triggered", "calls", "calls_valid", "schema_problems",
                "thinking", "reasoning", "truncated", "ttft_s", "generation_s",
                "completion_tokens", "cost_usd", "quarantine", "witness", "witness_detail",
                "shape", "prompt_delta", "prompt_check", "count_offset", "form")
        return {k: getattr(self, k) for k in keep}


def tool_facts(resp: ChatResponse, tools: list[Tool] | None) -> tuple[int, int, list[str]]:
    """(tool calls, calls that fit their schema, the problems of the others)."""
    schemas = {t["function"]["name"]: t["function"].get("parameters")
               for t in tools or () if isinstance(t, dict) and "function" in t}
    valid, problems = 0, []
    for call in resp.tool_calls:
        if call.name not in schemas:
            problems.append(f"{call.name}: not a declared tool")
            continue
        try:
            args = orjson.loads(call.arguments or "")
        except orjson.JSONDecodeError:
            problems.append(f"{call.name}: arguments are not JSON")
            continue
        problem = schema_problem(args, schemas[call.name])
        if problem:
            problems.append(f"{call.name}: {problem}")
        else:
            valid += 1
    return len(resp.tool_calls), valid, problems


def observe_answer(obs: Observation, resp: ChatResponse, tools: list[Tool] | None,
                   renderer, messages, normalize, quarantined: type[BaseException]) -> None:
    """Fill `obs` from one answer (the raw fields measure the provider; the normalised
    message is what our re-render, and so the witness, sees)."""
    obs.ok = True
    obs.provider = resp.provider
    obs.finish_reason = resp.finish_reason
    obs.calls, obs.calls_valid, obs.schema_problems = tool_facts(resp, tools)
    obs.triggered = bool(resp.tool_calls) or resp.finish_reason == "tool_calls"
    obs.reasoning = bool((resp.reasoning or "").strip())
    obs.truncated = resp.finish_reason == "length"
    if resp.first_token_at is not None and resp.started_at:
        obs.ttft_s = max(0.0, resp.first_token_at - resp.started_at)
        if resp.ended_at:
            obs.generation_s = max(0.0, resp.ended_at - resp.first_token_at)
    usage = resp.usage or {}
    ct = usage.get("completion_tokens")
    obs.completion_tokens = ct if isinstance(ct, int) and not isinstance(ct, bool) else None
    obs.cost_usd = resp.cost_usd
    obs.usage = dict(usage)
    try:
        message = normalize(resp, tools=tools, renderer=renderer, messages=messages,
                            on_length="keep").message
        completion = renderer.completion_ids(message, context=messages, tools=tools)
        prompt = renderer.prompt_ids(messages, tools)
    except quarantined as q:
        obs.quarantine = getattr(q, "reason", None) or str(q)
        return
    except Exception as exc:  # noqa: BLE001 - an answer our pipeline cannot take
        obs.quarantine = f"normalize_error: {type(exc).__name__}"
        return
    if obs.truncated:
        return  # a cut answer has no stop token: the witness does not judge it
    obs.ours = (len(prompt), len(completion))
    obs.form = answer_form(message)
    obs.shape = shape_signature(tools, messages, obs.thinking)
    if repair_candidates(message):
        def render(m):
            return renderer.completion_ids(m, context=messages, tools=tools)

        obs.repair = lambda target: count_repair(message, target, render)


def judge_witness(observations: Iterable[Observation]) -> None:
    """The count witness's verdict on each judged answer of one provider, as a run judges
    them: its counting offset learnt per answer form from every answer of that form (the
    repairs solved jointly with it), then settled with all of them (a probe has too few
    answers to warm up: the evidence rule applies at the end, as at a session's end)."""
    obs = [o for o in observations if o.ours is not None]
    witness = CountWitness()
    for i, o in enumerate(obs):
        v = witness.judge("p", prompt=o.ours[0], completion=o.ours[1], usage=o.usage,
                          repair=o.repair, shape=o.shape or "", tools=o.has_tools, key=i,
                          form=o.form)
        o.witness, o.witness_detail = v.check, v.detail
        o.prompt_delta, o.prompt_check = v.prompt_delta, v.prompt_check
        _offset(o, v)
    for r in [*witness.take_resolved(), *witness.settle()]:
        o = obs[r.key]  # its form's offset known later (or settled)
        o.prompt_check, o.witness = r.prompt_check, r.count_check
        if r.completion is not None:
            o.witness_detail = r.completion.detail or o.witness_detail
            _offset(o, r.completion)


def _offset(o: Observation, v) -> None:
    """The counting offset a final exact / repaired completion verdict took."""
    c = o.usage.get("completion_tokens")
    if isinstance(c, int) and v.check in ("exact", "repaired"):
        o.count_offset = c - (len(v.ids) if v.ids is not None else o.ours[1])
    else:
        o.count_offset = None


def _share(num: int, den: int) -> float | None:
    return None if den == 0 else round(num / den, 4)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def summarize(obs: list[Observation], reference: dict[str, Observation] | None
              ) -> dict[str, Any]:
    """One endpoint's figures over its observations (`reference`: the reference provider's
    observations by canary; None when there is none, or for the reference itself)."""
    sent = [o for o in obs if o.error != SKIPPED]
    answered = [o for o in sent if o.ok]
    calls = sum(o.calls for o in answered)
    valid = sum(o.calls_valid for o in answered)
    verdicts = Counter(o.witness for o in answered if o.witness)
    judged = verdicts["exact"] + verdicts["repaired"] + verdicts["mismatch"]
    asked = [o for o in answered if o.thinking]
    not_asked = [o for o in answered if not o.thinking]
    tokens = sum(o.completion_tokens or 0 for o in answered)
    costs = [o.cost_usd for o in answered if o.cost_usd is not None]
    speeds = [o.completion_tokens / o.generation_s for o in answered
              if o.completion_tokens and o.generation_s]
    shapes: dict[str, dict[str, dict[str, int]]] = {}  # provider -> shape -> delta -> n
    for o in answered:
        if o.shape and o.prompt_delta is not None and o.prompt_check in ("exact", "rendering"):
            by = shapes.setdefault(o.provider or "", {}).setdefault(o.shape, {})
            by[str(o.prompt_delta)] = by.get(str(o.prompt_delta), 0) + 1
    offsets: dict[str, dict[str, Counter]] = {}  # provider -> form -> offset -> n
    for o in answered:
        if o.count_offset is not None and abs(o.count_offset) <= MAX_OFFSET:
            offsets.setdefault(o.provider or "", {}).setdefault(
                o.form, Counter())[o.count_offset] += 1
    by_form = {p: {f: int(c.most_common(1)[0][0]) for f, c in forms.items()}
               for p, forms in offsets.items()}  # (every verdict took its form's offset)
    out: dict[str, Any] = {
        "completion_offsets": {p: forms["plain"] for p, forms in by_form.items()
                               if "plain" in forms},
        "completion_offsets_by_form": by_form,
        "prompt_shapes": {p: {sh: int(max(d, key=d.get)) for sh, d in by.items()}
                          for p, by in shapes.items()},
        "requests": len(sent), "unsent": len(obs) - len(sent), "answered": len(answered),
        "success_rate": _share(len(answered), len(sent)),
        "errors": dict(Counter(o.error for o in sent if o.error)),
        "tool_calls": calls, "schema_accuracy": _share(valid, calls),
        "schema_problems": [p for o in answered for p in o.schema_problems][:5],
        "witness": dict(verdicts), "witness_judged": judged, "witness_agreement": _share(
            verdicts["exact"] + verdicts["repaired"], judged),
        "reasoning_asked": len(asked),
        "reasoning_present": _share(sum(o.reasoning for o in asked), len(asked)),
        "reasoning_leaked": sum(o.reasoning for o in not_asked),
        "finish_reasons": dict(Counter(o.finish_reason or "none" for o in answered)),
        "truncated": _share(sum(o.truncated for o in answered), len(answered)),
        "quarantined": dict(Counter(o.quarantine for o in answered if o.quarantine)),
        "ttft_p50_s": _median([o.ttft_s for o in answered if o.ttft_s is not None]),
        "tokens_per_s": _median(speeds) if speeds else None,
        "completion_tokens": tokens,
        "cost_usd": round(sum(costs), 8) if costs else None,
        "cost_per_1k_completion_usd": (round(sum(costs) / tokens * 1000, 6)
                                       if costs and tokens else None),
    }
    out.update(trigger_agreement(obs, reference))
    return out


def trigger_agreement(obs: list[Observation], reference: dict[str, Observation] | None
                      ) -> dict[str, Any]:
    """Tool-call triggering against the reference, over canaries with tools both answered."""
    if reference is None:
        return {"trigger_f1": None, "trigger_agreement": None, "trigger_compared": 0}
    tp = fp = fn = tn = 0
    for o in obs:
        ref = reference.get(o.canary)
        if not (o.ok and o.has_tools and ref is not None and ref.ok):
            continue
        if o.triggered and ref.triggered:
            tp += 1
        elif o.triggered:
            fp += 1
        elif ref.triggered:
            fn += 1
        else:
            tn += 1
    n = tp + fp + fn + tn
    return {"trigger_f1": 1.0 if n and tp + fp + fn == 0 else _share(2 * tp, 2 * tp + fp + fn),
            "trigger_agreement": _share(tp + tn, n), "trigger_compared": n}


@dataclass(frozen=True, slots=True)
class Thresholds:
    """What a provider must show to be kept (a figure that could not be measured passes,
    except the success rate)."""

    min_schema_accuracy: float = 0.95
    min_trigger_f1: float = 0.8
    min_witness: float = 0.9
    min_success: float = 0.8
    min_reasoning: float = 0.9

    def to_json(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__slots__}


# figure -> (the answers it rests on, its Thresholds field, its name in words)
JUDGED = {"success_rate": ("requests", "min_success", "answered"),
          "schema_accuracy": ("tool_calls", "min_schema_accuracy", "schema accuracy"),
          "trigger_f1": ("trigger_compared", "min_trigger_f1", "tool-call trigger F1"),
          "witness_agreement": ("witness_judged", "min_witness", "count-witness agreement"),
          "reasoning_present": ("reasoning_asked", "min_reasoning",
                                "reasoning present when asked")}
Z95 = 1.96  # two-sided 95%


def min_answers(floor: float) -> int:
    """The fewest answers a share must rest on before falling under `floor` drops a
    provider: the smallest n whose 95% margin for a share, at its widest (z * 1/2 / sqrt(n)),
    is narrower than the floor's distance from a coin flip (1/2), so a figure at chance level
    is told apart from one at the floor (docs/probe.md, "Too few answers"). Floors under 0.6
    are held 0.1 from a coin flip (n = 97)."""
    gap = max(floor - 0.5, 0.1)
    return math.floor((Z95 / (2 * gap)) ** 2) + 1


def verdict(m: dict[str, Any], th: Thresholds, *, require_witness: bool = False
            ) -> tuple[list[str], dict[str, str]]:
    """(why an endpoint's figures miss the thresholds — empty: it is kept; by figure, those
    under their floor that rest on too few answers to say so, which do not drop it)."""
    out: list[str] = []
    thin: dict[str, str] = {}
    if not m["requests"]:
        out.append(f"not measured: its {m['unsent']} canaries were left unsent at the "
                   "cost cap" if m.get("unsent") else "not measured: no canary sent")
        return out, thin
    if not m["answered"]:
        out.append(f"answered 0/{m['requests']} (errors: {m['errors'] or 'none'})")
    for key, (n_key, floor_key, what) in JUDGED.items():
        value, n, floor = m.get(key), m.get(n_key) or 0, getattr(th, floor_key)
        if value is None or value >= floor or not m["answered"]:
            continue
        shown = (f"{m['answered']}/{m['requests']} ({value:.0%})" if key == "success_rate"
                 else f"{value:.0%}")
        need = min_answers(floor)
        if n < need:
            thin[key] = (f"{what} {shown} < {floor:.0%} rests on too few answers (n={n}, "
                         f"needs {need}): not used to drop it")
        elif key == "success_rate":
            out.append(f"answered {shown} (< {floor:.0%}; errors: {m['errors'] or 'none'})")
        else:
            out.append(f"{what} {shown} < {floor:.0%} (n={n})")
    if require_witness and m["answered"] and m["witness_agreement"] is None:
        out.append("no count witness ([quality] require_witness = true)")
    return out, thin
