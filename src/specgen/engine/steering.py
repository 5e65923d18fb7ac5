"""Steering a running session: the requests other shells leave in the run dir (`specgen
stop`, `specgen provider --exclude/--allow`), and the decisions of the quality monitor
(exclude a provider, or an alarm: warn, pause the dataset, stop). The monitor decides; this
carries it out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import QualityConfig
from ..quality.alarms import Alarm
from ..quality.memory import META_FIRED, META_WINDOWS, cause_of, dump_windows
from ..quality.monitor import Decision, QualityMonitor
from ..quality.policing import Exclusion
from .control import clear_control, read_control
from .conversations import Conversations
from .events import EventLog
from .policy import ProviderPolicy
from .providers import META_KEY, encode_excluded, pending_requests
from .state import DsRun
from .stop import StopState
from .writer import StoreWriter

log = logging.getLogger("specgen.engine")


class Steering:
    def __init__(self, run_dir: Path, *, session_id: int, quality_cfg: QualityConfig,
                 policy: ProviderPolicy, monitor: QualityMonitor, book: Conversations,
                 datasets: dict[str, DsRun], writer: StoreWriter, events: EventLog,
                 stop: StopState, wake: Callable[[], None]):
        self.run_dir = run_dir
        self.session_id = session_id
        self.quality_cfg = quality_cfg
        self.policy = policy
        self.monitor = monitor
        self.book = book
        self.datasets = datasets
        self.writer = writer
        self.events = events
        self.stop = stop
        self.wake = wake
        self.alarms_fired: list[dict[str, Any]] = []
        # fired alarms of the whole run (the store's `alarms_fired`, quality.memory) and the
        # cause they are judged against; filled by loading
        self.remembered: dict[str, dict[str, dict[str, Any]]] = {}
        self.config_json: dict[str, Any] = {}  # the run's config as the store's meta has it

    # -- requests from other shells ---------------------------------------------------------
    def poll(self) -> None:
        for path, req in pending_requests(self.run_dir):
            path.unlink(missing_ok=True)
            name = req["name"].strip()
            if req["action"] == "exclude":
                self.exclude(name, "user", "specgen provider --exclude")
            else:
                self.allow(name)
        ctl = read_control(self.run_dir)
        if ctl is None:
            return
        clear_control(self.run_dir)
        if ctl.get("session") not in (None, self.session_id):
            return
        action = ctl.get("action")
        if action == "now":
            self.stop.request("specgen stop --now", now=True)
        elif action == "drain":
            self.stop.request("specgen stop")

    # -- the monitor's decisions ------------------------------------------------------------
    def carry_out(self, decision: Decision) -> None:
        if isinstance(decision, Exclusion):
            self.exclude(decision.provider, "auto", decision.message, decision.to_json())
        elif isinstance(decision, Alarm):
            self.alarm(decision)

    def exclude(self, name: str, by: str, reason: str,
                figures: dict[str, Any] | None = None) -> None:
        """Leave a provider out from now on: provider.ignore on every request, its answers
        rejected, recorded in the store (a resumed run keeps it out)."""
        if self.policy.is_excluded(name):
            return
        info: dict[str, Any] = {"by": by, "reason": reason, "at": time.time()}
        if figures:
            info["figures"] = figures
        self.policy.exclude(name, info)
        self.monitor.excluded([name])  # the alarms go on over the providers that remain
        self.writer.batch.meta[META_KEY] = encode_excluded(self.policy.excluded)
        self.events.add("provider_excluded", None, name, reason)
        log.warning("%s; `specgen provider %s --allow %s` puts it back", reason,
                    self.run_dir, name)
        self.check_routable()

    def allow(self, name: str) -> None:
        key = self.policy.allow(name)
        if key is None:
            log.warning("specgen provider --allow %s: no such provider is excluded", name)
            return
        self.monitor.policing.mark(key, False)
        self.writer.batch.meta[META_KEY] = encode_excluded(self.policy.excluded)
        self.events.add("provider_allowed", None, key, "specgen provider --allow")
        log.warning("provider %r allowed back (specgen provider --allow)", key)
        self.wake()

    def check_routable(self) -> None:
        """Stop when the exclusions leave no endpoint the policy allows."""
        if self.policy.endpoints and not self.policy.allowed_endpoints():
            self.stop.request(
                f"every provider the policy allows is excluded ({', '.join(self.policy.excluded)}"
                f"); `specgen provider {self.run_dir} --allow NAME` puts one back",
                kind="quality")

    def alarm(self, alarm: Alarm) -> None:
        action = self.quality_cfg.on_alarm
        self.alarms_fired.append({**alarm.to_json(), "action": action, "at": time.time()})
        self.events.add("alarm", alarm.dataset, None, f"{alarm.message} (on_alarm = {action})")
        self.remembered.setdefault(alarm.dataset, {})[alarm.name] = {
            "message": alarm.message, "fix": alarm.fix, "action": action, "at": time.time(),
            "session": self.session_id, "cause": self.cause}
        self.save_alarms()
        if action == "warn":
            log.warning("%s (on_alarm = warn: the run goes on)", alarm.message)
        elif action == "pause_dataset":
            log.error("%s: dataset paused (on_alarm = pause_dataset)", alarm.message)
            self.book.pause(self.datasets[alarm.dataset], alarm.message)
        else:
            log.error("%s: stopping (on_alarm = stop)", alarm.message)
            self.stop.request(f"{alarm.message} (on_alarm = stop)", kind="alarm")

    @property
    def cause(self) -> str:
        """What the alarms depend on now (quality.memory.cause_of)."""
        return cause_of(self.config_json, list(self.policy.excluded))

    def save_alarms(self) -> None:
        """The fired alarms and the alarm windows into the next commit (quality.memory)."""
        import json

        self.writer.batch.meta[META_FIRED] = json.dumps(self.remembered)
        self.writer.batch.meta[META_WINDOWS] = dump_windows(self.monitor.alarms, self.cause)

    def standing_alarm(self, dataset: str, name: str, rec: dict[str, Any]) -> None:
        """An alarm of an earlier session whose cause has not changed: carried out again
        at the start (stop, pause the dataset, or warn), saying how to clear it."""
        action = self.quality_cfg.on_alarm
        why = (f"{rec.get('message', f'alarm {name} on dataset {dataset!r}')} (standing since "
               f"session {rec.get('session', '?')}: nothing it depends on changed; a config "
               f"change or `specgen provider --allow/--exclude` clears it)")
        self.events.add("alarm_standing", dataset, None, why)
        if action == "warn" or dataset not in self.datasets:
            log.warning("%s (on_alarm = warn)", why)
        elif action == "pause_dataset":
            log.error("%s: dataset paused (on_alarm = pause_dataset)", why)
            self.book.pause(self.datasets[dataset], why)
        else:
            log.error("%s: stopping (on_alarm = stop)", why)
            self.stop.request(f"{why} (on_alarm = stop)", kind="alarm")
