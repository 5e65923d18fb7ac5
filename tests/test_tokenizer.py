"""Tokenizer loading: Kimi tiktoken layout, HF tokenizer.json, the demo tokenizer, hub ids, errors."""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest

from conftest import model_path
from specgen.tokenizer import (
    DEMO_TOKENIZER_DIR,
    HFTokenizer,
    TiktokenTokenizer,
    TokenizerError,
    load_tokenizer,
)

TEXTS = ["hello world", "  leading spaces\n\n\ttabs", "你好，世界 😀🎉 naïve", "a<|im_end|>b", ""]


# -- demo ---------------------------------------------------------------------------------------


def test_demo_tokenizer_has_the_kimi_layout(demo_tokenizer):
    tok = demo_tokenizer
    assert isinstance(tok, TiktokenTokenizer)
    assert tok.path == DEMO_TOKENIZER_DIR
    n = tok.vocab_size - 256
    assert n == 4096
    for name, off in {"[BOS]": 0, "[EOS]": 1, "<|im_end|>": 2, "<|im_user|>": 3, "<|im_assistant|>": 4,
                      "<|im_system|>": 10, "<|tool_calls_section_begin|>": 11, "<|tool_call_end|>": 15,
                      "<|im_middle|>": 17, "<|media_pad|>": 21, "<think>": 22, "</think>": 23,
                      "[UNK]": 254, "[PAD]": 255}.items():
        assert tok.token_id(name) == n + off
    assert tok.id_to_special[n + 5] == f"<|reserved_token_{n + 5}|>"
    assert "not a real model" in tok.config["specgen_demo"]


@pytest.mark.parametrize("text", TEXTS)
def test_demo_round_trip_and_special_handling(demo_tokenizer, text):
    ids = demo_tokenizer.encode(text)
    assert demo_tokenizer.decode(ids) == text
    assert b"".join(demo_tokenizer.token_bytes(i) for i in ids) == text.encode()
    im_end = demo_tokenizer.token_id("<|im_end|>")
    assert (im_end in ids) == ("<|im_end|>" in text)
    assert im_end not in demo_tokenizer.encode_ordinary(text)


def test_demo_tokenizer_build_is_documented_and_deterministic_in_layout():
    script = (Path(__file__).resolve().parents[1] / "scripts" / "build_demo_tokenizer.py").read_text()
    assert "NOT any real model's vocabulary" in script
    lines = (DEMO_TOKENIZER_DIR / "tiktoken.model").read_text().splitlines()
    ranks = [int(line.split()[1]) for line in lines]
    assert ranks == list(range(len(lines)))
    assert [base64.b64decode(line.split()[0]) for line in lines[:256]] == [bytes([b]) for b in range(256)]


def test_load_by_keyword_and_fingerprint(demo_tokenizer):
    again = load_tokenizer("demo")
    assert again.fingerprint == demo_tokenizer.fingerprint and len(again.fingerprint) == 64


# -- real Kimi files ----------------------------------------------------------------------------


def test_kimi_k2_instruct_config_has_no_think_tokens():
    tok = load_tokenizer(model_path("kimi-k2-instruct"))
    assert tok.vocab_size == 163840
    assert tok.id_to_special[163606] == "<|reserved_token_163606|>"
    assert 163606 not in tok.encode("<think>")  # three plain tokens in K2-Instruct
    assert tok.chat_template and "tool_declare" in tok.chat_template


def test_kimi_eos_and_encoding_bytes(kimi_tokenizer):
    assert kimi_tokenizer.eos_token == "[EOS]"
    for text in TEXTS:
        ids = kimi_tokenizer.encode(text)
        assert kimi_tokenizer.decode(ids) == text
        assert kimi_tokenizer.decode_bytes(ids) == text.encode()


# -- HF tokenizer.json --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deepseek():
    return load_tokenizer(model_path("deepseek-v3"))


def test_hf_loader_deepseek(deepseek):
    assert isinstance(deepseek, HFTokenizer)
    assert deepseek.token_id("<｜end▁of▁sentence｜>") == 1
    assert deepseek.token_id("<think>") == 128821
    assert deepseek.eos_token == "<｜end▁of▁sentence｜>"
    assert deepseek.chat_template is None
    assert deepseek.vocab_size == 129280


@pytest.mark.parametrize("text", [*TEXTS, "x<｜User｜>y<think>z"])
def test_hf_round_trip_bytes_and_ordinary(deepseek, text):
    ids = deepseek.encode(text)
    assert deepseek.decode(ids) == text
    assert b"".join(deepseek.token_bytes(i) for i in ids) == text.encode()
    plain = deepseek.encode_ordinary(text)
    assert deepseek.decode(plain) == text
    assert not any(deepseek.is_special(i) for i in plain) or not text


def test_hf_chat_template_sources(tmp_path):
    src = model_path("deepseek-v3") / "tokenizer.json"
    d = tmp_path / "m"
    d.mkdir()
    (d / "tokenizer.json").symlink_to(src)
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    assert load_tokenizer(d).chat_template == "D"
    (d / "chat_template.jinja").write_text("J")
    assert load_tokenizer(d).chat_template == "J"


# -- errors -------------------------------------------------------------------------------------


def copy_demo(tmp_path) -> Path:
    d = tmp_path / "tok"
    shutil.copytree(DEMO_TOKENIZER_DIR, d)
    return d


def test_missing_paths_and_files(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerError, match="no tokenizer files"):
        load_tokenizer(tmp_path / "empty")
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(TokenizerError, match="not a directory"):
        load_tokenizer(f)
    d = copy_demo(tmp_path)
    (d / "tokenizer_config.json").unlink()
    with pytest.raises(TokenizerError, match="tokenizer_config.json is missing"):
        load_tokenizer(d)


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (lambda d: (d / "tiktoken.model").write_text("!!notbase64 0\n"), r"tiktoken.model:1: expected"),
        (lambda d: (d / "tiktoken.model").write_text("YQ== 0\nYg== 5\n"), "not the contiguous range"),
        (lambda d: (d / "tiktoken.model").write_text("\n"), "no BPE ranks"),
        (lambda d: (d / "tokenizer_config.json").write_text("{not json"), "tokenizer_config.json: not valid JSON"),
        (lambda d: (d / "tokenizer_config.json").write_text("[1]"), "expected a JSON object"),
        (lambda d: (d / "tokenizer_config.json").write_text('{"added_tokens_decoder": [1]}'),
         "'added_tokens_decoder' must be an object"),
        (lambda d: (d / "tokenizer_config.json").write_text('{"added_tokens_decoder": {"x": {}}}'),
         "bad added_tokens_decoder entry 'x'"),
        (lambda d: (d / "tokenizer_config.json").write_text(
            '{"added_tokens_decoder": {"5": {"content": "<|a|>"}}}'), "inside the 4096 BPE ranks"),
    ],
)
def test_corrupt_kimi_files_name_the_file(tmp_path, corrupt, match):
    d = copy_demo(tmp_path)
    corrupt(d)
    with pytest.raises(TokenizerError, match=match):
        load_tokenizer(d)


def test_corrupt_tokenizer_json(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(TokenizerError, match="tokenizer.json: not a valid HF tokenizer.json"):
        load_tokenizer(d)


# -- hub ids, against a real HTTP server on 127.0.0.1 --------------------------------------------


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A tiny hub: GET /{owner}/{name}/resolve/{rev}/{file} serves files of the demo dir."""
    served: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            parts = self.path.strip("/").split("/")
            fname = parts[-1]
            path = DEMO_TOKENIZER_DIR / fname
            if parts[:4] != ["acme", "demo", "resolve", "main"] or not path.exists():
                self.send_response(404)
                self.end_headers()
                return
            data = path.read_bytes()
            served.append(fname)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("SPECGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    yield served
    server.shutdown()
    server.server_close()


def test_hub_id_downloads_only_tokenizer_files_and_caches(hub, demo_tokenizer):
    tok = load_tokenizer("acme/demo")
    assert sorted(hub) == ["tiktoken.model", "tokenizer_config.json"]
    assert tok.encode("hello <|im_end|>") == demo_tokenizer.encode("hello <|im_end|>")
    load_tokenizer("acme/demo")
    assert len(hub) == 2  # second load comes from the cache


def test_hub_id_missing_model_and_unreachable_hub(hub, monkeypatch):
    with pytest.raises(TokenizerError, match="neither tiktoken.model nor tokenizer.json"):
        load_tokenizer("acme/other")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    with pytest.raises(TokenizerError, match="not a local directory.*cannot download"):
        load_tokenizer("acme/third")


@pytest.mark.parametrize("which", ["demo", "kimi-k2.5"])
def test_special_splitter_gives_tiktokens_own_ids(request, which):
    """Our encode (special-token split + cached plain pieces) equals tiktoken's encode with
    every special allowed, on texts built to stress the split (partial and nested markers)."""
    import random

    tok = request.getfixturevalue("demo_tokenizer" if which == "demo" else "kimi_tokenizer")
    assert tok._splitter is not None, "the Kimi layout is prefix-free: the fast path must be on"
    rng = random.Random(5)
    specials = list(tok.special_tokens)
    pieces = ["hello", " world", "中文", "\U0001F600", "\n\n", "  ", "x<y", "[a]", "1234",
              "<", ">", "[", "]", "<|", "|>", "<think", "<<", "]]"]
    for _ in range(3000):
        parts = []
        for _ in range(rng.randint(0, 12)):
            r = rng.random()
            if r < 0.25:
                parts.append(rng.choice(specials))
            elif r < 0.35:
                parts.append(rng.choice(specials)[: rng.randint(1, 9)])
            else:
                parts.append(rng.choice(pieces))
        text = "".join(parts)
        assert tok.encode(text) == tok._enc.encode(text, allowed_special="all"), text
        assert tok.encode(text) == tok.encode(text)  # served from the piece cache
