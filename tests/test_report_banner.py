"""The report opens with its outcome (issue 35): a banner — done / stopped / unproductive, with
the cause and what to do — checked in headless Chromium: inside the first screen, in its
colour, with its text. The browser check skips when no Chromium is installed (`apt-get install
chromium`). Set SPECGEN_REPORT_SHOT=PATH to keep a PNG of the done report's first screen."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from specgen.report import build_report
from specgen.run_outcome import outcome_banner
from test_stats import planted_run  # noqa: F401 - the seeded run fixture (a finished run)

SCREEN = (1280, 800)  # the first screen of a laptop
# the banner's background per outcome (render_html.CSS), as the browser computes it
COLOURS = {"done": "rgb(227, 244, 230)", "stopped": "rgb(255, 241, 214)",
           "unproductive": "rgb(253, 227, 227)", "failed": "rgb(253, 227, 227)"}
PROBE = """<script>
const b = document.getElementById("outcome");
const r = b.getBoundingClientRect();
const s = getComputedStyle(b);
document.body.setAttribute("data-probe", JSON.stringify({
  top: r.top, bottom: r.bottom, width: r.width, height: r.height, inner: innerHeight,
  background: s.backgroundColor, border: s.borderLeftColor, display: s.display,
  visibility: s.visibility, font: parseFloat(getComputedStyle(
    b.querySelector(".headline")).fontSize), text: b.innerText}));
</script>"""


def browser() -> str:
    found = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                  if shutil.which(b)), None)
    if found is None:
        pytest.skip("no Chromium here (apt-get install chromium)")
    return found


def chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--virtual-time-budget=5000",
                           f"--window-size={SCREEN[0]},{SCREEN[1]}", *args],
                          capture_output=True, text=True, timeout=120)


def probe(html: str, tmp_path: Path) -> dict:
    """Where and how the browser draws the banner of `html` in the first screen."""
    page = tmp_path / "probe.html"
    page.write_text(html.replace("</body>", PROBE + "</body>"))
    dom = chromium("--dump-dom", page.as_uri()).stdout
    m = re.search(r'data-probe="([^"]*)"', dom)
    assert m, dom[-2000:]
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def copy_run(src: Path, dst: Path, sql: str) -> Path:
    shutil.copytree(src, dst)
    conn = sqlite3.connect(dst / "state.sqlite")
    conn.execute(sql)
    conn.commit()
    conn.close()
    return dst


def test_the_banner_names_the_outcome_the_cause_and_what_to_do():
    done = outcome_banner("finished", "all datasets done", None, kept=9, answered=10,
                          run_dir="runs/q")
    assert (done.kind, done.headline) == ("done", "Done: 9 of 10 answered task(s) kept")
    assert "specgen export runs/q" in done.todo
    poor = outcome_banner("finished", "all datasets done", "only 1 of 10 kept", kept=1,
                          answered=10, run_dir="r")
    assert poor.kind == "unproductive" and poor.cause == "only 1 of 10 kept"
    stopped = outcome_banner("stopped", "stopped by the user (4 task(s) left pending)", None,
                             kept=3, answered=3, run_dir="r")
    assert stopped.kind == "stopped" and "resume" in stopped.todo
    failed = outcome_banner("failed", "bad key", None, kept=0, answered=0, run_dir="r")
    assert failed.kind == "failed" and "fix the cause" in failed.todo


@pytest.mark.parametrize("kind", ["done", "stopped", "unproductive"])
def test_the_report_opens_with_its_outcome_in_the_first_screen(planted_run, tmp_path,  # noqa: F811
                                                               kind):
    run = planted_run
    if kind == "stopped":
        run = copy_run(planted_run, tmp_path / "run", "UPDATE sessions SET state = 'stopped', "
                       "stop_reason = 'stopped by the user (signal SIGINT) (7 task(s) left "
                       "pending)'")
    elif kind == "unproductive":
        run = copy_run(planted_run, tmp_path / "run", "UPDATE sessions SET state = "
                       "'unproductive', stop_reason = 'no sample kept of 40 answered task(s)'")
    html = build_report(run)
    text = build_report(run, text=True)
    # the text report opens with it too, before any figure
    head = text.split("Summary", 1)[0]
    assert f">> {kind.upper()}" in head and "why: " in head and "what to do: " in head
    got = probe(html, tmp_path)
    assert got["display"] != "none" and got["visibility"] == "visible"
    assert 0 <= got["top"] and got["bottom"] <= min(got["inner"], SCREEN[1]) / 2, got
    assert got["width"] > 0.8 * SCREEN[0] - 100 and got["height"] > 60, got
    assert got["background"] == COLOURS[kind], got
    assert got["font"] >= 24  # larger than any other text on the page
    words = {"done": "Done:", "stopped": "Stopped:", "unproductive": "Unproductive:"}[kind]
    assert got["text"].startswith(words), got["text"]
    assert "Why:" in got["text"] and "What to do:" in got["text"]
    if kind == "done":
        assert "specgen export" in got["text"]
        shot = tmp_path / "first-screen.png"
        page = tmp_path / "report.html"
        page.write_text(html)
        chromium(f"--screenshot={shot}", page.as_uri())
        assert shot.is_file() and shot.stat().st_size > 10_000
        if os.environ.get("SPECGEN_REPORT_SHOT"):
            shutil.copy(shot, os.environ["SPECGEN_REPORT_SHOT"])
    elif kind == "stopped":
        assert "signal SIGINT" in got["text"] and "rerun the same command" in got["text"]
    else:
        assert "no sample kept of 40" in got["text"] and "change what the reason" in got["text"]
