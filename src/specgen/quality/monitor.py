"""The quality monitor of a running engine: provider policing and dataset alarms behind one
entry point. The engine hands it every answer (`observe`) and carries out what comes back;
it never decides itself (docs/quality.md, "Policing and alarms"). Whose fault a fired alarm
is, `quality.blame` decides: with `auto_exclude` an alarm one provider causes becomes that
provider's exclusion, and the alarm is judged again over the others' answers."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Collection
from typing import Any

from .alarms import Alarm, DatasetAlarms, alarm_rules
from .blame import PROVIDER_CAUSED, Blame, Share, blame
from .observe import UNKNOWN, Observation
from .policing import Exclusion, ProviderPolicing

Decision = Exclusion | Alarm


class QualityMonitor:
    """`observe(obs)` -> the decisions this answer triggers (exclusions, then an alarm).

    `run_dir`: named in the command an alarm's message gives; `routable(names)`: whether a
    provider the run's policy allows remains once `names` are excluded (the engine's
    `ProviderPolicy.routable_without`)."""

    def __init__(self, cfg: Any, run_dir: str = "RUN_DIR",
                 routable: Callable[[Collection[str]], bool] = lambda _names: True):
        self.cfg = cfg
        self.run_dir = str(run_dir)
        self.routable = routable
        self.policing = ProviderPolicing(cfg)
        self.alarms = DatasetAlarms(alarm_rules(cfg.alarms), cfg.window)

    @property
    def gone(self) -> set[str]:
        """The providers excluded this session, lower-case."""
        return {p.lower() for p in self.policing.excluded}

    def observe(self, obs: Observation) -> list[Decision]:
        out: list[Decision] = []
        gone = obs.provider.lower() in self.gone  # (the engine rejects its answers)
        exclusion = self.policing.observe(obs)
        if exclusion is not None:
            out.append(exclusion)
        if gone:
            return out  # an answer of a provider excluded before it counts for no alarm
        self.alarms.count(obs)
        # An alarm that waits for answers, or that an exclusion answered, leaves the others
        # to be judged (over the windows that remain); one alarm fires per answer at most.
        waiting: set[str] = set()
        while (alarm := self.alarms.judge(obs.dataset, waiting)) is not None:
            decided = self._blamed(alarm, waiting)
            out += decided
            if any(isinstance(d, Alarm) for d in decided):
                break
        return out

    def _blamed(self, alarm: Alarm, waiting: set[str]) -> list[Decision]:
        """A fired alarm as the blame rule has it: with `auto_exclude`, the exclusion of the
        providers that cause it (their answers leave every window, and the alarm is re-armed
        over the others') or nothing yet (re-armed: the rule waits for answers); else the
        alarm, naming whose fault it is."""
        if alarm.name not in PROVIDER_CAUSED:
            return [alarm]
        window = self.alarms.window_of(alarm.dataset, alarm.name).recent
        b = blame(alarm.rule, window, window.maxlen, self.routable)
        if self.cfg.auto_exclude and b.verdict in ("exclude", "wait"):
            self.alarms.rearm(alarm.dataset, alarm.name)
            if b.verdict == "wait":
                waiting.add(alarm.name)
                return []
            out: list[Decision] = [self._exclusion(alarm, b, s) for s in b.suspects]
            self.excluded(b.providers)
            return out
        alarm.cause, alarm.remedy, alarm.blame = b.cause(), self._remedy(b), b.to_json()
        return [alarm]

    def _exclusion(self, alarm: Alarm, b: Blame, s: Share) -> Exclusion:
        r = alarm.rule
        return Exclusion(
            s.provider, f"alarm:{r.name}", s.figure(r), r.threshold, s.answers,
            [e for e in alarm.examples if e["provider"] == s.provider],
            alarm={"alarm": r.name, "dataset": alarm.dataset, "share": round(alarm.share, 4),
                   "samples": alarm.samples, "below": r.below, "what": r.what,
                   "others": b.to_json()["others"]})

    def _remedy(self, b: Blame) -> str | None:
        """The exact command that excludes each provider the alarm is blamed on."""
        if b.verdict not in ("exclude", "wait", "unproven"):
            return None
        names = b.providers if b.verdict == "exclude" else tuple(
            s.provider for s in b.by_provider if s.provider != UNKNOWN and s.passes(b.rule))
        if not names or (b.verdict != "exclude" and not self.routable(names)):
            return None
        where = shlex.quote(self.run_dir)
        cmds = " and ".join(f"`specgen provider {where} --exclude {shlex.quote(n)}`"
                            for n in names)
        return f"{cmds} excludes it" + ("" if self.cfg.auto_exclude else
                                        " (`[quality] auto_exclude = true` does it itself)")

    def excluded(self, providers: Collection[str]) -> None:
        """Providers left out of the run (by the blame rule, the policing, or by hand): the
        alarms forget their answers and are judged over the providers that remain."""
        for name in providers:
            self.policing.mark(name, True)
        self.alarms.forget({p.lower() for p in providers})

    def to_json(self) -> dict[str, Any]:
        return {"providers": self.policing.to_json(), "alarms": self.alarms.to_json(),
                "auto_exclude": bool(self.cfg.auto_exclude), "on_alarm": self.cfg.on_alarm}
