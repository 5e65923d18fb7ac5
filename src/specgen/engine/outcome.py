"""How a session ended, and the exit code that says it truthfully (docs/engine.md, "Exit
codes"). 0 only when every task ended done or quarantined by policy (datasets that reached
their budget or limit count as done: that is the work asked for).
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILED = 1  # a fatal error: bad key, no endpoint, bad row, internal or store error
EXIT_USAGE = 2  # could not start: bad config, missing key, incompatible store, dir in use
EXIT_CANCELLED = 3  # stopped with in-flight requests cancelled (--now, second Ctrl-C, drain)
EXIT_INCOMPLETE = 4  # ran to the end, but some tasks failed (see --retry-failed)
EXIT_STOPPED = 5  # stopped with work left pending: a stop, an account budget, an outage,
#                   a full disk; rerun to resume
EXIT_UNPRODUCTIVE = 6  # the work is over but kept no sample, or less than [quality]
#                        min_kept_share of the answered tasks (specgen.judgement)


@dataclass(slots=True)
class Outcome:
    state: str  # finished | unproductive | incomplete | stopped | failed
    stop_reason: str
    exit_code: int


def decide(*, fatal: str | None, stopping: str | None, stop_reason: str | None,
           pending: int, failed: dict[str, int], done_note: str,
           paused: dict[str, str] | None = None, bad_input: bool = False) -> Outcome:
    """The session's outcome. `failed`: failed tasks by error class (all sessions);
    `done_note`: what the datasets reached (budgets, limits); `paused`: datasets an alarm
    paused (name -> why): work is left, so the run stopped; `bad_input`: the fatal error is a
    dataset's (an invalid row, a source that cannot be read): exit 2, as before the session."""
    if fatal:
        return Outcome("failed", fatal, EXIT_USAGE if bad_input else EXIT_FAILED)
    if stopping:
        reason = f"{stop_reason} ({pending:,} task(s) left pending)"
        cancelled = stopping == "now" or "drain timeout" in (stop_reason or "")
        return Outcome("stopped", reason, EXIT_CANCELLED if cancelled else EXIT_STOPPED)
    if paused:
        why = "; ".join(f"{name} paused by {reason}" for name, reason in paused.items())
        return Outcome("stopped", f"{why} ({pending:,} task(s) left pending)", EXIT_STOPPED)
    n_failed = sum(failed.values())
    if n_failed:
        by_class = ", ".join(f"{k} {v:,}" for k, v in sorted(failed.items(),
                                                             key=lambda kv: -kv[1]))
        reason = f"{n_failed:,} task(s) failed ({by_class})"
        if done_note:
            reason += f"; {done_note}"
        return Outcome("incomplete", reason, EXIT_INCOMPLETE)
    return Outcome("finished", done_note or "all datasets done", EXIT_OK)


def session_outcome(datasets, stop, failed: dict[str, int]) -> Outcome:
    """The outcome of a session from its datasets' states (`state.DsRun`), its stop state
    (`stop.StopState`) and the failed tasks by class."""
    reached = []
    for state, label in (("budget_reached", "budget reached"),
                         ("limit_reached", "limit reached")):
        names = [ds.name for ds in datasets if ds.state == state]
        if names:
            reached.append(f"{label}: {', '.join(names)}")
    return decide(
        fatal=stop.fatal, stopping=stop.stopping, stop_reason=stop.reason,
        pending=sum(ds.tasks.get("pending", 0) for ds in datasets),
        failed=failed, done_note="; ".join(reached), bad_input=stop.bad_input,
        paused={ds.name: ds.paused for ds in datasets if ds.paused is not None})


def judged(outcome: Outcome, verdict: str | None) -> Outcome:
    """A `finished` session whose run kept too few samples (`specgen.judgement.judge`'s
    verdict, over every session) is `unproductive` instead: exit 0 means samples."""
    if outcome.state != "finished" or not verdict:
        return outcome
    return Outcome("unproductive", verdict, EXIT_UNPRODUCTIVE)
