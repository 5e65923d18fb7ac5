"""Alarms: per dataset, shares over a rolling window of its answers that say the semantics are
wrong, so the run stops (or pauses the dataset) before more budget goes.

Each alarm has a threshold and a minimum number of relevant answers, counted from the first
answers on (`[quality] alarms`; defaults in `ALARMS`). `DatasetAlarms.observe` is the one entry
point: it counts an answer and returns an `Alarm` the first time one fires for its dataset.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .observe import OWN_FIGURE, SCHEMA_FAILURES, UNKNOWN, Observation, Rolling


@dataclass(frozen=True, slots=True)
class AlarmRule:
    name: str
    threshold: float
    min_samples: int
    below: bool  # fires when the share falls below the threshold (else: rises above it)
    what: str  # what the share counts, for messages


# name -> (default threshold, default min samples, fires below?, what the share counts)
ALARMS: dict[str, tuple[float, int, bool, str]] = {
    "raw_markers": (0.2, 20, False, "answers with raw tool-call markers in content or "
                                    "reasoning"),
    "tool_calls": (0.02, 50, True, "answers to requests offering tools (not right after "
                                   "tool results) that call one"),
    "schema_mismatch": (0.2, 20, False, "answers with tool calls whose calls do not fit the "
                                        "declared schemas"),
    "count_mismatch": (0.2, 20, False, "judged answers whose provider counts contradict "
                                       "the sample"),
    "quarantine": (0.3, 20, False, "answers quarantined for a reason no other alarm watches"),
    "unverifiable": (0.5, 40, False, "answers quarantined, or whose provider's counts "
                                     "contradict them or cannot vouch for them (unusable "
                                     "counts), whatever the counting's state"),
    "empty": (0.2, 20, False, "empty answers"),
    "length": (0.5, 20, False, "answers cut at max_tokens (finish_reason length)"),
    "repetition": (0.1, 20, False, "answers with a repetition loop ([quality] repetition)"),
    # one answer quoting the API key or a proxy credential is one too many
    "secret_in_answer": (0.0, 1, False, "answers quoting the API key or a proxy credential "
                                        "(quarantined, stored masked)"),
}
ACTIONS = ("stop", "pause_dataset", "warn")
# What to change when an alarm fires (every alarm message ends with it).
FIXES: dict[str, str] = {
    "raw_markers": "the provider ignored `tools`: exclude it (`specgen provider RUN_DIR "
                   "--exclude NAME`, or `[endpoint.provider] ignore`), or `specgen probe` for "
                   "one that passes",
    "tool_calls": "no tool is called: check that the rows' tools reach the model (`specgen "
                  "preview`), or allow a provider that calls tools (`specgen probe`)",
    "schema_mismatch": "exclude the provider whose calls break the schemas (`specgen "
                       "provider RUN_DIR --exclude NAME`; `specgen probe` measures them)",
    "count_mismatch": "check `[target] tokenizer` / `renderer`, exclude the provider, or set "
                      "`[quality] count_witness = false`",
    "quarantine": "see the reasons (`specgen status`); allow another provider (`specgen "
                  "probe`) or fix what the reason names",
    "empty": "raise `max_tokens` (reasoning may use it all), or allow another provider",
    "length": "raise `max_tokens` ([sampling] or the dataset's), or keep cut answers with "
              "the dataset's `on_length = \"keep\"`",
    "unverifiable": "the provider's counts cannot vouch for its answers: exclude it (`specgen "
                    "provider RUN_DIR --exclude NAME`, or `[quality] auto_exclude = true`), "
                    "check `[target] tokenizer`, or accept them unverified (`[quality] alarms = { "
                    "unverifiable = false }`)",
    "repetition": "the model loops: lower `max_tokens` or change `[sampling]` (e.g. "
                  "repetition/presence penalties), or drop the loops "
                  "(`[quality] repetition = { action = \"quarantine\" }`, or export with "
                  "`--max-repetition`)",
    "secret_in_answer": "a relay, proxy or provider echoes the request's headers into answers, "
                        "or the dataset holds the key: rotate the key, exclude the provider "
                        "(`specgen provider RUN_DIR --exclude NAME`) or go direct, and check "
                        "the rows (`specgen status` names the tasks)",
}


def alarm_rules(spec: Any, where: str = "config") -> dict[str, AlarmRule]:
    """The alarm rules of `[quality] alarms`: `false` turns every alarm off; a table maps an
    alarm name to a threshold, `false` (off), or `{threshold, min_samples}`. Unlisted alarms
    keep their defaults. Raises ConfigError naming the key."""
    if spec is False:
        return {}
    if spec is True or spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: quality.alarms must be a table or false, got {spec!r}")
    unknown = sorted(set(spec) - set(ALARMS))
    if unknown:
        raise ConfigError(f"{where}: unknown alarm(s) in quality.alarms: {', '.join(unknown)} "
                          f"(known: {', '.join(ALARMS)})")
    rules = {}
    for name, (threshold, min_samples, below, what) in ALARMS.items():
        value = spec.get(name, threshold)
        key = f"quality.alarms.{name}"
        if value is False:
            continue
        if isinstance(value, dict):
            extra = sorted(set(value) - {"threshold", "min_samples"})
            if extra:
                raise ConfigError(f"{where}: {key} has unknown key(s) {', '.join(extra)} "
                                  "(known: threshold, min_samples)")
            threshold = value.get("threshold", threshold)
            min_samples = value.get("min_samples", min_samples)
        else:
            threshold = value
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) \
                or not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"{where}: {key} threshold must be a share in [0, 1] (or false "
                              f"to turn the alarm off), got {threshold!r}")
        if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
            raise ConfigError(f"{where}: {key}.min_samples must be an integer >= 1, got "
                              f"{min_samples!r}")
        rules[name] = AlarmRule(name, float(threshold), min_samples, below, what)
    return rules


@dataclass(slots=True)
class Alarm:
    """An alarm fired on a dataset: `share` of `samples` answers (threshold, examples)."""

    dataset: str
    rule: AlarmRule
    share: float
    samples: int
    examples: list[dict[str, Any]] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    # whose fault it is (quality.blame), in words and as figures (None for an alarm no
    # provider can cause), and the command that excludes the provider it is blamed on
    cause: str | None = None
    blame: dict[str, Any] | None = None
    remedy: str | None = None

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def message(self) -> str:
        r = self.rule
        sign = "<" if r.below else ">"
        ex = ", ".join(f"task {e['task']} ({example_provider(e['provider'])})"
                       for e in self.examples)
        why = ", ".join(f"{k} {v}" for k, v in self.reasons.items())
        return (f"alarm {r.name} on dataset {self.dataset!r}: {100 * self.share:.0f}% of the "
                f"last {self.samples} {r.what} ({sign} {100 * r.threshold:g}% after "
                f"{r.min_samples})" + (f" [{why}]" if why else "")
                + (f"; examples: {ex}" if ex else "")
                + (f"; {self.cause}" if self.cause else "")
                + (f": {self.remedy}" if self.remedy else "") + f"; to fix: {self._fix}")

    @property
    def fix(self) -> str:
        """What to change (kept with a fired alarm, shown while it stands): the command
        that excludes the provider it is blamed on first, when there is one."""
        return (f"{self.remedy}; " if self.remedy else "") + self._fix

    @property
    def _fix(self) -> str:
        return (f"{FIXES.get(self.rule.name, 'see docs/quality.md')}; or rerun with "
                f"`--ack-alarm {self.rule.name}` to go on as it is")

    def to_json(self) -> dict[str, Any]:
        r = self.rule
        return {"alarm": r.name, "dataset": self.dataset, "share": round(self.share, 4),
                "samples": self.samples, "threshold": r.threshold, "below": r.below,
                "min_samples": r.min_samples, "examples": self.examples,
                "reasons": self.reasons, **({"blame": self.blame} if self.blame else {})}


def _relevant(name: str, o: Observation) -> bool | None:
    """None when the answer does not count for this alarm, else whether it is a hit (for a
    `below` alarm: a miss, an answer without what should be there)."""
    if o.outcome == "rejected":
        return None
    if o.rejudged and name not in ("count_mismatch", "unverifiable"):
        return None  # counted when it arrived
    quarantined = o.outcome == "quarantined"
    if name == "raw_markers":
        return o.raw_markers
    if name == "tool_calls":
        return (not o.calls) if o.tools_offered and not o.after_tool_result else None
    if name == "schema_mismatch":
        if not o.calls or (quarantined and not o.tools_offered):
            return None
        return quarantined and o.reason in SCHEMA_FAILURES
    if name == "count_mismatch":
        return None if o.count_check is None else o.count_check == "mismatch"
    if name == "quarantine":
        return quarantined and o.reason not in OWN_FIGURE
    if name == "unverifiable":
        if o.witness == "pending":
            return None  # counted once judged again (o.rejudged)
        return (quarantined and o.reason != "length") or o.witness == "mismatch" \
            or o.counts_unusable
    if name == "empty":
        return quarantined and o.reason == "empty"
    if name == "length":
        return o.truncated or (quarantined and o.reason == "length")
    if name == "repetition":
        return o.repetition
    if name == "secret_in_answer":
        return quarantined and o.reason == "secret_in_answer"
    return None


def _label(o: Observation) -> str | None:
    if o.counts_unusable:
        return "counts_unusable"
    return "count_mismatch" if o.witness == "mismatch" else None


class DatasetAlarms:
    """Rolling shares per dataset and alarm; each alarm fires at most once per dataset."""

    def __init__(self, rules: dict[str, AlarmRule], window: int):
        self.rules = rules
        self.window = window
        self.shares: dict[str, dict[str, Rolling]] = {}
        self.fired: dict[str, list[str]] = {}  # dataset -> alarms fired

    def observe(self, o: Observation) -> Alarm | None:
        """Count one answer of its dataset; the first alarm that fires, if any."""
        self.count(o)
        return self.judge(o.dataset)

    def count(self, o: Observation) -> None:
        """Count one answer in the windows of the alarms it is relevant to."""
        if not self.rules:
            return
        shares = self.shares.get(o.dataset)
        if shares is None:
            shares = self.shares[o.dataset] = {n: Rolling(self.window) for n in self.rules}
        for name in self.rules:
            hit = _relevant(name, o)
            if hit is not None:
                shares[name].add(hit, o.task, o.provider,
                                 (o.reason or _label(o)) if hit else None)

    def judge(self, dataset: str, skip: Collection[str] = ()) -> Alarm | None:
        """The first alarm of the dataset (in `ALARMS` order, not fired yet nor in `skip`)
        whose window passes its threshold: marked fired and returned."""
        shares = self.shares.get(dataset) or {}
        fired = self.fired.setdefault(dataset, [])
        for name, rule in self.rules.items():
            rolling = shares.get(name)
            if (rolling is None or name in fired or name in skip
                    or rolling.n < rule.min_samples):
                continue
            share = 1.0 - rolling.share if rule.below else rolling.share
            if (share < rule.threshold) if rule.below else (share > rule.threshold):
                fired.append(name)
                return Alarm(dataset, rule, share, rolling.n, rolling.examples(),
                             rolling.window_labels())
        return None

    def window_of(self, dataset: str, name: str) -> Rolling:
        """An alarm's rolling window on a dataset (empty when it saw no answer)."""
        return self.shares.get(dataset, {}).get(name) or Rolling(self.window)

    def rearm(self, dataset: str, name: str) -> None:
        """The alarm may fire again on this dataset (its cause went with an excluded
        provider, or the rule waits for more answers)."""
        fired = self.fired.get(dataset)
        if fired and name in fired:
            fired.remove(name)

    def forget(self, providers: set[str]) -> int:
        """Drop the answers of `providers` (lower-case names) from every window: the
        alarms are judged again over the providers that remain."""
        return sum(r.forget(providers) for shares in self.shares.values()
                   for r in shares.values())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for ds, shares in sorted(self.shares.items()):
            out[ds] = {n: {**r.to_json(), "threshold": self.rules[n].threshold,
                           "below": self.rules[n].below} for n, r in shares.items() if r.n}
            if self.fired.get(ds):
                out[ds]["fired"] = list(self.fired[ds])
        return out


def example_provider(name: str) -> str:
    """An example's provider as words: `(unknown)` would read `task 61 ((unknown))`."""
    return "no provider named" if name == UNKNOWN else name
