"""Whether a process, or a run's recorded session, is alive: read by the engine (locks, status)
and by the readers (leftover temporary files) alike."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this pid exists on this host (zombies count as dead)."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def heartbeat_timeout(interval: float) -> float:
    """How old a heartbeat may be for its session to count as alive."""
    return max(15.0, 5 * interval)


def session_alive(session: dict[str, Any], *, heartbeat_interval: float = 2.0,
                  now: float | None = None) -> bool:
    """A recorded 'running' session whose process is alive and heartbeating."""
    if session.get("state") != "running":
        return False
    now = time.time() if now is None else now
    fresh = now - (session.get("heartbeat_at") or 0) <= heartbeat_timeout(heartbeat_interval)
    if session.get("host") == socket.gethostname():
        return fresh and pid_alive(session.get("pid"))
    return fresh
