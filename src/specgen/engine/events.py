"""The run's event log: what happened when (error classes, stops, budgets, alarms), written
to the store's `events` table with the next commit."""

from __future__ import annotations

import logging
import time

from ..records import EventRecord
from .writer import StoreWriter

log = logging.getLogger("specgen.engine")


class EventLog:
    def __init__(self, writer: StoreWriter, session_id: int):
        self.writer = writer
        self.session_id = session_id
        self._once: set[tuple[str, str]] = set()

    def add(self, kind: str, dataset: str | None, provider: str | None, detail: str) -> None:
        self.writer.batch.events.append(EventRecord(
            ts=time.time(), session=self.session_id, kind=kind, dataset=dataset,
            provider=provider, detail=detail))

    def counted(self, kind: str, dataset: str | None, provider: str | None,
                detail: str) -> None:
        """Record every event of this kind (they are counted); log the first per dataset
        and provider in the session."""
        key = (kind, f"{dataset}|{provider}")
        self.add(kind, dataset, provider, detail)
        if key not in self._once:
            self._once.add(key)
            log.warning("%s", detail)

    def once(self, kind: str, dataset: str | None, provider: str | None, detail: str) -> None:
        """Record (and log as a warning) the first event of this kind per dataset and
        provider in the session; later ones are dropped."""
        key = (kind, f"{dataset}|{provider}")
        if key not in self._once:
            self._once.add(key)
            self.add(kind, dataset, provider, detail)
            log.warning("%s", detail)
