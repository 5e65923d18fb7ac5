"""The report's "Ready to train?" section on the seeded run with planted answers: the shares
above their thresholds highlighted, inline SVG distributions, the filtering commands; and the
page in a real headless browser (Chromium: the screenshot renders, no console error). The
browser check skips when no Chromium is installed (`apt-get install chromium`)."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from test_stats import cli, planted_run  # noqa: F401 - the seeded run fixture


class Quality(HTMLParser):
    def __init__(self):
        super().__init__()
        self.inside = False
        self.depth = 0
        self.svg = 0
        self.alerts: list[str] = []
        self.text: list[str] = []
        self._alert = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and a.get("id") == "data-quality":
            self.inside = True
        if self.inside and tag == "svg":
            self.svg += 1
        if self.inside and tag == "p" and a.get("class") == "alert":
            self._alert = True
            self.alerts.append("")

    def handle_endtag(self, tag):
        if tag == "section":
            self.inside = False
        if tag == "p":
            self._alert = False

    def handle_data(self, data):
        if self.inside:
            self.text.append(data)
            if self._alert:
                self.alerts[-1] += data


@pytest.fixture(scope="module")
def report_html(planted_run):  # noqa: F811
    proc = cli("report", str(planted_run))
    assert proc.returncode == 0, proc.stderr
    return planted_run / "report.html"


def test_the_section_highlights_and_says_what_to_filter(report_html):
    page = Quality()
    page.feed(report_html.read_text())
    text = " ".join(page.text)
    assert page.svg >= 2  # prompt and trainable distributions
    assert any("are cut at max_tokens" in a for a in page.alerts)
    assert any("hold a repetition loop" in a for a in page.alerts)
    for flag in ("--drop-truncated", "--max-repetition 63", "--dedup", "--min-trainable-tokens"):
        assert flag in text
    assert "a/loop1/1" in text or "a/loop2/1" in text


def test_report_text_has_the_section(planted_run):  # noqa: F811
    proc = cli("report", str(planted_run), "--text")
    assert proc.returncode == 0, proc.stderr
    assert "Ready to train?" in proc.stdout and "!! " in proc.stdout


def _shot(browser: str, url: str, shot, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
         "--window-size=1280,6000", *extra, f"--screenshot={shot}", url],
        capture_output=True, text=True, timeout=120)


def test_the_page_renders_in_a_headless_browser(report_html, tmp_path):
    browser = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                    if shutil.which(b)), None)
    if browser is None:
        pytest.skip("no Chromium here (apt-get install chromium)")
    blank = tmp_path / "blank.png"
    (tmp_path / "blank.html").write_text("<!DOCTYPE html><html><body></body></html>")
    _shot(browser, (tmp_path / "blank.html").as_uri(), blank)
    shot = tmp_path / "report.png"
    proc = _shot(browser, report_html.resolve().as_uri(), shot)
    assert shot.exists() and blank.exists(), proc.stderr[-2000:]
    # a rendered page of tables and charts compresses far worse than an empty one
    assert shot.stat().st_size > 8 * blank.stat().st_size, (shot.stat().st_size,
                                                            blank.stat().st_size)
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line
               or "Uncaught" in line or "net::ERR" in line]
    assert not console, console
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--virtual-time-budget=5000", "--dump-dom",
                          report_html.resolve().as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    page = Quality()
    page.feed(dom)
    assert page.svg >= 2 and any("repetition loop" in a for a in page.alerts)
