"""The quality monitor of a running engine: provider policing and dataset alarms behind one
entry point. The engine hands it every answer (`observe`) and carries out what comes back;
it never decides itself (docs/quality.md, "Policing and alarms")."""

from __future__ import annotations

from typing import Any

from .alarms import Alarm, DatasetAlarms, alarm_rules
from .observe import Observation
from .policing import Exclusion, ProviderPolicing

Decision = Exclusion | Alarm


class QualityMonitor:
    """`observe(obs)` -> the decisions this answer triggers (exclusions, then an alarm)."""

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.policing = ProviderPolicing(cfg)
        self.alarms = DatasetAlarms(alarm_rules(cfg.alarms), cfg.window)

    def observe(self, obs: Observation) -> list[Decision]:
        out: list[Decision] = []
        exclusion = self.policing.observe(obs)
        if exclusion is not None:
            out.append(exclusion)
        alarm = self.alarms.observe(obs)
        if alarm is not None:
            out.append(alarm)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"providers": self.policing.to_json(), "alarms": self.alarms.to_json(),
                "auto_exclude": bool(self.cfg.auto_exclude), "on_alarm": self.cfg.on_alarm}
