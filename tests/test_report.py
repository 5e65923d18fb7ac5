"""`specgen report`: a self-contained HTML page with every section, and the same numbers as text."""

from __future__ import annotations

import sqlite3
from html.parser import HTMLParser

import pytest

from specgen.cli import main
from specgen.report import SECTION_IDS, build_report
from specgen.store import Store
from test_export_support import build_store, chat


class Page(HTMLParser):
    """Collects sections (id -> heading, svg count, text) and every external reference."""

    def __init__(self):
        super().__init__()
        self.sections: dict[str, dict] = {}
        self.current: str | None = None
        self.in_h2 = False
        self.external: list[str] = []
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        for key in ("src", "href", "xlink:href"):
            v = a.get(key)
            if v and not v.startswith("#"):
                self.external.append(v)
        if tag in ("script", "link", "img", "iframe"):
            self.external.append(tag)
        if tag == "section":
            self.current = a["id"]
            self.sections[self.current] = {"title": "", "svg": 0, "tables": 0, "text": []}
        elif self.current and tag == "svg":
            self.sections[self.current]["svg"] += 1
        elif self.current and tag == "table":
            self.sections[self.current]["tables"] += 1
        self.in_h2 = tag == "h2"

    def handle_endtag(self, tag):
        if tag == "section":
            self.current = None
        if tag == "h2":
            self.in_h2 = False

    def handle_data(self, data):
        self.text.append(data)
        if self.current:
            sec = self.sections[self.current]
            if self.in_h2:
                sec["title"] += data
            sec["text"].append(data)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("report") / "run"
    return build_store(d, {"chat": [chat(i, 2) for i in range(6)],
                           "tools": [chat(i, 1, tools=True) for i in range(3)]}, turns="all")


def parse(html: str) -> Page:
    p = Page()
    p.feed(html)
    p.close()
    return p


def test_html_has_every_section_and_no_external_assets(run):
    page = parse(build_report(run))
    assert list(page.sections) == list(SECTION_IDS)
    for sid, sec in page.sections.items():
        assert sec["title"], sid
        assert sec["tables"] >= 1, sid
    assert page.external == []
    for sid in ("tokens-cost", "completion-lengths", "finish-reasons", "errors", "latency",
                "repairs-quarantine"):
        assert page.sections[sid]["svg"] >= 1, f"{sid} has no chart"


def test_numbers_match_the_store(run):
    page = parse(build_report(run))
    conn = sqlite3.connect(run / "state.sqlite")
    for ds, completion, samples in conn.execute(
            "SELECT dataset, SUM(completion_tokens), COUNT(*) FROM results GROUP BY dataset"):
        text = "|".join(page.sections["tokens-cost"]["text"])
        assert f"|{ds}|{samples:,}|" in text and f"|{completion:,}|" in text
    failed = conn.execute("SELECT COUNT(*) FROM attempts WHERE outcome != 'ok'").fetchone()[0]
    assert failed > 0
    assert f"rate_limited|{failed}" in "|".join(page.sections["errors"]["text"])
    assert "strip_im_end" in "".join(page.sections["repairs-quarantine"]["text"])
    # flags are observations, listed apart from the repairs and without their prefix
    assert "flag:" not in "".join(page.sections["repairs-quarantine"]["text"])
    assert "arguments_compact" in "".join(page.sections["repairs-quarantine"]["text"])
    assert "nothing changed" in "".join(page.sections["repairs-quarantine"]["text"])
    assert "empty_response" in "".join(page.sections["repairs-quarantine"]["text"])
    lat = "|".join(page.sections["latency"]["text"])
    assert "|all|" in lat and "0.500s" in lat  # the fixture's attempts take 0.5 s
    assert "finished" in "".join(page.sections["budget-stop"]["text"])


def test_text_has_the_same_numbers(run):
    text = build_report(run, text=True)
    for title in ("Summary", "Tokens and cost", "Completion lengths", "Finish reasons",
                  "Errors over time", "Latency", "Repairs and quarantines", "Budget and stops"):
        assert f"\n{title}\n" in text
    with Store.open(run) as s:
        n = len(list(s.iter_results()))
    assert next(ln for ln in text.splitlines() if ln.strip().startswith("samples ")).split()[-1] == str(n)
    assert f"|samples|{n}|" in "|".join(parse(build_report(run)).sections["summary"]["text"])
    conn = sqlite3.connect(run / "state.sqlite")
    for ds, completion in conn.execute(
            "SELECT dataset, SUM(completion_tokens) FROM results GROUP BY dataset"):
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(ds + " "))
        assert f"{completion:,}" in line.split()


def test_empty_run_renders(tmp_path):
    run = build_store(tmp_path / "run", {"d": []})
    page = parse(build_report(run))
    assert list(page.sections) == list(SECTION_IDS)
    assert "none" in build_report(run, text=True)


def test_budget_is_shown(tmp_path):
    run = build_store(tmp_path / "run", {"d": [chat(1)]})
    conn = sqlite3.connect(run / "state.sqlite")
    conn.execute("""UPDATE meta SET value='{"budget": {"max_cost_usd": 0.5}}' """
                 "WHERE key='config_json'")
    conn.execute("UPDATE datasets SET state='budget_reached'")
    conn.commit()
    conn.close()
    text = "".join(parse(build_report(run)).sections["budget-stop"]["text"])
    assert "$0.5000" in text and "budget_reached" in text and "share of budget used" in text


def test_cli(run, tmp_path, capsys):
    out = tmp_path / "r" / "report.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(run), "--text"]) == 0
    assert "Latency" in capsys.readouterr().out
    assert main(["report", str(run)]) == 0
    assert (run / "report.html").exists()
    assert main(["report", str(tmp_path / "none")]) == 2


def test_every_chart_is_well_formed_svg(run):
    import re
    import xml.etree.ElementTree as ET

    html = build_report(run)
    charts = re.findall(r"<svg .*?</svg>", html, flags=re.S)
    assert len(charts) >= 8
    for svg in charts:
        root = ET.fromstring(svg)  # raises on malformed markup
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert root.find("{http://www.w3.org/2000/svg}rect") is not None


def test_latency_is_time_to_first_token_and_total_and_says_so(tmp_path):
    run = build_store(tmp_path / "run", {"d": [chat(i) for i in range(4)]})
    conn = sqlite3.connect(run / "state.sqlite")
    conn.execute("UPDATE attempts SET first_token_at = started_at + 0.25 WHERE outcome = 'ok'")
    conn.commit()
    conn.close()
    sec = parse(build_report(run)).sections["latency"]
    text = "|".join(sec["text"])
    assert "first token p50" in text and "total p50" in text and "first byte p50" not in text
    assert "|all|4|0.250s|" in text  # first token, not the headers' time (0.01 s)
    assert "time to first token" in text and "keep-alive" in text


def test_one_label_for_an_unknown_provider_and_attempts_named_as_such(tmp_path):
    from specgen.engine.status import run_status

    run = build_store(tmp_path / "run", {"d": [chat(i) for i in range(2)]})
    conn = sqlite3.connect(run / "state.sqlite")
    conn.execute("INSERT INTO attempts(task, session, provider, started_at, ended_at, outcome, "
                 "dataset) VALUES(1, 1, NULL, 1.0, 2.0, 'retry:timeout', 'd')")
    conn.commit()
    conn.close()
    text = build_report(run, text=True)
    rows = [ln.strip() for ln in text.split("Per provider:")[1].splitlines()[2:5]]
    # an attempt that ended in an error before any provider answered is no provider's row
    # (issue 35: it read `(unknown)`, like an answer that named none)
    assert any(ln.startswith("no provider (never answered)") for ln in rows), rows
    assert not any(ln.startswith(("(unknown)", "?")) for ln in rows)
    assert "no provider (never answered)" in run_status(run)["providers"]
    assert "(unknown)" not in run_status(run)["providers"]
    head = text.split("Per dataset:")[1].splitlines()[1]
    assert head.rstrip().endswith("attempts  failed attempts")
    assert "attempts (HTTP tries of the tasks)" in text and "ended early" not in text.split(
        "Tokens and cost")[0]


def test_numbers_are_formatted_alike(tmp_path):
    run = build_store(tmp_path / "run", {"d": [chat(i) for i in range(3)]})
    conn = sqlite3.connect(run / "state.sqlite")
    conn.execute("UPDATE results SET completion_tokens = completion_tokens + 12345")
    conn.execute("UPDATE sessions SET pid = 123456")
    conn.commit()
    total = conn.execute("SELECT SUM(completion_tokens) FROM results").fetchone()[0]
    conn.close()
    text = build_report(run, text=True)
    assert f"{total:,}" in text and str(total) not in text  # thousands separators
    assert "123456" in text and "123,456" not in text  # a pid is an id, not a count
    assert next(ln for ln in text.splitlines() if "thinking" in ln).split() == ["thinking", "on"]
    html = build_report(run)
    assert f">{total:,}<" in html
