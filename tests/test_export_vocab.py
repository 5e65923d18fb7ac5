"""`specgen export --format vocab`: frequencies over the trained tokens equal a count done
here on the tokens export of the same samples; d2t / t2d pick the most frequent ids; the files
load as the trainers load them: `np.load` (speculators' trainer reads d2t.npy / t2d.npy) and,
in the trainers' side venv (SPECGEN_SPECULATORS_PYTHON, see docs/outputs.md), speculators' own
`build_vocab_mappings_from_distribution` gives the same mapping from our frequencies; with torch
installed, SpecForge's `load_vocab_mapping` reads vocab_mapping.pt (tests/vocab_probe.py runs
there)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from test_stats import cli, planted_run  # noqa: F401 - the seeded run fixture


def read_npy(path: Path) -> tuple[str, list]:
    """(descr, values) of a 1-D .npy file, read by hand (format 1.0)."""
    data = path.read_bytes()
    assert data[:8] == b"\x93NUMPY\x01\x00"
    (hlen,) = struct.unpack("<H", data[8:10])
    header = data[10:10 + hlen].decode("latin1")
    assert (10 + hlen) % 64 == 0 and header.endswith("\n")
    body = data[10 + hlen:]
    if "'<i8'" in header:
        return "<i8", list(struct.unpack(f"<{len(body) // 8}q", body))
    assert "'|b1'" in header
    return "|b1", [bool(b) for b in body]


FILTERS = ["--dedup", "--max-repetition", "63", "--drop-truncated"]


def test_frequencies_are_a_count_of_the_trained_tokens(planted_run, tmp_path):  # noqa: F811
    tok = tmp_path / "t.jsonl"
    proc = cli("export", str(planted_run), "-f", "tokens", "--jsonl", "-o", str(tok), *FILTERS)
    assert proc.returncode == 0, proc.stderr
    want: Counter[int] = Counter()
    for line in tok.read_text().splitlines():
        row = json.loads(line)
        want.update(i for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m)
    out = tmp_path / "vocab"
    proc = cli("export", str(planted_run), "-f", "vocab", "--draft-vocab-size", "64",
               "-o", str(out), *FILTERS)
    assert proc.returncode == 0, proc.stderr
    got = {int(k): v for k, v in json.loads((out / "token_freq.json").read_text()).items()}
    assert got == dict(want)
    m = json.loads((out / "manifest.json").read_text())
    assert m["vocab"]["trained_tokens"] == sum(want.values()) == m["totals"]["loss_tokens"]
    assert m["excluded"]["filtered"]["samples"] == 6  # the filters apply as to tokens
    target = m["vocab"]["target_vocab_size"]
    _, d2t = read_npy(out / "d2t.npy")
    _, t2d = read_npy(out / "t2d.npy")
    assert len(d2t) == 64 and len(t2d) == target and sum(t2d) == 64
    chosen = [i + off for i, off in enumerate(d2t)]
    assert chosen == sorted(chosen) and [t for t, on in enumerate(t2d) if on] == chosen
    top = sorted(want.items(), key=lambda kv: (-kv[1], kv[0]))[:64]
    assert set(chosen) == {t for t, _ in top}
    np = pytest.importorskip("numpy")
    assert np.load(out / "d2t.npy").dtype == np.int64 and np.load(out / "t2d.npy").dtype == bool
    assert np.load(out / "d2t.npy").tolist() == d2t


def test_fewer_tokens_seen_than_the_draft_vocabulary(planted_run, tmp_path):  # noqa: F811
    out = tmp_path / "vocab"
    proc = cli("export", str(planted_run), "-f", "vocab", "--draft-vocab-size", "4000",
               "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    seen = {int(k) for k in json.loads((out / "token_freq.json").read_text())}
    _, d2t = read_npy(out / "d2t.npy")
    chosen = [i + off for i, off in enumerate(d2t)]
    assert len(chosen) == len(set(chosen)) == 4000 and seen <= set(chosen)
    m = json.loads((out / "manifest.json").read_text())
    assert m["vocab"]["coverage"] == 1.0


@pytest.mark.parametrize(("args", "message"), [
    (["--draft-vocab-size", "0"], "--draft-vocab-size must be at least 1"),
    (["--draft-vocab-size", "99999999"], "is larger than the target's vocabulary"),
    (["--draft-vocab-size", "5", "--target-vocab-size", "10"], "give --target-vocab-size"),
    (["--split-by-dataset"], "--split-by-dataset does not apply to --format vocab"),
])
def test_bad_sizes_are_messages(planted_run, tmp_path, args, message):  # noqa: F811
    proc = cli("export", str(planted_run), "-f", "vocab", "-o", str(tmp_path / "v"), *args)
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr and "Traceback" not in proc.stderr


def trainers_python() -> str:
    env = os.environ.get("SPECGEN_SPECULATORS_PYTHON")
    if not env or not Path(env).exists():
        pytest.skip("the trainers' side venv is not here; set SPECGEN_SPECULATORS_PYTHON (an "
                    "interpreter with speculators and torch: .ci/trainers builds it)")
    return env


def test_the_trainers_load_it(planted_run, tmp_path):  # noqa: F811
    python = trainers_python()
    out = tmp_path / "vocab"
    args = ["export", str(planted_run), "-f", "vocab", "--draft-vocab-size", "256", "-o", str(out)]
    # specgen itself in the trainers' interpreter (it has torch): the .pt files get written
    src = Path(__file__).resolve().parents[1] / "src"
    proc = subprocess.run([python, "-m", "specgen", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(src)})
    with_torch = proc.returncode == 0
    if not with_torch:  # specgen's own dependencies are not all there: the .npy files only
        proc = cli(*args)
        assert proc.returncode == 0, proc.stderr
    result_path = tmp_path / "result.json"
    run = subprocess.run([python, str(Path(__file__).with_name("vocab_probe.py")), str(out),
                          str(result_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(result_path.read_text())
    assert result["d2t_equal"] and result["t2d_equal"] and result["trainer_equal"], result
    assert (result["d2t_dtype"], result["t2d_dtype"]) == ("int64", "bool")
    assert all(v for k, v in result.items() if k.endswith("_equal")), result
    if with_torch:
        assert result.get("token_freq_pt_equal") and result.get("specforge_equal"), result



def tokens_rows(run, tmp_path) -> list[dict]:
    tok = tmp_path / "t.jsonl"
    proc = cli("export", str(run), "-f", "tokens", "--jsonl", "-o", str(tok))
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in tok.read_text().splitlines()]


def specforge_choice(rows, draft_size: int, max_length: int | None) -> list[int]:
    """SpecForge's rule, written here from its preprocessing code: each sample truncated to
    max_length, its loss-masked ids `unique()`d (ascending) into a Counter, then
    `most_common(draft_size)` (ties: first inserted), the chosen ids sorted."""
    counter: Counter[int] = Counter()
    for row in rows:
        ids, mask = row["input_ids"][:max_length], row["loss_mask"][:max_length]
        masked = Counter(i for i, m in zip(ids, mask, strict=True) if m)
        counter.update(dict(sorted(masked.items())))
    return sorted(t for t, _ in counter.most_common(draft_size))


def chosen_ids(out: Path) -> list[int]:
    _, d2t = read_npy(out / "d2t.npy")
    return [i + off for i, off in enumerate(d2t)]


@pytest.mark.parametrize("max_length", [None, 40])
def test_first_seen_ties_and_max_length_give_specforges_mapping(planted_run, tmp_path,  # noqa: F811
                                                                 max_length):
    rows = tokens_rows(planted_run, tmp_path)
    extra = [] if max_length is None else ["--max-length", str(max_length)]
    differs = False
    for size in (8, 50):
        out = tmp_path / f"v{size}-{max_length}"
        proc = cli("export", str(planted_run), "-f", "vocab", "--draft-vocab-size", str(size),
                   "--vocab-ties", "first-seen", "-o", str(out), *extra)
        assert proc.returncode == 0, proc.stderr
        assert chosen_ids(out) == specforge_choice(rows, size, max_length)
        low = tmp_path / f"l{size}-{max_length}"
        assert cli("export", str(planted_run), "-f", "vocab", "--draft-vocab-size", str(size),
                   "-o", str(low), *extra).returncode == 0
        differs |= chosen_ids(low) != chosen_ids(out)
        m = json.loads((out / "manifest.json").read_text())["vocab"]
        assert m["ties"] == "first-seen" and m["max_length"] == max_length
    if max_length is not None:
        got = {int(k): v for k, v in json.loads((out / "token_freq.json").read_text()).items()}
        want: Counter[int] = Counter()
        for row in rows:
            want.update(i for i, m in zip(row["input_ids"][:max_length],
                                          row["loss_mask"][:max_length], strict=True) if m)
        assert got == dict(want) and sum(want.values()) < sum(
            sum(r["loss_mask"]) for r in rows)  # the cut left trained tokens out
    assert differs  # the two tie rules pick differently somewhere on this data


def test_the_tie_rules_differ_only_among_equal_counts():
    from specgen.export.vocab import draft_vocab

    counts = Counter({9: 5, 3: 2, 7: 2, 1: 1})
    assert draft_vocab(counts, 2, 10) == [3, 9]  # lowest id among the 2s
    assert draft_vocab(counts, 2, 10, first_seen={9: 0, 7: 1, 3: 2, 1: 3}) == [7, 9]
    assert draft_vocab(counts, 3, 10, first_seen={9: 0, 7: 1, 3: 2, 1: 3}) == [3, 7, 9]


@pytest.mark.parametrize(("args", "message"), [
    (["-f", "vocab", "--max-length", "0"], "--max-length must be at least 1"),
    (["-f", "tokens", "--max-length", "5"], "apply to --format vocab only"),
    (["-f", "tokens", "--vocab-ties", "first-seen"], "apply to --format vocab only"),
])
def test_vocab_options_are_checked(planted_run, tmp_path, args, message):  # noqa: F811
    proc = cli("export", str(planted_run), *args, "-o", str(tmp_path / "v"))
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_first_seen_equals_specforges_own_mapping_code(planted_run, tmp_path):  # noqa: F811
    python = trainers_python()
    tok = tmp_path / "t.jsonl"
    assert cli("export", str(planted_run), "-f", "tokens", "--jsonl", "-o",
               str(tok)).returncode == 0
    for size, max_length in ((8, 40), (50, 100000)):
        out = tmp_path / f"v{size}"
        proc = cli("export", str(planted_run), "-f", "vocab", "--draft-vocab-size", str(size),
                   "--vocab-ties", "first-seen", "--max-length", str(max_length), "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        target = json.loads((out / "manifest.json").read_text())["vocab"]["target_vocab_size"]
        result = tmp_path / f"sf{size}.json"
        run = subprocess.run([python, str(Path(__file__).with_name("vocab_probe.py")),
                              "specforge-ties", str(tok), str(size), str(target),
                              str(max_length), str(result)],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        want = json.loads(result.read_text())
        _, d2t = read_npy(out / "d2t.npy")
        _, t2d = read_npy(out / "t2d.npy")
        assert d2t == want["d2t"] and t2d == want["t2d"], size
