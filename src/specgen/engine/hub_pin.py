"""Hub datasets pinned to a run (docs/datasets.md, "From the Hub").

Before the first request, every `hf://` dataset is resolved: at the run's first session its
revision becomes a commit and the chosen files are listed, and that plan is stored in the run
(meta `hub:<dataset>`, the store is the source of truth); every later session reads the stored
plan, so a branch that moved upstream changes nothing (the move is noted). The files are then
fetched into the Hugging Face cache (or found there, offline) and handed to the readers.
"""

from __future__ import annotations

import orjson

from ..sources.hub import HubPlan, current_commit, download_plan, plan_hub
from ..sources.pins import MOVED_PREFIX, PIN_PREFIX


def pin_hub_sources(store, datasets) -> list[str]:
    """Resolve and fetch the run's Hub datasets; notes to show (a moved upstream branch).
    Raises specgen.sources.hub.HubError with what to do when one cannot be read."""
    notes = []
    for ds in datasets:
        if ds.hub is None:
            continue
        key = PIN_PREFIX + ds.name
        stored = store.get_meta(key)
        if stored:
            plan = HubPlan.from_json(orjson.loads(stored))
            now = current_commit(plan.repo, plan.revision)
            if now is not None and now != plan.commit:
                note = (f"dataset {ds.name!r}: revision {plan.revision!r} of hf://datasets/"
                        f"{plan.repo} now points at {now[:12]} upstream; this run keeps "
                        f"reading its pinned commit {plan.commit[:12]} (--force-new to start "
                        "over on the new one)")
                notes.append(note)
            if now is not None:
                store.set_meta(MOVED_PREFIX + ds.name, "" if now == plan.commit else now)
        else:  # pinned before the download: a session killed meanwhile resumes this commit
            plan = plan_hub(ds.hub, ds.revision, ds.subset, ds.split, ds.name)
            store.set_meta(key, orjson.dumps(plan.to_json()).decode())
        ds.files = download_plan(plan, ds.name)
    return notes
