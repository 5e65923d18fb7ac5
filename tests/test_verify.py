"""`specgen verify`: clean runs pass; corrupted samples, masks, specials and true ids are caught."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest

from specgen.cli import main
from specgen.store import pack_ids, unpack_ids
from specgen.tokenizer import load_tokenizer
from specgen.verify import VerifyError, verify_run
from test_export_support import build_store, chat


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    d = tmp_path_factory.mktemp("verify") / "run"
    return build_store(d, {"chat": [chat(i, 2) for i in range(5)],
                           "tools": [chat(i, 1, tools=True) for i in range(3)]},
                       turns="all", true_ids=True)


@pytest.fixture
def run(clean, tmp_path):
    """A private copy to corrupt."""
    dst = tmp_path / "run"
    shutil.copytree(clean, dst)
    return dst


def sample(run, offset=0):
    conn = sqlite3.connect(run / "state.sqlite")
    row = conn.execute("SELECT task, input_ids, n_prompt, true_completion_ids FROM results "
                       "ORDER BY task LIMIT 1 OFFSET ?", (offset,)).fetchone()
    return conn, row[0], unpack_ids(row[1]), row[2], unpack_ids(row[3])


def set_ids(conn, task, column, ids):
    conn.execute(f"UPDATE results SET {column}=? WHERE task=?", (pack_ids(ids), task))
    conn.commit()
    conn.close()


def test_clean_run_passes(clean, capsys):
    r = verify_run(clean)
    assert r.ok and r.exit_code == 0
    assert r.samples == r.samples_ok == 16
    assert r.true_prompt.checked == r.true_prompt.equal == 16
    assert r.true_completion.checked == r.true_completion.equal == 16
    assert main(["verify", str(clean)]) == 0
    out = capsys.readouterr().out
    assert "16/16 equal ours exactly" in out and out.rstrip().endswith("OK")


def test_flipped_id_is_caught(run):
    conn, task, ids, n, _ = sample(run)
    ids[n + 2] = ids[n + 2] ^ 1
    set_ids(conn, task, "input_ids", ids)
    r = verify_run(run)
    assert not r.ok and r.exit_code == 1
    assert r.samples_ok == r.samples - 1
    assert {"completion_ids", "text"} <= set(r.failures)
    p = next(p for p in r.problems if p.check == "completion_ids")
    assert p.task == task and "at token 2" in p.detail


def test_truncated_blob_is_caught(run):
    conn = sqlite3.connect(run / "state.sqlite")
    task, blob = conn.execute("SELECT task, input_ids FROM results LIMIT 1 OFFSET 3").fetchone()
    conn.execute("UPDATE results SET input_ids=? WHERE task=?", (blob[:-3], task))
    conn.commit()
    conn.close()
    r = verify_run(run)
    assert dict(r.failures) == {"blob": 1}
    assert r.problems[0].task == task and "cannot be decoded" in r.problems[0].detail


def test_changed_n_prompt_is_caught(run):
    conn = sqlite3.connect(run / "state.sqlite")
    task = conn.execute("SELECT task FROM results LIMIT 1 OFFSET 2").fetchone()[0]
    conn.execute("UPDATE results SET n_prompt = n_prompt - 1 WHERE task=?", (task,))
    conn.commit()
    conn.close()
    r = verify_run(run)
    assert "mask" in r.failures
    p = next(p for p in r.problems if p.check == "mask")
    assert "does not cover exactly the sampled part" in p.detail
    conn = sqlite3.connect(run / "state.sqlite")
    conn.execute("UPDATE results SET n_prompt = 100000 WHERE task=?", (task,))
    conn.commit()
    conn.close()
    assert "outside the sample" in next(p for p in verify_run(run).problems if p.check == "mask").detail


def test_stray_stop_token_and_tool_markers_are_caught(run):
    tok = load_tokenizer("demo")
    im_end = tok.token_id("<|im_end|>")
    conn, task, ids, n, _ = sample(run)
    ids[n + 1] = im_end
    set_ids(conn, task, "input_ids", ids)
    r = verify_run(run)
    assert any("2 stop token(s)" in p.detail for p in r.problems if p.check == "specials")

    # a tool-call sample (dataset "tools", first turn) with its section-end marker removed
    conn = sqlite3.connect(run / "state.sqlite")
    task, blob = conn.execute("SELECT task, input_ids FROM results WHERE dataset='tools' "
                              "AND finish_reason='tool_calls' LIMIT 1").fetchone()
    ids = unpack_ids(blob)
    end = tok.token_id("<|tool_calls_section_end|>")
    ids.remove(end)
    set_ids(conn, task, "input_ids", ids)
    r = verify_run(run)
    assert any("section markers 1 open / 0 close" in p.detail
               for p in r.problems if p.check == "specials" and p.task == task)


def test_stored_message_that_does_not_match_its_ids_is_caught(run):
    conn = sqlite3.connect(run / "state.sqlite")
    task, msg = conn.execute("SELECT task, message FROM results LIMIT 1").fetchone()
    m = json.loads(msg)
    m["content"] = m["content"] + "!"
    conn.execute("UPDATE results SET message=? WHERE task=?", (json.dumps(m), task))
    conn.commit()
    conn.close()
    r = verify_run(run)
    assert {"completion_ids", "parse", "text"} <= set(r.failures)


def non_canonical(tok, ids):
    """The same text with one multi-byte token split in two (a valid, non-canonical path)."""
    for i, t in enumerate(ids):
        text = tok.decode([t])
        if not tok.is_special(t) and len(text) >= 2 and text.isascii():
            a, b = tok.encode(text[0]), tok.encode(text[1:])
            if a + b != [t]:
                return ids[:i] + a + b + ids[i + 1:], i
    raise AssertionError("no splittable token")


def test_true_id_mismatch_is_a_measurement_with_a_threshold(run, capsys):
    tok = load_tokenizer("demo")
    conn, task, ids, n, true_completion = sample(run)
    theirs, at = non_canonical(tok, true_completion)
    set_ids(conn, task, "true_completion_ids", theirs)
    r = verify_run(run)
    s = r.true_completion
    assert (s.checked, s.equal, s.mismatched, s.same_text) == (16, 15, 1, 1)
    assert not r.failures and not r.true_ids_ok and r.exit_code == 1  # 1/16 > 2%
    ex = s.examples[0]
    assert ex["task"] == task and ex["position"] == at
    # the shortest spans covering the same bytes: one token of ours, two of theirs
    assert len(ex["ours"]) == 1 and len(ex["theirs"]) == 2
    assert "".join(ex["ours_pieces"]) == "".join(ex["theirs_pieces"])
    assert verify_run(run, max_true_mismatch=0.1).ok
    assert main(["verify", str(run), "--max-true-mismatch", "1"]) == 0
    out = capsys.readouterr().out
    assert "15/16 equal ours exactly" in out and f"at token {at} " in out


def test_true_completion_without_stop_token_counts_as_match(run):
    conn, task, ids, n, true_completion = sample(run)
    set_ids(conn, task, "true_completion_ids", true_completion[:-1])
    r = verify_run(run)
    assert r.ok and r.true_completion.equal_but_stop == 1 and r.true_completion.mismatched == 0


def test_done_task_without_sample_is_a_store_problem(run):
    conn = sqlite3.connect(run / "state.sqlite")
    conn.execute("DELETE FROM results WHERE task = (SELECT MIN(task) FROM results)")
    conn.commit()
    conn.close()
    r = verify_run(run)
    assert r.store_problems == ["1 task(s) marked done have no stored sample"]
    assert r.exit_code == 1


def test_cannot_verify_exits_2(run, tmp_path, capsys):
    conn = sqlite3.connect(run / "state.sqlite")
    conn.execute("UPDATE meta SET value='0000' WHERE key='tokenizer_fingerprint'")
    conn.commit()
    conn.close()
    with pytest.raises(VerifyError, match="differs from the one the run used"):
        verify_run(run)
    assert main(["verify", str(run)]) == 2
    assert main(["verify", str(tmp_path / "none")]) == 2
    assert main(["verify", str(run), "--max-true-mismatch", "2"]) == 2
    assert "no specgen run here" in capsys.readouterr().err


def test_json_output(clean, capsys):
    assert main(["verify", str(clean), "--json", "--dataset", "tools"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["samples"] == 6
    assert data["true_ids"]["completion"]["mismatch_rate"] == 0.0


def test_real_kimi_tokenizer_run_verifies(tmp_path):
    from conftest import model_path

    kimi = model_path("kimi-k2.5")
    run = build_store(tmp_path / "run", {"d": [chat(i, 2, tools=True) for i in range(3)]},
                      tokenizer=str(kimi), turns="all", true_ids=True)
    r = verify_run(run)
    assert r.ok and r.samples == 9


def test_answers_cut_at_max_tokens_verify(run):
    """on_length = "keep": the stored ids hold no stop token (and no `</think>` when the answer
    stopped inside its reasoning); verify expects exactly that."""
    tok = load_tokenizer("demo")
    conn = sqlite3.connect(run / "state.sqlite")
    rows = conn.execute("SELECT task, n_prompt, input_ids FROM results WHERE dataset='chat' "
                        "ORDER BY task LIMIT 2").fetchall()
    # 1. cut in the content: the render less its final <|im_end|>
    task, n, blob = rows[0]
    ids = unpack_ids(blob)
    conn.execute("UPDATE results SET finish_reason='length', input_ids=?, true_completion_ids=? "
                 "WHERE task=?", (pack_ids(ids[:-1]), pack_ids(ids[n:-1]), task))
    # 2. cut inside the reasoning: reasoning text only, no </think>, empty content
    task2, n2, blob2 = rows[1]
    ids2 = unpack_ids(blob2)
    cut = tok.encode("partial thou")
    msg = {"role": "assistant", "content": "", "reasoning_content": "partial thou"}
    conn.execute("UPDATE results SET finish_reason='length', message=?, input_ids=?, "
                 "true_completion_ids=? WHERE task=?",
                 (json.dumps(msg), pack_ids(ids2[:n2] + cut), pack_ids(cut), task2))
    conn.commit()
    r = verify_run(run)
    assert r.ok, r.problems
    assert r.true_completion.mismatched == 0
    # a cut answer that still holds a stop token is wrong
    conn.execute("UPDATE results SET input_ids=? WHERE task=?", (blob, task))
    conn.commit()
    conn.close()
    r = verify_run(run)
    assert any(p.task == task and p.check == "specials" and "cut at max_tokens" in p.detail
               for p in r.problems)
