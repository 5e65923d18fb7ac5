"""How a run stands, in words, for every reader: its state from the last session (`status`, the
report), and the outcome banner — done, running, stopped, unproductive or failed, with the
cause and what to do — that the report opens with and whose next step the run summary ends
with. One place, so the summary, `status` and the report never tell different stories.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .liveness import session_alive


def session_state(last: dict[str, Any] | None, heartbeat_interval: float,
                  now: float | None = None) -> tuple[str, str | None]:
    """(state, reason) of a run from its last session: "running" only while its process
    heartbeats; a session that died without recording its end reads as stopped, saying so."""
    now = time.time() if now is None else now
    if last is None:
        return "stopped", "never started"
    if last["state"] != "running":
        return last["state"], last["stop_reason"]
    if session_alive(last, heartbeat_interval=heartbeat_interval, now=now):
        return "running", None
    age = now - (last["heartbeat_at"] or last["started_at"] or now)
    return "stopped", (f"process {last['pid']} on {last['host']} ended without a clean stop "
                       f"(last heartbeat {age:.0f}s ago); rerun to resume")


@dataclass(frozen=True, slots=True)
class Banner:
    kind: str  # done | running | stopped | unproductive | failed (the colour)
    headline: str
    cause: str
    todo: str


def next_step(state: str, reason: str | None) -> str | None:
    """What to do after a session that ended in `state` (None: nothing is needed)."""
    reason = reason or ""
    if state == "stopped" and "--ack-alarm" in reason:
        return ("make the change the alarm names and rerun, or rerun with --ack-alarm NAME to "
                "go on as it is (a plain rerun stops again)")
    if state == "stopped":
        return "rerun the same command to resume"
    if state == "incomplete":
        return "rerun with --retry-failed to send the failed tasks again with a fresh budget"
    if state == "unproductive":
        return ("change what the reason names, then rerun (`--force-new` when the change "
                "alters results: docs/engine.md, \"Exit codes\")")
    if state == "failed":
        return "fix the cause above, then rerun the same command to resume"
    return None


def outcome_banner(state: str, reason: str | None, verdict: str | None, *, kept: int,
                   answered: int, run_dir: str) -> Banner:
    """The run's outcome for the report's first screen. A session that finished but whose
    run kept too few samples (`verdict`, specgen.judgement) is unproductive."""
    if state == "finished" and verdict:
        state, reason = "unproductive", verdict
    yield_text = (f"{kept:,} of {answered:,} answered task(s) kept" if answered
                  else "no answered task")
    if state == "finished":
        return Banner("done", f"Done: {yield_text}", reason or "all datasets done",
                      f"train on it: specgen export {run_dir} --format tokens (see \"Ready to "
                      "train?\" below)")
    if state == "running":
        return Banner("running", f"Running: {yield_text} so far",
                      "a session is writing to this run now; this report is a snapshot",
                      f"specgen status {run_dir} for live figures; report again when it ends")
    if state == "unproductive":
        return Banner("unproductive", f"Unproductive: {yield_text}",
                      reason or "too few samples kept", next_step("unproductive", reason) or "")
    if state == "failed":
        return Banner("failed", "Failed", reason or "no reason recorded",
                      next_step("failed", reason) or "")
    if state == "incomplete":
        return Banner("stopped", f"Done with failed tasks: {yield_text}",
                      reason or "some tasks failed", next_step("incomplete", reason) or "")
    return Banner("stopped", f"Stopped: {yield_text}", reason or "no reason recorded",
                  next_step("stopped", reason) or "rerun the same command to resume")
