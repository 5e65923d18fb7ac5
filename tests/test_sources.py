"""Dataset readers and format adapters on the committed fixtures (every format, broken rows)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from specgen.config import DatasetConfig
from specgen.sources import (
    FORMATS,
    SourceError,
    count_rows,
    detect_dataset_format,
    iter_rows,
    row_to_conversation,
)
from specgen.sources.messages import FormatError

FIX = Path(__file__).parent / "fixtures" / "datasets"


def ds(path, **kw) -> DatasetConfig:
    return DatasetConfig(name=kw.pop("name", "d"), path=Path(path), **kw)


def rows(path, **kw):
    return list(iter_rows(ds(path, **kw)))


def good(rs):
    return [r.conversation for r in rs if r.conversation is not None]


def errors(rs):
    return [(r.index, r.error) for r in rs if r.error is not None]


# -- detection ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, fmt", [
    ("openai.jsonl", "openai"), ("glaive.jsonl", "glaive"), ("sharegpt.json", "sharegpt"),
    ("reasoning.jsonl", "reasoning"), ("ultrachat.parquet", "ultrachat"),
    ("prompt.json", "prompt"), ("hf_dict", "openai"), ("splits.json", "prompt"),
])
def test_auto_detects_each_fixture(name, fmt):
    assert detect_dataset_format(ds(FIX / name)) == fmt
    convs = good(rows(FIX / name))
    assert convs and all(c.meta["format"] == fmt for c in convs)


def test_detection_skips_leading_broken_rows(tmp_path):
    p = tmp_path / "d.jsonl"
    # the first row is invalid JSON, the second fits no format: the third decides
    p.write_text('not json\n{"x": 1}\n{"prompt": "hello"}\n')
    assert detect_dataset_format(ds(p)) == "prompt"
    rs = rows(p)
    assert errors(rs)[0][1].line == 1 and "invalid JSON" in errors(rs)[0][1].reason
    assert errors(rs)[1][1].line == 2 and "no prompt text" in errors(rs)[1][1].reason
    assert good(rs)[0].messages == [{"role": "user", "content": "hello"}]
    p.write_text('{"x": 1}\n{"y": 2}\n')
    with pytest.raises(SourceError, match="cannot detect the format; the first row has x"):
        detect_dataset_format(ds(p))


def test_unknown_named_format_is_a_source_error():
    with pytest.raises(SourceError, match="unknown format 'chatml'"):
        rows(FIX / "openai.jsonl", format="chatml")


def test_named_format_that_does_not_fit_gives_row_errors():
    rs = rows(FIX / "prompt.json", format="glaive")
    assert not good(rs)
    assert all("glaive" in e.reason for _, e in errors(rs))


# -- openai --------------------------------------------------------------------------------

def test_openai_rows_ids_tools_and_broken_rows():
    rs = rows(FIX / "openai.jsonl")
    convs = good(rs)
    first = convs[0]
    assert first.id == "oa-1"
    assert first.tools[0]["function"]["name"] == "get_weather"
    call = first.messages[4]["tool_calls"][0]
    # dataset id call_abc rewritten to the native form, and the tool result follows it
    assert call["id"] == "functions.get_weather:0"
    assert first.messages[5] == {"role": "tool", "tool_call_id": "functions.get_weather:0",
                                 "content": '{"temp": -3}'}
    assert first.messages[4]["content"] == ""
    assert convs[1].id == "7"  # conversation_id, an int
    # tools given as a JSON string; parsed arguments serialised; a tool result without an id
    third = convs[2]
    assert third.tools[0]["function"]["name"] == "get_time"
    assert third.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Rome"}'
    assert third.messages[2]["tool_call_id"] == "functions.get_time:0"
    errs = errors(rs)
    assert [(i, e.line) for i, e in errs] == [(3, 4), (4, 5), (6, 7)]
    assert "invalid JSON" in errs[0][1].reason
    assert "unknown role 'wizard'" in errs[1][1].reason
    assert "calls tool 'launch' but the row declares no tools" in errs[2][1].reason
    assert str(errs[0][1]).startswith(str(FIX / "openai.jsonl") + ":4: ")
    # the blank line (index 2) yields nothing but keeps its index
    assert [r.index for r in rs] == [0, 1, 3, 4, 5, 6]


def test_native_ids_can_be_switched_off():
    d = ds(FIX / "openai.jsonl")
    d.native_tool_ids = False  # the dataset key `native_tool_ids`
    first = good(iter_rows(d))[0]
    assert first.messages[4]["tool_calls"][0]["id"] == "call_abc"
    assert first.messages[5]["tool_call_id"] == "call_abc"
    # missing ids are still filled in natively
    third = good(iter_rows(d))[2]
    assert third.messages[1]["tool_calls"][0]["id"] == "functions.get_time:0"
    # default for a non-Kimi renderer is off
    first_hf = good(iter_rows(ds(FIX / "openai.jsonl"), renderer="hf"))[0]
    assert first_hf.messages[4]["tool_calls"][0]["id"] == "call_abc"


def test_native_ids_count_over_the_whole_conversation():
    row = {"messages": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "x1", "function": {"name": "f", "arguments": "{}"}},
            {"id": "x2", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "x2", "content": "G"},
        {"role": "tool", "tool_call_id": "x1", "content": "F"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "x1", "function": {"name": "f", "arguments": "{\"n\": 2}"}}]},
        {"role": "tool", "tool_call_id": "x1", "content": "F2"},
        {"role": "assistant", "content": "done"}],
        "tools": [{"name": "f", "parameters": {}}, {"name": "g", "parameters": {}}]}
    conv = row_to_conversation(row, "openai")
    m = conv.messages
    assert [c["id"] for c in m[1]["tool_calls"]] == ["functions.f:0", "functions.g:1"]
    assert (m[2]["tool_call_id"], m[3]["tool_call_id"]) == ("functions.g:1", "functions.f:0")
    assert m[4]["tool_calls"][0]["id"] == "functions.f:2"
    assert m[5]["tool_call_id"] == "functions.f:2"
    # bare function schemas became OpenAI tools
    assert conv.tools[1] == {"type": "function", "function": {"name": "g", "parameters": {}}}


def test_stable_ids_do_not_depend_on_the_id_switch_and_are_stable():
    row = {"messages": [{"role": "user", "content": "q"},
                        {"role": "assistant", "content": "", "tool_calls": [
                            {"id": "call_9", "function": {"name": "f", "arguments": "{}"}}]},
                        {"role": "tool", "tool_call_id": "call_9", "content": "r"}],
           "tools": [{"name": "f"}]}
    a = row_to_conversation(row, "openai", native_ids=True)
    b = row_to_conversation(row, "openai", native_ids=False)
    assert a.id == b.id == row_to_conversation(json.loads(json.dumps(row)), "openai").id
    other = dict(row, messages=[{"role": "user", "content": "other"}])
    assert row_to_conversation(other, "openai").id != a.id


def test_openai_legacy_function_call_developer_role_and_arrow_nulls():
    row = {"messages": [
        {"role": "developer", "content": "rules", "name": None, "tool_calls": None},
        {"role": "user", "content": [{"type": "text", "text": "hi", "image_url": None}]},
        {"role": "assistant", "content": None,
         "function_call": {"name": "f", "arguments": "{\"a\":1}"}},
        {"role": "function", "name": "f", "content": "ok"},
        {"role": "assistant", "content": "fine", "reasoning": "thought"}],
        "functions": [{"name": "f", "parameters": {"type": "object", "description": None}}]}
    conv = row_to_conversation(row, "openai")
    m = conv.messages
    assert m[0] == {"role": "system", "content": "rules"}
    assert m[1]["content"] == [{"type": "text", "text": "hi"}]
    assert m[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a":1}'}
    assert m[3] == {"role": "tool", "content": "ok", "tool_call_id": "functions.f:0"}
    assert m[4]["reasoning_content"] == "thought"
    assert conv.tools[0]["function"]["parameters"] == {"type": "object"}


def test_tool_result_without_a_call_is_rejected():
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]}
    with pytest.raises(FormatError, match="tool result without a pending tool call"):
        row_to_conversation(row, "openai")


# -- reasoning -----------------------------------------------------------------------------

def test_reasoning_rows_split_think_blocks():
    rs = rows(FIX / "reasoning.jsonl")
    first = good(rs)[0]
    assert first.messages[1] == {"role": "assistant", "content": "The answer is 42.",
                                 "reasoning_content": "7*6 = 42."}
    (index, err), = errors(rs)
    assert index == 2 and err.line == 3 and "<think> without </think>" in err.reason


def test_think_split_edge_cases():
    def conv(content):
        return row_to_conversation({"messages": [
            {"role": "user", "content": "q"}, {"role": "assistant", "content": content}]},
            "reasoning").messages[1]

    assert conv("only a closing tag</think>answer") == {
        "role": "assistant", "content": "answer", "reasoning_content": "only a closing tag"}
    assert conv("plain answer") == {"role": "assistant", "content": "plain answer"}
    with pytest.raises(FormatError, match="more than one"):
        conv("<think>a</think>b<think>c</think>d")
    with pytest.raises(FormatError, match="middle"):
        conv("text <think>a</think>")


# -- sharegpt ------------------------------------------------------------------------------

def test_sharegpt_rows_roles_function_calls_and_errors():
    rs = rows(FIX / "sharegpt.json")
    c1, c2 = good(rs)
    assert [m["role"] for m in c1.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert c2.tools[0]["function"]["name"] == "get_weather"
    assert c2.messages[1]["tool_calls"][0] == {
        "id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}}
    assert c2.messages[2] == {"role": "tool", "content": '{"temp": 19}',
                              "tool_call_id": "functions.get_weather:0"}
    errs = errors(rs)
    assert [i for i, _ in errs] == [2, 3]
    assert "unknown speaker 'alien'" in errs[0][1].reason and errs[0][1].line > 1
    assert "no user message" in errs[1][1].reason


def test_sharegpt_text_turn_then_call_turn_is_one_message():
    row = {"conversations": [
        {"from": "human", "value": "q"},
        {"from": "gpt", "value": "Let me look."},
        {"from": "function_call", "value": '[{"name": "f", "arguments": {}}, {"name": "f", "arguments": {"x": 1}}]'},
        {"from": "observation", "value": "a"}, {"from": "observation", "value": "b"},
        {"from": "gpt", "value": "<think>hm</think>Done."}],
        "tools": [{"name": "f"}]}
    m = row_to_conversation(row, "sharegpt").messages
    assert m[1]["content"] == "Let me look." and len(m[1]["tool_calls"]) == 2
    assert [x["tool_call_id"] for x in m[2:4]] == ["functions.f:0", "functions.f:1"]
    assert m[4] == {"role": "assistant", "content": "Done.", "reasoning_content": "hm"}


# -- ultrachat / prompt ----------------------------------------------------------------------

def test_ultrachat_parquet_alternates_roles_and_reports_bad_rows():
    rs = rows(FIX / "ultrachat.parquet")
    c = good(rs)[0]
    assert [m["role"] for m in c.messages] == ["user", "assistant", "user", "assistant"]
    (index, err), = errors(rs)
    assert index == 2 and err.line is None and "row 2" in err.reason and "no messages" in err.reason


def test_prompt_rows_object_of_rows_keys_are_ids():
    rs = rows(FIX / "prompt.json")
    c1, c2, c3 = good(rs)
    assert (c1.id, c2.id, c3.id) == ("p-1", "p-2", "p-3")
    assert c2.messages == [{"role": "user", "content": "Translate to French.\n\nGood morning"}]
    assert c3.messages[0] == {"role": "system", "content": "Answer like a physicist."}
    (index, err), = errors(rs)
    assert index == 3 and "no prompt text" in err.reason


def test_prompt_rows_may_hold_a_message_list():
    c = row_to_conversation({"prompt": [{"role": "user", "content": "hey"}]}, "prompt")
    assert c.messages == [{"role": "user", "content": "hey"}]


# -- JSON layouts ----------------------------------------------------------------------------

def test_json_splits_pick_the_split_or_the_first():
    assert [c.messages[0]["content"] for c in good(rows(FIX / "splits.json"))] == [
        "train one", "train two"]
    assert [c.messages[0]["content"] for c in good(rows(FIX / "splits.json", split="test"))] == [
        "test one"]
    rs = rows(FIX / "splits.json", split="dev")
    assert "split 'dev' not found" in errors(rs)[0][1].reason


def test_json_array_with_a_broken_element_stops_there():
    rs = rows(FIX / "broken_array.json")
    assert len(good(rs)) == 2
    (index, err), = errors(rs)
    assert index == 2 and err.line == 4 and "rest of this file cannot be read" in err.reason


def test_json_streams_small_chunks(tmp_path, monkeypatch):
    from specgen.sources import jsonstream

    monkeypatch.setattr(jsonstream, "CHUNK", 7)  # rows much larger than a read
    data = [{"prompt": "x" * 50 + str(i), "n": 12345678901234} for i in range(30)]
    p = tmp_path / "a.json"
    p.write_text(json.dumps(data, indent=2))
    got = good(rows(p))
    assert [c.messages[0]["content"] for c in got] == [d["prompt"] for d in data]
    assert [r.index for r in rows(p, format="prompt")] == list(range(30))
    # skipping on resume
    assert [r.index for r in iter_rows(ds(p), start=25)] == [25, 26, 27, 28, 29]


def test_json_gz_and_jsonl_gz(tmp_path):
    data = [{"prompt": f"p{i}"} for i in range(5)]
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(d) for d in data))
    with gzip.open(tmp_path / "b.json.gz", "wt") as f:
        json.dump(data, f)
    for name in ("a.jsonl.gz", "b.json.gz"):
        assert [r.index for r in iter_rows(ds(tmp_path / name), start=3)] == [3, 4]
        assert len(good(rows(tmp_path / name))) == 5


@pytest.mark.parametrize("text, why", [
    ("", "empty file"), ("42", "unexpected '4'"), ('[{"prompt": "a"}', "not closed"),
])
def test_json_documents_that_are_not_rows(tmp_path, text, why):
    p = tmp_path / "x.json"
    p.write_text(text)
    rs = list(iter_rows(ds(p, format="prompt")))
    assert why in rs[-1].error.reason


def test_non_utf8_jsonl_line_is_a_row_error(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"prompt": "bom"}\n{"prompt": "\xff\xfe"}\n{"prompt": "ok"}\n')
    rs = rows(p)
    assert len(good(rs)) == 2 and errors(rs)[0][1].line == 2


# -- Parquet / Arrow / folders ---------------------------------------------------------------

def test_parquet_skips_row_groups_and_reads_from_start():
    assert [r.index for r in iter_rows(ds(FIX / "ultrachat.parquet"), start=1)] == [1, 2]
    assert [r.index for r in iter_rows(ds(FIX / "ultrachat.parquet"), start=3)] == []
    assert count_rows(FIX / "ultrachat.parquet") == 3


def test_hf_save_to_disk_dict_splits_and_shards():
    train = good(rows(FIX / "hf_dict"))
    assert [c.id for c in train] == [f"hf-{i}" for i in range(5)]  # two shards, in order
    test = good(rows(FIX / "hf_dict", split="test"))
    assert [c.id for c in test] == ["hf-0", "hf-1"]
    assert [r.index for r in iter_rows(ds(FIX / "hf_dict"), start=3)] == [3, 4]
    assert count_rows(FIX / "hf_dict") == 5
    with pytest.raises(SourceError, match="no split 'dev'.*train, test"):
        rows(FIX / "hf_dict", split="dev")
    assert [c.id for c in good(rows(FIX / "hf_single"))] == ["hf-0", "hf-1", "hf-2"]


def test_hf_dict_without_train_needs_a_split(tmp_path):
    d = tmp_path / "dd"
    shutil.copytree(FIX / "hf_dict", d)
    (d / "dataset_dict.json").write_text('{"splits": ["a", "b"]}')
    with pytest.raises(SourceError, match="set `split`"):
        rows(d)


def test_folder_of_files_in_order_with_split_filter(tmp_path):
    (tmp_path / "data").mkdir()
    for split, n in (("train", 3), ("test", 2)):
        for shard in range(2):
            with open(tmp_path / "data" / f"{split}-0000{shard}-of-00002.jsonl", "w") as f:
                for i in range(n):
                    f.write(json.dumps({"id": f"{split}{shard}{i}", "prompt": "p"}) + "\n")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "junk.jsonl").write_text("garbage\n")
    got = [(r.index, r.conversation.id) for r in iter_rows(ds(tmp_path, split="train"))]
    assert got == [(0, "train00"), (1, "train01"), (2, "train02"),
                   (3, "train10"), (4, "train11"), (5, "train12")]
    assert [r.index for r in iter_rows(ds(tmp_path, split="train"), start=4)] == [4, 5]
    assert len(list(iter_rows(ds(tmp_path)))) == 10


def test_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        rows(tmp_path / "nope.jsonl")
    with pytest.raises(SourceError, match="no dataset files"):
        rows(tmp_path)


def test_corrupt_parquet_is_a_source_error(tmp_path):
    p = tmp_path / "x.parquet"
    p.write_bytes(b"not parquet at all")
    with pytest.raises(SourceError, match="not a readable Parquet file"):
        list(iter_rows(ds(p, format="prompt")))


def test_every_format_name_is_registered():
    assert set(FORMATS) == {"openai", "sharegpt", "glaive", "reasoning", "ultrachat", "prompt"}
