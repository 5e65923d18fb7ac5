"""Provider policing: per answering provider, rolling quality figures, and the decision to stop
routing to one that falls below the thresholds (`[quality] auto_exclude`).

Figures per provider, each over the last `window` relevant answers (plus totals):

* schema accuracy — of the answers with tool calls, the share whose calls fit the declared
  schemas (a `schema_mismatch`, `bad_tool_arguments` or `unknown_tool` quarantine is a miss);
* count agreement — of the answers the count witness judged (after it learnt the provider's
  offset), the share it found `exact` or `repaired` rather than `mismatch`;
* quarantine rate — of the answers normalised, the share quarantined for a reason the other
  figures do not watch (not schema or count; nor `length`, which max_tokens decides), by
  reason;
* mismatch rate — of all answers, the share from another model or quantization than allowed
  (rejected `wrong_model` / `quantization:*`, or a revealed quantization the provider's
  endpoints do not declare).

`ProviderPolicing.observe` is the one entry point: it counts an answer and returns an
`Exclusion` when its provider must go (once per provider; `reset` gives it a fresh start).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .observe import SCHEMA_FAILURES, UNKNOWN, Observation, Rolling

# metric -> (its config key, the figure is a floor (accuracy) or a ceiling (rate), label)
METRICS: dict[str, tuple[str, bool, str]] = {
    "schema": ("min_schema_accuracy", True, "schema accuracy"),
    "count": ("min_count_agreement", True, "count agreement"),
    "quarantine": ("max_quarantine_rate", False, "quarantine rate"),
    "mismatch": ("max_mismatch_rate", False, "model/quantization mismatch rate"),
}
MISMATCH_REJECTIONS = ("wrong_model", "quantization:")
ELSEWHERE = SCHEMA_FAILURES | {"count_mismatch", "length"}  # not in the quarantine rate


@dataclass(slots=True)
class Exclusion:
    """Stop routing to `provider`: `metric` fell past its threshold with these figures."""

    provider: str
    metric: str
    value: float  # the figure (accuracy or rate) over the window
    threshold: float
    samples: int  # relevant answers in the window
    examples: list[dict[str, Any]] = field(default_factory=list)
    # an alarm whose evidence sat on this provider (quality.blame): its name, dataset,
    # figures and what, in words, it counts; `metric` is then "alarm:<name>"
    alarm: dict[str, Any] | None = None

    @property
    def message(self) -> str:
        if self.alarm is not None:
            return self._alarm_message(self.alarm)
        floor, label = METRICS[self.metric][1], METRICS[self.metric][2]
        sign = "<" if floor else ">"
        ex = ", ".join(f"task {e['task']}" for e in self.examples[:3])
        return (f"provider {self.provider!r} excluded: {label} {100 * self.value:.0f}% {sign} "
                f"{100 * self.threshold:.0f}% over its last {self.samples} answers"
                + (f" (e.g. {ex})" if ex else ""))

    def _alarm_message(self, a: dict[str, Any]) -> str:
        sign = "<" if a["below"] else ">"
        ex = ", ".join(f"task {e['task']}" for e in self.examples[:3])
        others = a["others"]
        return (f"provider {self.provider!r} excluded by alarm {a['alarm']} on dataset "
                f"{a['dataset']!r} ({100 * a['share']:.0f}% of the last {a['samples']} "
                f"{a['what']}, {sign} {100 * self.threshold:g}%): {100 * self.value:.0f}% of "
                f"its {self.samples} answers, against {100 * others['figure']:.0f}% of the "
                f"other providers' {others['answers']}" + (f" (e.g. {ex})" if ex else ""))

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "metric": self.metric,
                "value": round(self.value, 4), "threshold": self.threshold,
                "samples": self.samples, "examples": self.examples,
                **({"alarm": self.alarm} if self.alarm is not None else {})}


class ProviderFigures:
    """The rolling figures of one provider. Rolling entries count misses: calls that do not
    fit, counts that contradict, quarantines, mismatches."""

    __slots__ = ("schema", "count", "quarantine", "mismatch", "answers")

    def __init__(self, window: int):
        self.schema = Rolling(window)
        self.count = Rolling(window)
        self.quarantine = Rolling(window)
        self.mismatch = Rolling(window)
        self.answers = 0

    def add(self, o: Observation) -> None:
        if o.rejudged:  # a pending sample judged again: only its count verdict is news
            if o.count_check is not None:
                miss = o.count_check == "mismatch"
                self.count.add(miss, o.task, o.provider, "count_mismatch" if miss else None)
            return
        self.answers += 1
        rejected = o.outcome == "rejected"
        mismatched = o.quantization_mismatch or (
            rejected and (o.reason or "").startswith(MISMATCH_REJECTIONS))
        self.mismatch.add(mismatched, o.task, o.provider, o.reason if rejected else
                          ("quantization_revealed" if mismatched else None))
        if rejected:
            return
        quarantined = o.outcome == "quarantined"
        other = quarantined and o.reason not in ELSEWHERE
        self.quarantine.add(other, o.task, o.provider, o.reason if other else None)
        if o.calls and (o.tools_offered or not quarantined):
            miss = quarantined and o.reason in SCHEMA_FAILURES
            self.schema.add(miss, o.task, o.provider, o.reason if miss else None)
        if o.counts_unusable:  # its counts vouch for nothing: a miss of the agreement
            self.count.add(True, o.task, o.provider, "counts_unusable")
        elif o.count_check is not None:
            miss = o.count_check == "mismatch"
            self.count.add(miss, o.task, o.provider, "count_mismatch" if miss else None)

    def value(self, metric: str) -> float:
        """The figure as configured: accuracy / agreement (1 - miss share) or a rate."""
        rolling: Rolling = getattr(self, metric)
        return 1.0 - rolling.share if METRICS[metric][1] else rolling.share

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"answers": self.answers}
        for metric, (_key, floor, _label) in METRICS.items():
            r: Rolling = getattr(self, metric)
            out[metric] = {**r.to_json(),
                           "value": round(1.0 - r.share if floor else r.share, 4) if r.n else None}
        out["quarantine"]["reasons"] = self.quarantine.window_labels()
        out["quarantine"]["reasons_total"] = dict(self.quarantine.labels.most_common())
        return out


class ProviderPolicing:
    """Rolling figures per provider and the exclusion decision (`cfg` is QualityConfig)."""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.figures: dict[str, ProviderFigures] = {}
        self.excluded: set[str] = set()  # decided here (or told by the engine) this session

    def observe(self, o: Observation) -> Exclusion | None:
        """Count one answer; an Exclusion when its provider must be excluded now."""
        fig = self.figures.get(o.provider)
        if fig is None:
            fig = self.figures[o.provider] = ProviderFigures(self.cfg.window)
        fig.add(o)
        if not self.cfg.auto_exclude or o.provider == UNKNOWN or o.provider in self.excluded:
            return None
        decision = self.judge(o.provider, fig)
        if decision is not None:
            self.excluded.add(o.provider)
        return decision

    def judge(self, provider: str, fig: ProviderFigures) -> Exclusion | None:
        """The first figure past its threshold with at least `min_samples` answers behind it."""
        for metric, (key, floor, _label) in METRICS.items():
            rolling: Rolling = getattr(fig, metric)
            if rolling.n < self.cfg.min_samples:
                continue
            threshold = float(getattr(self.cfg, key))
            value = fig.value(metric)
            if (value < threshold) if floor else (value > threshold):
                return Exclusion(provider, metric, value, threshold, rolling.n,
                                 rolling.examples())
        return None

    def mark(self, provider: str, excluded: bool) -> None:
        """The engine excluded (or allowed back) a provider by other means: an allowed
        provider starts afresh, so old answers do not exclude it again at once."""
        if excluded:
            self.excluded.add(provider)
            return
        self.excluded = {n for n in self.excluded if n.lower() != provider.lower()}
        for name in [n for n in self.figures if n.lower() == provider.lower()]:
            self.figures[name] = ProviderFigures(self.cfg.window)

    def to_json(self) -> dict[str, Any]:
        return {name: fig.to_json() for name, fig in sorted(self.figures.items())}
