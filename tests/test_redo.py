"""The redo decision (engine.redo) on a real SQLite store: which exclusions are redone, from
which turn each conversation is made again, and what `Store.supersede` leaves; the config key.
The end-to-end runs (simulator, an independent server, kill -9): tests/test_engine_blame.py."""

from __future__ import annotations

import pytest

from specgen.engine.redo import providers_to_redo, redo, tails
from specgen.queries import redo_totals
from specgen.store import Store
from test_config import BASE, cfg_of, error_of

AUTO = {"by": "auto", "reason": "r"}
USER = {"by": "user", "reason": "r"}


def seeded(tmp_path) -> Store:
    """Conversation 1: turns 1 (Good), 3 (Bad), 5 (Good); 2: turn 1 (bad, another spelling),
    3 (Good); 3: turn 1 (Good) only. Every task done, each with one ok attempt."""
    store = Store.create(tmp_path)
    c = store.conn
    rows = [(1, 1, "Good"), (1, 3, "Bad"), (1, 5, "Good"), (2, 1, "bad"), (2, 3, "Good"),
            (3, 1, "Good")]
    for conv in (1, 2, 3):
        c.execute("INSERT INTO conversations VALUES(?, 'd', ?, ?, 'done', NULL, x'00')",
                  (conv, f"c{conv}", conv))
    c.execute("INSERT INTO datasets(name, position, state) VALUES('d', 0, 'done')")
    for task, (conv, turn, who) in enumerate(rows, 1):
        c.execute("INSERT INTO tasks VALUES(?, ?, 'd', ?, 'done', 1, NULL)", (task, conv, turn))
        c.execute("INSERT INTO attempts(id, task, provider, outcome, cost_usd, dataset) "
                  "VALUES(?, ?, ?, 'ok', 0.5, 'd')", (task, task, who))
        c.execute("INSERT INTO results(task, conversation, dataset, turn, provider, request, "
                  "message, input_ids, n_prompt) VALUES(?, ?, 'd', ?, ?, x'00', '{}', x'00', 0)",
                  (task, conv, turn, who))
    c.commit()
    return store


def test_only_automatic_exclusions_are_redone_unless_all_or_off():
    excluded = {"Bad": AUTO, "Hand": USER}
    assert set(providers_to_redo(excluded, True)) == {"Bad"}
    assert set(providers_to_redo(excluded, "all")) == {"Bad", "Hand"}
    assert providers_to_redo(excluded, False) == {}


def test_a_conversation_is_redone_from_the_excluded_providers_first_turn(tmp_path):
    store = seeded(tmp_path)
    assert tails(store.conn, {"bad"}) == {1: 3, 2: 1}
    done = redo(store, {"Bad": AUTO}, True, session=7)
    assert done is not None and done.conversation_ids == [1, 2]
    assert (done.tasks, done.samples) == (4, 4)  # conv 1: turns 3, 5; conv 2: turns 1, 3
    c = store.conn
    # earlier turns stay; the tail's first task is pending again, the later ones are gone
    assert c.execute("SELECT conversation, turn, status, attempts FROM tasks ORDER BY id"
                     ).fetchall() == [(1, 1, "done", 1), (1, 3, "pending", 0),
                                      (2, 1, "pending", 0), (3, 1, "done", 1)]
    assert c.execute("SELECT task FROM results ORDER BY task").fetchall() == [(1,), (6,)]
    assert c.execute("SELECT conversation, turn, provider, superseded_why FROM "
                     "superseded_results ORDER BY task").fetchall() == [
        (1, 3, "Bad", "provider_excluded"), (1, 5, "Good", "provider_excluded"),
        (2, 1, "bad", "provider_excluded"), (2, 3, "Good", "provider_excluded")]
    assert c.execute("SELECT id, status FROM conversations ORDER BY id").fetchall() == [
        (1, "active"), (2, "pending"), (3, "done")]
    assert c.execute("SELECT state FROM datasets").fetchone() == ("active",)
    assert c.execute("SELECT COUNT(*) FROM attempts WHERE outcome='superseded:"
                     "provider_excluded'").fetchone() == (4,)
    # the totals (status, report) no longer count them as kept
    assert sorted(c.execute("SELECT provider, attempts FROM totals WHERE outcome='ok'")) \
        == [("Good", 2)]
    # made once: nothing of Bad's is left to redo
    assert redo(store, {"Bad": AUTO}, True, session=8) is None
    t = redo_totals(c)
    assert t is not None and (t["conversations"], t["tasks"], t["samples_superseded"]) == (2, 4, 4)
    assert t["attempts"] == 0  # none made for them yet (only attempts after the redo count)
    c.execute("INSERT INTO attempts(id, task, provider, outcome, cost_usd, dataset) "
              "VALUES(100, 2, 'Good', 'ok', 0.25, 'd')")
    c.execute("UPDATE tasks SET status='done' WHERE id=2")
    t = redo_totals(c)
    assert (t["attempts"], t["cost_usd"], t["tasks_done_again"]) == (1, 0.25, 1)
    store.close()


def test_nothing_is_redone_when_off_or_for_a_manual_exclusion_by_default(tmp_path):
    store = seeded(tmp_path)
    assert redo(store, {"Bad": AUTO}, False, session=1) is None
    assert redo(store, {"Bad": USER}, True, session=1) is None
    assert redo_totals(store.conn) is None
    assert store.conn.execute("SELECT COUNT(*) FROM results").fetchone() == (6,)
    store.close()


@pytest.mark.parametrize("value, expected", [("true", True), ("false", False),
                                             ('"all"', "all")])
def test_the_config_key(tmp_path, value, expected):
    cfg = cfg_of(tmp_path, BASE.replace("[[dataset]]", f"[quality]\nredo_excluded = {value}\n"
                                                       "[[dataset]]"))
    assert cfg.quality.redo_excluded == expected


def test_the_config_key_refuses_another_value(tmp_path):
    msg = error_of(tmp_path, BASE.replace("[[dataset]]", '[quality]\nredo_excluded = "some"\n'
                                                         "[[dataset]]"))
    assert "redo_excluded" in msg


def test_the_default_redoes_automatic_exclusions(tmp_path):
    assert cfg_of(tmp_path).quality.redo_excluded is True
