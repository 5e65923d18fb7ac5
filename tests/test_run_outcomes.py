"""Exit 0 means samples (issue 24): `specgen run` as a real process against the built-in
simulator; a run that kept no sample, or less than `[quality] min_kept_share` of its answered
tasks, ends `unproductive` (exit 6) naming the cause and the fix, over the whole run (a rerun
without a change stays unproductive), and status / export / verify say so too."""

from __future__ import annotations

import json
import subprocess

from test_engine_support import ENV, SPECGEN, write_jsonl


def sharegpt_rows(n: int) -> list[dict]:
    return [{"id": f"s{i}", "conversations": [
        {"from": "human", "value": f"Question {i}: explain item {i} briefly."},
        {"from": "gpt", "value": "Sure."}]} for i in range(n)]


def plain_rows(n: int) -> list[dict]:
    return [{"id": f"p{i}", "messages": [
        {"role": "user", "content": f"Question {i}: explain item {i} in a paragraph."}]}
        for i in range(n)]


def config(tmp, body: str, name: str = "run", endpoint: str = "") -> str:
    path = tmp / f"{name}.toml"
    path.write_text(f"""run_dir = "{name}-dir"
[target]
model = "moonshotai/kimi-k2.5"
tokenizer = "demo"
[endpoint]
base_url = "sim"
{endpoint}
[engine]
commit_interval = 0.05
{body}""")
    return str(path)


def one_dataset(tmp, rows: list[dict], head: str = "", name: str = "p", keys: str = "",
                endpoint: str = "") -> str:
    """`rows` in {name}.jsonl and a config of that one dataset (its `keys`), after `head`."""
    write_jsonl(tmp / f"{name}.jsonl", rows)
    return config(tmp, f'{head}[[dataset]]\nname = "{name}"\npath = "{name}.jsonl"\n{keys}',
                  endpoint=endpoint)


SKIP_INVALID_OPENAI = 'format = "openai"\nskip_invalid = true\n'


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECGEN, *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd, env=ENV)


def test_every_row_invalid_is_unproductive_and_names_the_format(tmp_path):
    cfg = one_dataset(tmp_path, sharegpt_rows(30), name="sg", keys=SKIP_INVALID_OPENAI)
    for _ in range(2):  # a rerun without a change does not turn it into "finished"
        out = cli("run", cfg, "--no-live", cwd=tmp_path)
        assert out.returncode == 6, out.stdout + out.stderr
        first = out.stdout.splitlines()[0]
        assert first.startswith("run unproductive: no sample: all 30 source row(s)"), first
        assert "format = 'openai'" in first and "specgen preview" in first
        assert "invalid source rows 30 (first: line 1:" in out.stdout
        assert ('found fields id, conversations[].from/value: set format = "sharegpt"'
                in first)
        assert "Traceback" not in out.stderr
    pv = cli("preview", cfg, cwd=tmp_path)
    assert pv.returncode == 6, pv.stderr  # nothing readable: as the run, not 0 (issue 35)
    assert 'conversations[].from/value: set format = "sharegpt" or "auto"' in pv.stdout
    st = cli("status", "run-dir", cwd=tmp_path)
    assert st.returncode == 0
    assert "state unproductive" in st.stdout and "invalid source rows 30" in st.stdout
    # long lines are not wrapped mid-line (a pipe or a file gets each line whole)
    (reason,) = [line for line in st.stdout.splitlines() if "format they fit" in line]
    assert reason.strip().startswith("no sample: all 30 source row(s)"), st.stdout
    rep = cli("report", "run-dir", "--text", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    head = rep.stdout.split("Run:", 1)[0]  # the outcome comes first, before any figure
    assert ">> UNPRODUCTIVE: NO ANSWERED TASK" in head
    assert "why: no sample: all 30 source row(s)" in head and "what to do: change" in head
    assert "invalid source rows                    30 (first: sg line 1:" in rep.stdout
    assert "True" not in rep.stdout and "False" not in rep.stdout
    js = json.loads(cli("status", "run-dir", "--json", cwd=tmp_path).stdout)
    assert js["judgement"]["invalid_rows"] == 30 and js["judgement"]["kept"] == 0
    assert js["datasets"]["sg"]["invalid_reasons"][0].startswith("sg line 1: ")


def test_all_answers_cut_stays_unproductive_across_reruns(tmp_path):
    cfg = one_dataset(tmp_path, plain_rows(24), "[sampling]\nmax_tokens = 5\n")
    out = cli("run", cfg, "--no-live", cwd=tmp_path)
    assert out.returncode == 5, out.stdout + out.stderr  # the length alarm
    for args in (("--ack-alarm", "length"), ()):  # acknowledged once, it stays so
        out = cli("run", cfg, "--no-live", *args, cwd=tmp_path)
        assert out.returncode == 6, out.stdout + out.stderr
        first = out.stdout.splitlines()[0]
        assert "run finished" not in out.stdout
        assert first.startswith("run unproductive: no sample kept of 24 answered task(s)"), first
        assert "largest quarantine reason length x24" in first
        assert "max_tokens" in first and "on_length" in first


def test_a_kept_share_below_the_minimum_is_unproductive(tmp_path):
    # two datasets of 10 answers cut at max_tokens: one keeps them (on_length = "keep"), one
    # drops them; half the answered tasks are kept
    write_jsonl(tmp_path / "a.jsonl", plain_rows(10))
    write_jsonl(tmp_path / "b.jsonl", plain_rows(10))
    body = """[sampling]
max_tokens = 5
[quality]
alarms = false
min_kept_share = {share}
[[dataset]]
name = "a"
path = "a.jsonl"
on_length = "keep"
[[dataset]]
name = "b"
path = "b.jsonl"
"""
    half = cli("run", config(tmp_path, body.format(share=0.5), name="half"), "--no-live",
               cwd=tmp_path)
    assert half.returncode == 0 and half.stdout.startswith("run finished"), half.stdout
    most = cli("run", config(tmp_path, body.format(share=0.9), name="most"), "--no-live",
               cwd=tmp_path)
    assert most.returncode == 6, most.stdout + most.stderr
    assert most.stdout.startswith("run unproductive: only 10 of 20 answered task(s) kept "
                                  "(50% < [quality] min_kept_share 0.9)"), most.stdout


def test_min_kept_share_is_validated(tmp_path):
    cfg = one_dataset(tmp_path, plain_rows(2), "[quality]\nmin_kept_share = 1.5\n")
    out = cli("run", cfg, "--no-live", cwd=tmp_path)
    assert out.returncode == 2
    assert "quality.min_kept_share must be a share in [0, 1], got 1.5" in out.stderr


def test_export_and_verify_of_a_run_without_samples_say_so(tmp_path):
    cfg = one_dataset(tmp_path, sharegpt_rows(5), name="sg", keys=SKIP_INVALID_OPENAI)
    assert cli("run", cfg, "--no-live", cwd=tmp_path).returncode == 6
    for fmt in ("tokens", "specforge"):
        out = cli("export", "run-dir", "--format", fmt, cwd=tmp_path)
        assert out.returncode == 6, out.stdout + out.stderr
        assert "wrote 0 rows" in out.stdout
        assert ("specgen export: nothing exported — no sample: all 5 source row(s) read were "
                "invalid") in out.stderr
    out = cli("verify", "run-dir", cwd=tmp_path)
    assert out.returncode == 6, out.stdout + out.stderr
    assert "nothing verified: no sample — no sample: all 5 source row(s)" in out.stdout
    assert out.stdout.rstrip().endswith("NO SAMPLES")


def test_a_text_export_does_not_claim_the_backends_ids(tmp_path):
    cfg = one_dataset(tmp_path, plain_rows(4), endpoint="return_token_ids = true")
    assert cli("run", cfg, "--no-live", cwd=tmp_path).returncode == 0
    tokens = cli("export", "run-dir", "--format", "tokens", cwd=tmp_path)
    assert tokens.returncode == 0 and "4 of them as the backend's own ids" in tokens.stdout
    text = cli("export", "run-dir", "--format", "specforge", cwd=tmp_path)
    assert text.returncode == 0
    assert "backend's own ids (true ids)" not in text.stdout
    assert "the specforge format carries text" in text.stdout
    vocab = cli("export", "run-dir", "--format", "vocab", cwd=tmp_path)
    assert vocab.returncode == 0, vocab.stderr
    assert "4 of them counted with the backend's own ids (true ids)" in vocab.stdout
    assert "carries text" not in vocab.stdout  # a vocabulary counts ids, it carries no text


LENGTH_RUN = """[sampling]
max_tokens = 5
[quality]
on_alarm = "{on_alarm}"
[[dataset]]
name = "p"
path = "p.jsonl"
limit = {limit}
"""


def test_alarms_count_over_the_run_not_the_session(tmp_path):
    # two short sessions of 10 answers each: neither reaches the length alarm's 20 answers
    # alone; over the run the second one does
    write_jsonl(tmp_path / "p.jsonl", plain_rows(40))
    first = cli("run", config(tmp_path, LENGTH_RUN.format(on_alarm="stop", limit=10)),
                "--no-live", cwd=tmp_path)
    assert first.returncode == 6, first.stdout + first.stderr  # no sample, but no alarm yet
    assert "alarm length" not in first.stdout
    second = cli("run", config(tmp_path, LENGTH_RUN.format(on_alarm="stop", limit=20)),
                 "--no-live", cwd=tmp_path)
    assert second.returncode == 5, second.stdout + second.stderr
    head = second.stdout.splitlines()[0]
    assert "run stopped: alarm length on dataset 'p': 100% of the last 20 answers" in head
    assert "to fix: raise `max_tokens`" in head and "--ack-alarm length" in head
    assert "restored" in second.stderr  # the first session's answers counted

    # the alarm stands: a plain rerun stops again at once, and status shows it
    again = cli("run", config(tmp_path, LENGTH_RUN.format(on_alarm="stop", limit=20)),
                "--no-live", cwd=tmp_path)
    assert again.returncode == 5, again.stdout + again.stderr
    assert "standing since session 2" in again.stdout
    assert "a plain rerun stops again" in again.stdout
    st = cli("status", "run-dir", cwd=tmp_path).stdout
    assert "standing alarm length on dataset p (since session 2): to fix: raise" in st
    js = json.loads(cli("status", "run-dir", "--json", cwd=tmp_path).stdout)
    assert [(a["alarm"], a["standing"]) for a in js["alarms"]] == [("length", True)]

    # acknowledged: the run goes on, and ends on its yield (no sample: exit 6)
    acked = cli("run", config(tmp_path, LENGTH_RUN.format(on_alarm="stop", limit=20)),
                "--no-live", "--ack-alarm", "length", cwd=tmp_path)
    assert acked.returncode == 6, acked.stdout + acked.stderr
    assert "acknowledged" in acked.stderr
    js = json.loads(cli("status", "run-dir", "--json", cwd=tmp_path).stdout)
    assert js["alarms"] == []
    assert "standing alarm" not in cli("status", "run-dir", cwd=tmp_path).stdout


def test_a_config_change_clears_a_standing_alarm(tmp_path):
    write_jsonl(tmp_path / "p.jsonl", plain_rows(40))
    out = cli("run", config(tmp_path, LENGTH_RUN.format(on_alarm="stop", limit=30)),
              "--no-live", cwd=tmp_path)
    assert out.returncode == 5 and "alarm length" in out.stdout, out.stdout + out.stderr
    js = json.loads(cli("status", "run-dir", "--json", cwd=tmp_path).stdout)
    assert [a["standing"] for a in js["alarms"]] == [True]
    changed = cli("run", config(tmp_path, LENGTH_RUN.format(on_alarm="warn", limit=30)),
                  "--no-live", cwd=tmp_path)
    assert "alarm length on dataset 'p' cleared" in changed.stderr, changed.stderr
    assert changed.returncode == 6, changed.stdout + changed.stderr
    assert "standing" not in changed.stdout
    js = json.loads(cli("status", "run-dir", "--json", cwd=tmp_path).stdout)
    assert all(not a["standing"] or a["session"] == 2 for a in js["alarms"])


def test_an_unknown_ack_alarm_is_refused(tmp_path):
    write_jsonl(tmp_path / "p.jsonl", plain_rows(2))
    out = cli("run", config(tmp_path, LENGTH_RUN.format(on_alarm="stop", limit=2)),
              "--no-live", "--ack-alarm", "lenght", cwd=tmp_path)
    assert out.returncode == 2
    assert "--ack-alarm lenght: no such alarm (known: raw_markers" in out.stderr


def test_a_provider_change_clears_a_standing_alarm(tmp_path):
    write_jsonl(tmp_path / "p.jsonl", plain_rows(40))
    cfg = config(tmp_path, LENGTH_RUN.format(on_alarm="stop", limit=30))
    out = cli("run", cfg, "--no-live", cwd=tmp_path)
    assert out.returncode == 5 and "alarm length" in out.stdout, out.stdout + out.stderr
    ex = cli("provider", "run-dir", "--exclude", "DeepInfra", cwd=tmp_path)
    assert ex.returncode == 0, ex.stdout + ex.stderr
    js = json.loads(cli("status", "run-dir", "--json", cwd=tmp_path).stdout)
    assert [a["standing"] for a in js["alarms"]] == [False]
    assert "cleared when the run resumes" in cli("status", "run-dir", cwd=tmp_path).stdout
    again = cli("run", cfg, "--no-live", cwd=tmp_path)
    assert "alarm length on dataset 'p' cleared" in again.stderr, again.stderr[-2000:]
    assert "standing since" not in again.stdout
