"""Our `specforge` export parsed by SpecForge's own data-loading code, and its loss mask for
Kimi-K2.5 samples compared with ours.

SpecForge (PyPI `specforge`) pins torch, transformers and sglang, so it is not a dependency
of specgen. This test runs SpecForge in the interpreter named by SPECGEN_SPECFORGE_PYTHON (a
venv with `specforge` installed with --no-deps plus torch, transformers, datasets, pydantic,
tqdm, tiktoken, orjson, jinja2: see docs/outputs.md), or in this interpreter when it can
import specforge; otherwise it skips. This file is also the probe script run in that
interpreter (`python tests/test_export_specforge.py EXPORT.jsonl RESULT.json`).

SpecForge renders each conversation with the tokenizer's chat template and finds assistant
spans between its registered "assistant header" and "end of turn" strings. The Kimi-K2.5 model
files here carry no chat template (nor the tokenizer's remote code), so the probe gives
SpecForge a tokenizer adapter whose `apply_chat_template` is specgen's K2.5 renderer (written
from the K2.5 template) and whose encode is the real Kimi tiktoken vocabulary. Everything
else (message sanitising, system-prompt insertion, span regex, prefix re-encoding) is
SpecForge's code, unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

try:
    import pytest
except ImportError:  # the probe runs in the SpecForge interpreter, which needs no pytest
    pytest = None

REPO = Path(__file__).resolve().parents[1]
SPECFORGE_TEMPLATE = "kimi-k2-thinking"  # SpecForge's registered template closest to K2.5


# -- the probe (runs in the SpecForge interpreter) ----------------------------------------------
def probe(export_path: str, out_path: str, tokenizer_dir: str) -> None:
    sys.path.insert(0, str(REPO / "src"))
    import json as _json

    import torch
    from datasets import Dataset, load_dataset
    from specforge.data.preprocessing import build_eagle3_dataset

    from specgen.render import get_renderer
    from specgen.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    renderer = get_renderer("kimi-k2.5", tok, thinking=True)

    class Encoding:
        def __init__(self, ids):
            self.input_ids = torch.tensor([ids], dtype=torch.long)

    class KimiAdapter:
        """The slice of a HF tokenizer SpecForge's parsers call."""

        pad_token_id = tok.special_tokens.get("[PAD]")
        unk_token_id = tok.special_tokens.get("[UNK]")
        bos_token = None

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False,
                                tools=None, **kwargs):
            msgs = []
            for m in messages:
                m = dict(m)
                for call in m.get("tool_calls") or ():
                    fn = call.get("function") or {}
                    if not isinstance(fn.get("arguments"), str):
                        # what a HF template's `tojson` does with parsed arguments
                        fn["arguments"] = _json.dumps(fn.get("arguments"), ensure_ascii=False)
                msgs.append(m)
            return renderer.render_text(msgs, tools, add_generation_prompt=add_generation_prompt)

        def encode(self, text, add_special_tokens=False, truncation=False, max_length=None):
            ids = tok.encode(text)
            return ids[:max_length] if truncation and max_length else ids

        def __call__(self, text, max_length=None, truncation=False, return_tensors=None,
                     add_special_tokens=False, **kwargs):
            return Encoding(self.encode(text, truncation=truncation, max_length=max_length))

    raw = load_dataset("json", data_files=export_path, split="train")
    ids = list(raw["id"])
    order = Dataset.from_dict({"i": list(range(len(ids)))}).shuffle(seed=42)["i"]
    processed = build_eagle3_dataset(raw, KimiAdapter(), chat_template=SPECFORGE_TEMPLATE,
                                     max_length=1 << 20, num_proc=None)
    rows = []
    for k in range(len(processed)):
        item = processed[k]
        rows.append({"id": ids[order[k]],
                     "input_ids": item["input_ids"].reshape(-1).tolist(),
                     "loss_mask": item["loss_mask"].reshape(-1).tolist()})
    Path(out_path).write_text(_json.dumps({"rows": rows}))


# -- the test (runs in the specgen venv) ------------------------------------------------------
def specforge_python() -> str:
    env = os.environ.get("SPECGEN_SPECFORGE_PYTHON")
    if env:
        if not Path(env).exists():
            pytest.skip(f"SPECGEN_SPECFORGE_PYTHON={env} does not exist")
        return env
    try:
        import specforge.data.preprocessing  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: not available here
        pytest.skip("SpecForge is not installed here (it pins torch/transformers/sglang); set "
                    "SPECGEN_SPECFORGE_PYTHON to an interpreter that has it, see "
                    f"docs/outputs.md ({type(exc).__name__}: {exc})")
    return sys.executable


def spans(mask: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def masked_text(tok, ids, mask) -> list[str]:
    return [tok.decode(ids[a:b]) for a, b in spans(mask)]


def test_specforge_parses_our_export_and_masks_compare(tmp_path):
    from conftest import model_path
    from specgen.export import ExportOptions, export_run
    from specgen.tokenizer import load_tokenizer
    from test_export_support import build_store, chat

    python = specforge_python()
    kimi = model_path("kimi-k2.5")
    tok = load_tokenizer(kimi)

    plain = chat(1, 1)  # system + user + answer with reasoning
    no_system = chat(2, 1)
    no_system["messages"] = no_system["messages"][1:]
    tool_loop = chat(3, 1, tools=True)
    for conv in (plain, no_system, tool_loop):
        conv["messages"][-1]["content"] = "The answer is 4."
    # compact arguments, as models often emit them; SpecForge parses and re-serialises them
    tool_loop["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"a":3,"b":0}'
    run = build_store(tmp_path / "run", {"chat": [plain, no_system], "tools": [tool_loop]},
                      tokenizer=str(kimi), turns="all")
    export_run(run, ExportOptions(format="specforge", out=tmp_path / "sf.jsonl"))
    export_run(run, ExportOptions(format="tokens", jsonl=True, merge_prefix=True,
                                  out=tmp_path / "tokens.jsonl"))

    proc = subprocess.run(
        [python, __file__, str(tmp_path / "sf.jsonl"), str(tmp_path / "sf_out.json"), str(kimi)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, f"SpecForge probe failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    theirs = {r["id"]: r for r in json.loads((tmp_path / "sf_out.json").read_text())["rows"]}
    ours: dict[str, dict] = {}
    for line in (tmp_path / "tokens.jsonl").read_text().splitlines():
        r = json.loads(line)
        ours.setdefault(f"{r['dataset']}/{r['conv_id']}", r)  # one row per conversation here

    # SpecForge read every exported conversation (its rows are mapped back to our ids through
    # its shuffle; each row must hold its own conversation's question).
    assert sorted(theirs) == sorted(ours) == ["chat/c0001", "chat/c0002", "tools/c0003"]
    for cid, n in (("chat/c0001", 1), ("chat/c0002", 2), ("tools/c0003", 3)):
        assert f"question {n}.0" in tok.decode(theirs[cid]["input_ids"])

    report = {}
    for cid in sorted(ours):
        o, t = ours[cid], theirs[cid]
        report[cid] = {
            "ids_equal": o["input_ids"] == t["input_ids"],
            "ours_len": len(o["input_ids"]), "theirs_len": len(t["input_ids"]),
            "ours_masked": masked_text(tok, o["input_ids"], o["loss_mask"]),
            "theirs_masked": masked_text(tok, t["input_ids"], t["loss_mask"]),
        }
    print("\nSpecForge vs specgen (Kimi-K2.5, template kimi-k2-thinking):")
    print(json.dumps(report, indent=1, ensure_ascii=False))
    (tmp_path / "comparison.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))

    # What we found (docs/outputs.md, "SpecForge"); each line fails if SpecForge changes.
    # 1. Ours: the sampled ids only: reasoning, </think>, content, <|im_end|>.
    assert report["chat/c0001"]["ours_masked"] == ["1 plus 0 makes 1</think>The answer is 4.<|im_end|>"]
    # 2. SpecForge renders the whole conversation with the template, which drops the final
    #    answer's reasoning (K2.5 history rule), so its mask holds `<think></think>` + content:
    #    the drafter would never see the reasoning the model actually sampled.
    assert report["chat/c0001"]["theirs_masked"] == ["<think></think>The answer is 4.<|im_end|>"]
    assert not report["chat/c0001"]["ids_equal"]
    # 3. Without a system message SpecForge inserts its template's "You are a helpful
    #    assistant." system prompt, which the target never saw: the prompt ids differ too.
    assert tok.decode(theirs["chat/c0002"]["input_ids"]).startswith(
        "<|im_system|>system<|im_middle|>You are a helpful assistant.<|im_end|>")
    assert not tok.decode(ours["chat/c0002"]["input_ids"]).startswith("<|im_system|>system")
    # 4. Tool loop: SpecForge masks both assistant turns, but parses the sampled arguments
    #    '{"a":3,"b":0}' and writes them back re-serialised, so the masked ids are not the ids
    #    the model sampled.
    tl = report["tools/c0003"]
    assert len(tl["ours_masked"]) == len(tl["theirs_masked"]) == 2
    assert tl["ours_masked"][0].startswith("use the tool</think>")
    assert tl["theirs_masked"][0].startswith("<think></think>")  # its reasoning is gone too
    assert '{"a":3,"b":0}' in tl["ours_masked"][0]
    assert '{"a":3,"b":0}' not in tl["theirs_masked"][0]
    assert '{"a": 3, "b": 0}' in tl["theirs_masked"][0]


if __name__ == "__main__":
    probe(sys.argv[1], sys.argv[2], sys.argv[3])
