"""Tokenizer loading from a model directory, a hub id, or the built-in demo tokenizer.

Two layouts are understood, the ones users get from a model hub:

* Kimi family: ``tiktoken.model`` (base64 BPE ranks) + ``tokenizer_config.json`` whose
  ``added_tokens_decoder`` names the special ids. Every id from the end of the BPE ranks up to
  256 further ids is special; unnamed ones are ``<|reserved_token_{id}|>``.
* Any HF fast tokenizer: ``tokenizer.json`` (+ ``tokenizer_config.json`` and
  ``chat_template.jinja`` or a ``chat_template`` key).

Both encode with every special token allowed, as the models' own tokenizers do: a literal
``<|im_end|>`` inside text becomes the control id. No BOS/EOS is ever added by ``encode``.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

KIMI_NUM_RESERVED_SPECIAL = 256

# The Kimi K2 split pattern (see docs/tokenizers.md). tiktoken's regex engine honours the
# `&&` class intersection.
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# Files fetched for a hub id: only what a tokenizer needs, never weights.
HUB_TOKENIZER_FILES = (
    "tokenizer_config.json",
    "tiktoken.model",
    "tokenizer.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",  # its eos_token_id list names the stop tokens of some models
)

DEMO_TOKENIZER_DIR = Path(__file__).parent / "data" / "demo-tokenizer"


class TokenizerError(Exception):
    """A tokenizer could not be loaded; the message names the file and what is wrong."""


ENCODE_MODES = ("whole", "split_special")


class Tokenizer:
    """Common interface of the loaded tokenizers."""

    name: str
    path: Path
    special_tokens: dict[str, int]  # token text -> id, for every special/added token
    chat_template: str | None
    config: dict[str, Any]

    def encode(self, text: str) -> list[int]:
        """Encode with every special token allowed (literal control text becomes its id)."""
        raise NotImplementedError

    def encode_ordinary(self, text: str) -> list[int]:
        """Encode treating special-token text as plain text."""
        raise NotImplementedError

    # True when how text encodes depends on the text before it in the same string (beyond a
    # special-token boundary): the Kimi encoder's long-run rule.
    prefix_sensitive: bool = False

    def encode_after(self, prefix: str, text: str) -> list[int]:
        """Ids of `text` where it follows `prefix` (ending in a special token) in one string."""
        return self.encode(text)

    # How the long-run rule meets special-token text (docs/tokenizers.md, "Which encode"):
    # "whole" runs it over the whole string, as the Kimi tokenizer's own `encode(text)` does;
    # "split_special" splits the special tokens off first and runs it on each text between
    # them, as `tokenizer(text, add_special_tokens=False)` / apply_chat_template do (vLLM,
    # SGLang, transformers). Only the Kimi layout has the rule; elsewhere both are the same.
    encode_mode: str = "whole"

    def with_encode(self, mode: str) -> Tokenizer:
        """This tokenizer with `mode` ("whole" | "split_special"); a copy when it differs."""
        if mode not in ENCODE_MODES:
            raise TokenizerError(f"encode must be one of {', '.join(ENCODE_MODES)}, not {mode!r}")
        if mode == self.encode_mode:
            return self
        import copy

        other = copy.copy(self)
        other.encode_mode = mode
        return other

    def decode(self, ids: Sequence[int]) -> str:
        """Exact text of ids (byte concatenation; invalid UTF-8 is replaced)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        raise NotImplementedError

    def token_bytes(self, token_id: int) -> bytes:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @cached_property
    def id_to_special(self) -> dict[int, str]:
        return {i: t for t, i in self.special_tokens.items()}

    def token_id(self, token: str) -> int:
        """Id of a special token by its text; KeyError naming the token if absent."""
        try:
            return self.special_tokens[token]
        except KeyError:
            raise KeyError(f"tokenizer {self.name!r} has no special token {token!r}") from None

    def is_special(self, token_id: int) -> bool:
        return token_id in self.id_to_special

    @property
    def eos_token(self) -> str | None:
        tok = self.config.get("eos_token")
        if isinstance(tok, dict):
            tok = tok.get("content")
        return tok if isinstance(tok, str) else None

    @cached_property
    def fingerprint(self) -> str:
        """sha256 over the tokenizer files, used in manifests and the run's config hash."""
        h = hashlib.sha256()
        for fname in sorted(os.listdir(self.path)):
            if fname in HUB_TOKENIZER_FILES:
                h.update(fname.encode())
                h.update((self.path / fname).read_bytes())
        return h.hexdigest()


class TiktokenTokenizer(Tokenizer):
    """Kimi-style tokenizer: ``tiktoken.model`` ranks + ``tokenizer_config.json``."""

    prefix_sensitive = True

    def __init__(self, path: Path):
        import tiktoken

        self.path = path
        self.name = path.name
        self.config = _read_json(path / "tokenizer_config.json")
        ranks = _read_tiktoken_ranks(path / "tiktoken.model")
        n_base = len(ranks)
        named: dict[int, str] = {}
        decoder = self.config.get("added_tokens_decoder") or {}
        if not isinstance(decoder, dict):
            raise TokenizerError(
                f"{path / 'tokenizer_config.json'}: 'added_tokens_decoder' must be an object"
            )
        for key, entry in decoder.items():
            try:
                tid = int(key)
                content = entry["content"] if isinstance(entry, dict) else str(entry)
            except (ValueError, KeyError, TypeError) as exc:
                raise TokenizerError(
                    f"{path / 'tokenizer_config.json'}: bad added_tokens_decoder entry {key!r}: {exc}"
                ) from None
            if tid < n_base:
                raise TokenizerError(
                    f"{path / 'tokenizer_config.json'}: added token {content!r} has id {tid}, "
                    f"inside the {n_base} BPE ranks of tiktoken.model"
                )
            named[tid] = content
        n_special = max(KIMI_NUM_RESERVED_SPECIAL, max(named, default=0) - n_base + 1)
        self.special_tokens = {}
        for tid in range(n_base, n_base + n_special):
            self.special_tokens[named.get(tid, f"<|reserved_token_{tid}|>")] = tid
        self._n_vocab = n_base + n_special
        self._enc = tiktoken.Encoding(
            name=f"specgen-{self.name}",
            pat_str=KIMI_PAT_STR,
            mergeable_ranks=ranks,
            special_tokens=self.special_tokens,
        )
        self.chat_template = _read_chat_template(path, self.config)

        self._splitter = SpecialSplitter(self.special_tokens, self._enc.encode_ordinary)
        if not self._splitter.agrees_with(lambda t: self._enc.encode(t, allowed_special="all")):
            self._splitter = None

    def encode(self, text: str) -> list[int]:
        if len(text) > MAX_RUN:
            if self.encode_mode == "split_special":
                return self._encode_split(text, (0, 0, False))
            pieces = long_text_pieces(text)
            if len(pieces) > 1:
                return [i for piece in pieces for i in self._encode_piece(piece)]
        return self._encode_piece(text)

    @cached_property
    def _special_re(self) -> re.Pattern[str]:
        # leftmost, then longest: what transformers' added-token trie splits on
        names = sorted(self.special_tokens, key=len, reverse=True)
        return re.compile("|".join(map(re.escape, names)))

    def _encode_split(self, text: str, state: tuple[int, int, bool]) -> list[int]:
        """split_special: special tokens first, then the long-run rule on each text between
        them (its windows and runs start afresh after every special token)."""
        out: list[int] = []
        pos = 0
        for m in self._special_re.finditer(text):
            if m.start() > pos:
                for piece in long_text_pieces(text[pos:m.start()], state):
                    out += self._encode_piece(piece)
            state = (0, 0, False)
            out.append(self.special_tokens[m.group()])
            pos = m.end()
        if pos < len(text):
            for piece in long_text_pieces(text[pos:], state):
                out += self._encode_piece(piece)
        return out

    def _tail_segment(self, prefix: str) -> str:
        """The text of `prefix` after its last special token (all of it when it has none)."""
        for name in self.special_tokens:  # the usual case: the prompt ends with one
            if prefix.endswith(name):
                return ""
        end = 0
        for m in self._special_re.finditer(prefix):
            end = m.end()
        return prefix[end:]

    def _encode_piece(self, text: str) -> list[int]:
        if self._splitter is None:
            return self._enc.encode(text, allowed_special="all")
        return self._splitter.encode(text)

    def encode_after(self, prefix: str, text: str) -> list[int]:
        if self.encode_mode == "split_special":  # the run goes on only from the prefix's tail
            tail = self._tail_segment(prefix)
            if len(text) <= MAX_RUN and not tail:
                return self._encode_piece(text)
            return self._encode_split(text, prefix_state(tail))
        pieces = long_text_pieces(text, prefix_state(prefix))
        if len(pieces) == 1:
            return self._encode_piece(pieces[0])
        return [i for piece in pieces for i in self._encode_piece(piece)]

    def encode_ordinary(self, text: str) -> list[int]:
        if len(text) > MAX_RUN:
            pieces = long_text_pieces(text)
            if len(pieces) > 1:
                return [i for piece in pieces for i in self._enc.encode_ordinary(piece)]
        return self._enc.encode_ordinary(text)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return self._enc.decode_bytes(ids)

    def token_bytes(self, token_id: int) -> bytes:
        return self._enc.decode_single_token_bytes(token_id)

    @property
    def vocab_size(self) -> int:
        return self._n_vocab


# The Kimi tokenizer's own rule before BPE (../shared/reference/kimi-k2-format.md, "Encoding
# rule"): the text is cut into windows of MAX_ENCODE_CHARS characters, and within each window
# a run of whitespace (or of non-whitespace) characters is cut each time it grows past
# MAX_RUN; every piece is encoded on its own.
MAX_ENCODE_CHARS = 400_000
MAX_RUN = 25_000
_LONG_RUN = re.compile(rf"\s{{{MAX_RUN + 1}}}|\S{{{MAX_RUN + 1}}}")
_RUNS = re.compile(r"\s+|\S+")
# A run longer than MAX_RUN covers two checkpoints HALF apart, and from the first of them it
# goes on for more than HALF characters: so testing HALF characters forward from every
# checkpoint finds every long run, at a cost of len / HALF tiny matches (the full regex scan
# costs ~15 ns per character).
_HALF = MAX_RUN // 2
_FORWARD = (re.compile(rf"\S{{{_HALF + 1}}}"), re.compile(rf"\s{{{_HALF + 1}}}"))


def _may_have_long_run(text: str) -> bool:
    for p in range(0, len(text), _HALF):
        if _FORWARD[text[p].isspace()].match(text, p) is not None:
            return True
    return False


def long_text_pieces(text: str, state: tuple[int, int, bool] = (0, 0, False)) -> list[str]:
    """The pieces the Kimi encoder encodes separately (one piece for all but huge inputs).

    `state` is `prefix_state(prefix)` when `text` follows `prefix` in one encoded string (a
    completion after its prompt): where the prefix's window ends, and the run it ends with."""
    offset, carry, carry_space = state
    if (offset + len(text) <= MAX_ENCODE_CHARS and not _may_have_long_run(text)
            and (not carry or _leading_run(text, carry_space) + carry <= MAX_RUN)):
        return [text]
    out: list[str] = []
    first = MAX_ENCODE_CHARS - offset
    for w in [0, *range(first, len(text), MAX_ENCODE_CHARS)]:
        window = text[w:w + (first if w == 0 else MAX_ENCODE_CHARS)]
        start = 0
        lead = carry if w == 0 and window[:1] and window[0].isspace() == carry_space else 0
        if lead or _LONG_RUN.search(window) is not None:
            for m in _RUNS.finditer(window):
                cut, end = m.start() + MAX_RUN - lead, m.end()
                lead = 0
                while cut < end:  # the run grew past MAX_RUN here: a new piece starts
                    if cut > start:
                        out.append(window[start:cut])
                        start = cut
                    cut += MAX_RUN
        out.append(window[start:])
    return [p for p in out if p]


def prefix_state(prefix: str) -> tuple[int, int, bool]:
    """What the encoding rule carries from `prefix` into text that follows it: the position
    in the current 400,000-character window, and the length (as the run counter holds it) and
    class (whitespace or not) of the run the prefix ends with."""
    offset = len(prefix) % MAX_ENCODE_CHARS
    if not offset:
        return 0, 0, False
    space = prefix[-1].isspace()
    run, pos = 0, len(prefix)
    window_start = len(prefix) - offset
    while pos > window_start:  # walk back over the trailing run in growing chunks
        lo = max(window_start, pos - max(64, run))
        m = _TRAILING_RUN[space].search(prefix, lo, pos)
        if m is None:  # the run began exactly at pos
            break
        run += pos - m.start()
        if m.start() > lo:
            break
        pos = lo
    return offset, (run - 1) % MAX_RUN + 1, space


_TRAILING_RUN = (re.compile(r"\S+$"), re.compile(r"\s+$"))
_LEADING = (re.compile(rf"\S{{0,{MAX_RUN + 1}}}"), re.compile(rf"\s{{0,{MAX_RUN + 1}}}"))


def _leading_run(text: str, space: bool) -> int:
    return _LEADING[space].match(text).end()


# Pieces of plain text remembered by SpecialSplitter: role names, system prompts, tool
# declarations and earlier turns recur across requests. Bounded by total characters.
PIECE_CACHE_MAX_PIECE = 8192
PIECE_CACHE_MAX_TOTAL = 1 << 20


class SpecialSplitter:
    """Encode with every special token allowed, without tiktoken's per-call special scan.

    tiktoken's `encode(allowed_special="all")` converts the special set on every call (~50 us,
    whatever the text length). This finds special-token text itself and BPE-encodes the plain
    text between specials with `encode_ordinary` — what tiktoken does too, so the ids are the
    same as long as no special token is a prefix of another (checked; otherwise unused).
    """

    _CHECK_TEXTS = (
        "",
        "plain words, numbers 12345 and   spaces\n\n",
        "<|im_user|>user<|im_middle|>Hello <think>x</think> y<|im_end|>",
        "a<|im_end|>b<|im_end|><|im_end|> [EOS] <| not special |> <thinking> [x] <<|im_end|>>",
        "中文 text \U0001F600 and \u2728! <|reserved_token_999999|> [",
    )

    def __init__(self, special_tokens: dict[str, int], encode_ordinary):
        self._special = dict(special_tokens)
        self._encode_ordinary = encode_ordinary
        self._lengths = sorted({len(t) for t in self._special}, reverse=True)
        starts = "".join(sorted({t[0] for t in self._special if t}))
        self._finder = re.compile("[" + re.escape(starts) + "]") if starts else None
        names = sorted(self._special)
        self.prefix_free = "" not in self._special and not any(
            b.startswith(a) for a, b in zip(names, names[1:], strict=False)
        )
        # When every special token starting with a character ends at the first occurrence of
        # one same character after it (`<|...|>`, `<think>`, `[EOS]`), one bounded regex finds
        # each candidate whole and one dict lookup tests it (instead of a lookup per length).
        ends: dict[str, set[str]] = {}
        for t in self._special:
            ends.setdefault(t[:1], set()).add(t[-1:])
        self._candidates = None
        if self._special and all(len(v) == 1 for v in ends.values()) and all(
            len(t) >= 2 and t[-1] not in t[1:-1] for t in self._special
        ):
            most = max(len(t) for t in self._special) - 2
            self._candidates = re.compile("|".join(
                f"{re.escape(a)}[^{re.escape(b)}]{{0,{most}}}{re.escape(b)}"
                for a, (b,) in sorted((a, tuple(v)) for a, v in ends.items())
            ))
            self._split = re.compile(f"({self._candidates.pattern})").split
        self._cache: dict[str, list[int]] = {}
        self._cached_chars = 0

    def agrees_with(self, reference) -> bool:
        """True when this splitter can stand in for `reference` (same ids on check texts)."""
        texts = self._CHECK_TEXTS + tuple(self._special)[:64]
        return self.prefix_free and all(self.encode(t) == reference(t) for t in texts)

    def _plain(self, text: str) -> list[int]:
        ids = self._cache.get(text)
        if ids is None:
            ids = self._encode_ordinary(text)
            if len(text) <= PIECE_CACHE_MAX_PIECE:
                if self._cached_chars + len(text) > PIECE_CACHE_MAX_TOTAL:
                    self._cache.clear()
                    self._cached_chars = 0
                self._cache[text] = ids
                self._cached_chars += len(text)
        return ids

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        if self._finder is None:
            return list(self._plain(text)) if text else out
        if self._candidates is not None:
            return self._encode_candidates(text)
        special, lengths, pos = self._special, self._lengths, 0
        for m in self._finder.finditer(text):
            p = m.start()
            if p < pos:
                continue
            for n in lengths:
                tid = special.get(text[p:p + n])
                if tid is not None:
                    if p > pos:
                        out += self._plain(text[pos:p])
                    out.append(tid)
                    pos = p + n
                    break
        if pos < len(text):
            out += self._plain(text[pos:])
        return out

    def _encode_candidates(self, text: str) -> list[int]:
        # One C-level split gives [plain, candidate, plain, candidate, ..., plain].
        parts = self._split(text)
        out: list[int] = []
        get, run = self._special.get, ""
        for i in range(1, len(parts), 2):
            c = parts[i]
            tid = get(c)
            if tid is None:  # plain text after all (`<b>`, `[1]`) ...
                if self._finder.search(c, 1):  # ... unless a special token may start inside
                    return self._encode_searching(text)
                run += parts[i - 1] + c
                continue
            piece = run + parts[i - 1] if run else parts[i - 1]
            if piece:
                out += self._plain(piece)
            run = ""
            out.append(tid)
        piece = run + parts[-1] if run else parts[-1]
        if piece:
            out += self._plain(piece)
        return out

    def _encode_searching(self, text: str) -> list[int]:
        """The candidates one at a time, retrying one character on after each miss."""
        out: list[int] = []
        special, search, pos = self._special, self._candidates.search, 0
        m = search(text)
        while m is not None:
            p, e = m.span()
            tid = special.get(text[p:e])
            if tid is None:  # not a special token: one may still start inside it
                m = search(text, p + 1)
                continue
            if p > pos:
                out += self._plain(text[pos:p])
            out.append(tid)
            pos = e
            m = search(text, e)
        if pos < len(text):
            out += self._plain(text[pos:])
        return out


class HFTokenizer(Tokenizer):
    """Any HF fast tokenizer (``tokenizer.json``) through the ``tokenizers`` library."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as _HFTok

        self.path = path
        self.name = path.name
        tj = path / "tokenizer.json"
        try:
            self._tok = _HFTok.from_file(str(tj))
        except Exception as exc:  # the library raises a bare Exception on bad JSON
            raise TokenizerError(f"{tj}: not a valid HF tokenizer.json ({exc})") from None
        cfg_path = path / "tokenizer_config.json"
        self.config = _read_json(cfg_path) if cfg_path.exists() else {}
        self.special_tokens = {
            t.content: i for i, t in self._tok.get_added_tokens_decoder().items()
        }
        self.chat_template = _read_chat_template(path, self.config)
        self._byte_decoder = _bytelevel_decoder() if _uses_bytelevel(tj) else None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_ordinary(self, text: str) -> list[int]:
        # Split on special-token text ourselves so it is encoded as plain characters.
        if not self.special_tokens:
            return self.encode(text)
        from tokenizers import Tokenizer as _HFTok

        if not hasattr(self, "_plain"):
            plain = _HFTok.from_str(self._tok.to_str())
            # Re-declaring added tokens as non-special still matches them; strip them instead.
            data = json.loads(plain.to_str())
            data["added_tokens"] = []
            self._plain = _HFTok.from_str(json.dumps(data))
        return self._plain.encode(text, add_special_tokens=False).ids

    def token_bytes(self, token_id: int) -> bytes:
        if token_id in self.id_to_special:
            return self.id_to_special[token_id].encode()
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            raise KeyError(f"token id {token_id} outside the vocabulary of {self.name!r}")
        if self._byte_decoder is not None:
            return bytes(self._byte_decoder[ch] for ch in piece)
        return self._tok.decode([token_id], skip_special_tokens=False).encode()

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        if self._byte_decoder is None:
            return self._tok.decode(list(ids), skip_special_tokens=False).encode()
        return b"".join(self.token_bytes(i) for i in ids)

    def decode(self, ids: Sequence[int]) -> str:
        if self._byte_decoder is None:
            return self._tok.decode(list(ids), skip_special_tokens=False)
        return super().decode(ids)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


def load_tokenizer(spec: str | os.PathLike[str], encode: str = "whole") -> Tokenizer:
    """Load a tokenizer from a model dir, a hub id (``owner/name``), or ``"demo"``; `encode`:
    how the long-run rule meets special tokens ("whole" | "split_special", `encode_mode`)."""
    spec_str = os.fspath(spec)
    if spec_str == "demo":
        path = DEMO_TOKENIZER_DIR
    else:
        path = Path(spec_str).expanduser()
        if not path.exists():
            if not _looks_like_hub_id(spec_str):
                raise TokenizerError(f"tokenizer path {spec_str!r} does not exist")
            try:
                path = download_tokenizer(spec_str)
            except TokenizerError as exc:
                raise TokenizerError(
                    f"{spec_str!r} is not a local directory, so it was taken as a hub id: {exc}"
                ) from None
    return _load_dir(path).with_encode(encode)


def _load_dir(path: Path) -> Tokenizer:
    if not path.is_dir():
        raise TokenizerError(f"tokenizer path {str(path)!r} is not a directory")
    if (path / "tiktoken.model").exists():
        if not (path / "tokenizer_config.json").exists():
            raise TokenizerError(
                f"{path}: tiktoken.model found but tokenizer_config.json is missing "
                "(it names the special tokens)"
            )
        return TiktokenTokenizer(path)
    if (path / "tokenizer.json").exists():
        return HFTokenizer(path)
    raise TokenizerError(
        f"{path}: no tokenizer files (expected tiktoken.model + tokenizer_config.json, "
        "or tokenizer.json)"
    )


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))


def hub_cache_dir() -> Path:
    root = os.environ.get("SPECGEN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "specgen"
    )
    return Path(root) / "hub"


def download_tokenizer(repo_id: str, revision: str = "main") -> Path:
    """Fetch only the tokenizer files of a hub model into the specgen cache."""
    dest = hub_cache_dir() / repo_id.replace("/", "--") / revision
    if (dest / "tokenizer_config.json").exists() and (
        (dest / "tiktoken.model").exists() or (dest / "tokenizer.json").exists()
    ):
        return dest
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    headers = {"User-Agent": "specgen"}
    token = os.environ.get("HF_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    dest.mkdir(parents=True, exist_ok=True)
    got = []
    for fname in HUB_TOKENIZER_FILES:
        url = f"{endpoint}/{repo_id}/resolve/{revision}/{fname}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
                data = r.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                continue
            raise TokenizerError(
                f"downloading {fname} of {repo_id!r} from {endpoint} failed: HTTP {exc.code}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise TokenizerError(
                f"cannot download the tokenizer of {repo_id!r} from {endpoint} "
                f"({getattr(exc, 'reason', exc)}); download the model's tokenizer files "
                "yourself and give their directory as the tokenizer path"
            ) from None
        tmp = dest / (fname + ".part")
        tmp.write_bytes(data)
        tmp.replace(dest / fname)
        got.append(fname)
    if "tiktoken.model" not in got and "tokenizer.json" not in got:
        raise TokenizerError(f"hub model {repo_id!r} has neither tiktoken.model nor tokenizer.json")
    return dest


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise TokenizerError(f"{path}: file is missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object at the top level")
    return data


def _read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read ({exc.strerror})") from None
    ranks: dict[bytes, int] = {}
    a2b = binascii.a2b_base64
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[a2b(token, strict_mode=True)] = int(rank)
        except ValueError:  # binascii.Error is a ValueError
            raise TokenizerError(
                f"{path}:{lineno}: expected 'base64-token rank', got {line[:60]!r}"
            ) from None
    if not ranks:
        raise TokenizerError(f"{path}: no BPE ranks in file")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise TokenizerError(f"{path}: ranks are not the contiguous range 0..{len(ranks) - 1}")
    return ranks


def _read_chat_template(path: Path, config: dict[str, Any]) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    tmpl = config.get("chat_template")
    if isinstance(tmpl, list):  # [{"name": "default", "template": ...}, ...]
        by_name = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
        tmpl = by_name.get("default") or next(iter(by_name.values()), None)
    return tmpl if isinstance(tmpl, str) else None


def _uses_bytelevel(tokenizer_json: Path) -> bool:
    with open(tokenizer_json, "rb") as f:
        data = json.load(f)
    dec = data.get("decoder") or {}
    kinds = {dec.get("type")} | {d.get("type") for d in dec.get("decoders", []) or []}
    return "ByteLevel" in kinds


def _bytelevel_decoder() -> dict[str, int]:
    """The GPT-2 byte-to-unicode table, inverted: printable char -> byte value."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {}
    extra = 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table
