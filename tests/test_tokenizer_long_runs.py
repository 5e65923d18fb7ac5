"""The Kimi encoder's pre-BPE rule: 400,000-character windows, runs of more than 25,000
whitespace or non-whitespace characters cut (../shared/reference/kimi-k2-format.md). Checked
against a character-by-character walk written from the reference text, with the real
tokenizer."""

from __future__ import annotations

import random

import pytest

from specgen.render import get_renderer
from specgen.tokenizer import MAX_ENCODE_CHARS, MAX_RUN, long_text_pieces, prefix_state


def walk(text: str) -> list[str]:
    """The reference's rule, literally: per window, a run counter per character class."""
    pieces = []
    for w in range(0, len(text), MAX_ENCODE_CHARS):
        s = text[w:w + MAX_ENCODE_CHARS]
        start, run, space = 0, 0, s[:1].isspace()
        for i, ch in enumerate(s):
            if ch.isspace() != space:
                space, run = ch.isspace(), 1
                continue
            run += 1
            if run > MAX_RUN:
                pieces.append(s[start:i])
                start, run = i, 1
        pieces.append(s[start:])
    return [p for p in pieces if p]


def texts():
    rng = random.Random(5)
    yield "a " + "\t" * 25003 + "x"  # the issue's example
    yield "x" * 25000
    yield "x" * 25001
    yield " " * 75002 + "end"
    yield "A" * 60000 + "\n" * 30000 + "b" * 10
    yield "ab " * 140000  # longer than a window, no long run
    yield "q" * 410000  # a window boundary inside a run
    for start in (1, 12499, 12500, 12501, 24999):  # long runs wherever they begin
        yield "a b" * (start // 3) + "c" * (start % 3) + " " * 25001 + "z"
        yield " " * start + "y" * 25001
    for _ in range(6):
        parts = [rng.choice(["x", " ", "\u3000", "{}", "<|im_end|>", "中"]) * rng.choice(
            [1, 7, 24999, 25000, 25001, 60000]) for _ in range(rng.randint(1, 6))]
        yield "".join(parts)


@pytest.mark.parametrize("text", list(texts()), ids=lambda t: f"{len(t)}chars")
def test_pieces_follow_the_reference_rule(text):
    assert long_text_pieces(text) == walk(text)
    assert "".join(long_text_pieces(text)) == text


def test_encode_applies_the_rule_everywhere(kimi_tokenizer):
    tok = kimi_tokenizer
    for text in texts():
        want = [i for p in walk(text) for i in tok._enc.encode(p, allowed_special="all")]
        assert tok.encode(text) == want
        ordinary = [i for p in walk(text) for i in tok._enc.encode_ordinary(p)]
        assert tok.encode_ordinary(text) == ordinary


def test_the_issues_example_changes_the_prompt(kimi_tokenizer):
    r = get_renderer("kimi-k2.5", kimi_tokenizer, thinking=True)
    messages = [{"role": "user", "content": "a " + "\t" * 25003 + "x"}]
    ids = r.prompt_ids(messages)
    text = r.render_text(messages, None, add_generation_prompt=True)
    whole = kimi_tokenizer._enc.encode(text, allowed_special="all")
    assert ids != whole  # encoding the whole string at once is what the rule changes
    assert ids == [i for p in walk(text)
                   for i in kimi_tokenizer._enc.encode(p, allowed_special="all")]
    assert kimi_tokenizer.decode(ids) == text


def split_at(text: str, at: int) -> list[str]:
    """The walk's pieces of `text`, restricted to text[at:] (a cut is made at `at` too)."""
    out, pos = [], 0
    for p in walk(text):
        lo, hi = pos, pos + len(p)
        pos = hi
        if hi > at:
            out.append(text[max(lo, at):hi])
    return out


def test_text_after_a_prefix_is_cut_as_in_the_whole_string():
    rng = random.Random(11)
    cases = [("x" * 24990, "y" * 20), ("a " * 10 + "b" * 25000, "c"), (" " * 30000, " " * 30000),
             ("p" * (MAX_ENCODE_CHARS - 5), "q" * 12), ("w " * 200001, "z" * 25001),
             ("", "k" * 25002), ("end\n", "x" * 25001), ("m" * 50000, "n" * 50001)]
    for _ in range(40):
        parts = [rng.choice(["x", " ", "中", "\n"]) * rng.choice([1, 9, 12500, 24999, 25001])
                 for _ in range(rng.randint(1, 5))]
        text = "".join(parts)
        cut = rng.randint(0, len(text))
        cases.append((text[:cut], text[cut:]))
    for prefix, text in cases:
        want = split_at(prefix + text, len(prefix))
        got = [p for p in long_text_pieces(text, prefix_state(prefix)) if p]
        assert got == want, (len(prefix), len(text))


def test_a_completion_is_encoded_as_sampled_not_as_it_reads_after_its_prompt(kimi_tokenizer):
    # A served model samples the completion after the prompt: the prompt's trailing run (and
    # its closing special-token text) does not count into the completion's long-run rule.
    r = get_renderer("kimi-k2.5", kimi_tokenizer, thinking=False)
    context = [{"role": "user", "content": "z" * 24000}]
    answer = {"role": "assistant", "content": "y" * 25001, "reasoning_content": None}
    s = r.sample([*context, answer])
    text = r.completion_text(answer)
    alone = [i for p in walk(text[:-len("<|im_end|>")])
             for i in kimi_tokenizer._enc.encode(p, allowed_special="all")]
    assert s.input_ids[s.n_prompt:] == alone + [163586]
    whole = r.render_text(context, None, add_generation_prompt=True) + text
    as_one = [i for p in walk(whole) for i in kimi_tokenizer._enc.encode(p, allowed_special="all")]
    assert s.input_ids != as_one  # what the tokenizer's own encode of the whole string gives


def test_a_run_reaching_a_special_token_in_a_completion_keeps_the_token(kimi_tokenizer):
    # The model sampled `<|im_end|>` as one id; the whole-string encode would cut the run
    # inside its text.
    r = get_renderer("kimi-k2.5", kimi_tokenizer, thinking=False)
    ids = r.completion_ids({"role": "assistant", "content": "x" * 24995})
    assert ids[-1] == 163586
    assert kimi_tokenizer.encode("x" * 24995 + "<|im_end|>")[-1] != 163586
