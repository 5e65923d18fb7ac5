"""Helpers for the simulator tests: a `specgen sim` process on an ephemeral port, plain HTTP.

(No tests here; pytest collects nothing from this module.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHAT = "/api/v1/chat/completions"
MODEL = "moonshotai/kimi-k2.5"


class SimProcess:
    """`python -m specgen sim --port 0 --config FILE --seed S`, killed at the end."""

    def __init__(self, tmp: Path, config: str = "", seed: int = 0, name: str = "sim"):
        path = tmp / f"{name}.toml"
        path.write_text(config)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specgen", "sim", "--port", "0", "--config", str(path),
             "--seed", str(seed)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
        )
        line = _readline(self.proc, timeout=60)
        if not line.startswith("specgen sim listening on http://127.0.0.1:"):
            self.stop()
            raise RuntimeError(f"sim did not start: {line!r}\n{self.proc.stderr.read()[-3000:]}")
        self.root = line.split()[-1]
        self.url = self.root + "/api/v1"  # the base_url a run config points at
        self.stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    # -- plain HTTP ---------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, headers: dict | None = None,
                timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.root + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def get(self, path: str) -> tuple[int, Any]:
        status, _, raw = self.request("GET", path)
        return status, json.loads(raw)

    def chat(self, body: dict, headers: dict | None = None) -> tuple[int, Any, dict]:
        body = {"model": MODEL, **body}
        status, hdrs, raw = self.request("POST", CHAT, body, headers)
        return status, json.loads(raw), hdrs

    def stream(self, body: dict, headers: dict | None = None) -> tuple[int, list[str]]:
        """Raw SSE lines (without the blank separators) of a streamed request."""
        body = {"model": MODEL, "stream": True, **body}
        status, _, raw = self.request("POST", CHAT, body, headers)
        return status, [line for line in raw.decode().split("\n") if line]

    def stats(self) -> dict:
        return self.get("/sim/stats")[1]


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return box[0].strip() if box else ""


def sse_events(lines: list[str]) -> tuple[list[str], list[Any], bool]:
    """(comment lines, parsed data events, whether the stream ended with [DONE])."""
    comments = [line for line in lines if line.startswith(":")]
    events: list[Any] = []
    done = False
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            continue
        events.append(json.loads(data))
    return comments, events, done


def wait_for(cond, timeout: float = 30.0, interval: float = 0.05):
    """Poll `cond()` until it returns a truthy value (no fixed sleeps in tests)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
