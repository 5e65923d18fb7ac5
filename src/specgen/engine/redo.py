"""Redo: the samples of a provider excluded during a run are made again by the providers that
remain, so the dataset ends complete (`[quality] redo_excluded`, docs/quality.md, "Redoing an
excluded provider's work").

The one decision here: which conversations are made again and from which turn. A
conversation is redone from the first turn whose stored sample came from an excluded
provider: its later turns were planned on that answer (on-policy history, tool results paired
with its calls), so they go too, whoever answered them. `Store.supersede` carries it out in
one transaction: the samples move to `superseded_results` (paid for: kept, never exported),
the tail's first task is pending again (the planner makes the later ones anew), the
conversations reopen, and `redone` records it. After a kill the store holds the redo whole or not at all; a redo not yet made is made at the
next start (its samples are still in `results`), one made is never made twice (its samples
are gone from `results`).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from ..exclusions import keys_of, name_key
from ..store import Store

WHY = "provider_excluded"  # superseded_results.superseded_why; attempts' `superseded:` outcome


@dataclass(slots=True)
class Redo:
    providers: list[str]
    conversations: int
    tasks: int  # tasks made pending again (the planner makes them anew)
    samples: int  # stored samples superseded
    conversation_ids: list[int]

    @property
    def message(self) -> str:
        return (f"redo: {self.samples:,} sample(s) of excluded provider(s) "
                f"{', '.join(self.providers)} superseded; {self.tasks:,} task(s) of "
                f"{self.conversations:,} conversation(s) made again by the providers that "
                "remain ([quality] redo_excluded)")


def providers_to_redo(excluded: dict[str, dict[str, Any]],
                      setting: bool | str) -> dict[str, dict[str, Any]]:
    """The exclusions whose work is redone: automatic ones (`true`), all (`"all"`), none."""
    if setting is False:
        return {}
    return {name: info for name, info in excluded.items()
            if setting == "all" or (isinstance(info, dict) and info.get("by") == "auto")}


def tails(conn: sqlite3.Connection, keys: set[str]) -> dict[int, int]:
    """{conversation: first turn} of the stored samples whose provider matches `keys`."""
    names = [p for (p,) in conn.execute(
        "SELECT DISTINCT provider FROM results WHERE provider IS NOT NULL") if name_key(p) in keys]
    if not names:
        return {}
    return dict(conn.execute(
        f"SELECT conversation, MIN(turn) FROM results WHERE provider IN "
        f"({','.join('?' * len(names))}) GROUP BY conversation", names))


def redo(store: Store, excluded: dict[str, dict[str, Any]], setting: bool | str, *,
         session: int | None, skip: set[int] | frozenset[int] = frozenset()) -> Redo | None:
    """Supersede the excluded providers' samples and reopen their conversations (None: none
    to redo). `skip`: conversations not to redo again (already redone this session)."""
    chosen = providers_to_redo(excluded, setting)
    if not chosen:
        return None
    found = {c: t for c, t in tails(store.conn, keys_of(chosen)).items() if c not in skip}
    if not found:
        return None
    names = sorted(chosen)
    n_tasks, n_samples = store.supersede(found, session=session, providers=", ".join(names),
                                         why=WHY, now=time.time())
    return Redo(names, len(found), n_tasks, n_samples, sorted(found))


def reopened(conn: sqlite3.Connection, conversations: list[int]) -> list[tuple]:
    """The conversations rows (as `Store.open_conversations` yields them) of a redo."""
    return [row for cid in conversations for row in conn.execute(
        "SELECT id, dataset, conv_id, row_index, status, data FROM conversations WHERE id=? "
        "AND status IN ('pending', 'active')", (cid,))]
