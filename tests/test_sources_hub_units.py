"""The Hub file choice as pure functions: data_files patterns, YAML config forms, standard
layouts, Parquet-conversion paths, hf:// paths (no server; tests/test_sources_hub.py runs them)."""

from __future__ import annotations

import pytest

from specgen.sources.hub import (
    HubError,
    _config_splits,
    _conversion_split,
    _glob,
    _standard,
    hub_repo,
)


@pytest.mark.parametrize("pattern,path,hit", [
    ("data/train-*", "data/train-00000-of-00002.parquet", True),
    ("data/train-*", "data/test-00000-of-00002.parquet", False),
    ("data/*", "data/sub/x.parquet", False),  # * stays in one folder
    ("data/**", "data/sub/x.parquet", True),
    ("**/train-*.parquet", "a/b/train-0.parquet", True),
    ("**/train-*.parquet", "train-0.parquet", True),
    ("all/train-*", "math/train-00000.parquet", False),
])
def test_data_files_patterns(pattern, path, hit):
    assert _glob(pattern, path) is hit


def test_yaml_data_files_forms():
    assert _config_splits("x/*.jsonl") == {"train": ["x/*.jsonl"]}
    assert _config_splits(["a/*", "b/*"]) == {"train": ["a/*", "b/*"]}
    assert _config_splits([{"split": "train", "path": "t/*"},
                           {"split": "test", "path": ["e/1", "e/2"]}]) == {
        "train": ["t/*"], "test": ["e/1", "e/2"]}
    assert _config_splits({"validation": "v/*"}) == {"validation": ["v/*"]}


def test_standard_layouts_pick_the_split_and_subset():
    files = ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet",
             "data/test-00000-of-00001.parquet"]
    assert _standard(files, None, None, "d", "o/n") == (files[:2], "train")
    assert _standard(files, None, "test", "d", "o/n") == (files[2:], "test")
    with pytest.raises(HubError, match="no data file names split 'dev'"):
        _standard(files, None, "dev", "d", "o/n")
    nested = ["en/train.jsonl", "fr/train.jsonl"]
    assert _standard(nested, "fr", None, "d", "o/n") == (["fr/train.jsonl"], "train")
    with pytest.raises(HubError, match="its folders: en, fr"):
        _standard(nested, "de", None, "d", "o/n")
    # files that name no split are one `train` split
    assert _standard(["glaive.json"], None, "train", "d", "o/n") == (["glaive.json"], "train")


def test_parquet_conversion_paths():
    assert _conversion_split("default/train/0000.parquet", "default") == "train"
    assert _conversion_split("default/partial-train/0000.parquet", "default") == "train"
    assert _conversion_split("plain/plain-test.parquet", "plain") == "test"
    assert _conversion_split("plain/plain-train-00000-of-00002.parquet", "plain") == "train"


@pytest.mark.parametrize("path,repo", [
    ("hf://datasets/org/name", "org/name"), ("hf://datasets/org/na.me-1/", "org/na.me-1"),
    ("data/x.jsonl", None)])
def test_hub_paths(path, repo):
    assert hub_repo(path) == repo


@pytest.mark.parametrize("bad", ["hf://datasets/justname", "hf://models/org/name",
                                 "hf://datasets/org/name/extra"])
def test_bad_hub_paths_name_the_form(bad):
    with pytest.raises(HubError, match="hf://datasets/OWNER/NAME"):
        hub_repo(bad)


def test_merge_refuses_shards_that_pinned_different_hub_commits(tmp_path):
    import json as _json

    from specgen.merge import MergeError, _check_compatible

    def meta(commit: str) -> dict[str, str]:
        return {"config_hash": "h", "tokenizer_fingerprint": "t", "renderer": "r",
                "hub:chat": _json.dumps({"repo": "o/n", "revision": "main", "commit": commit,
                                         "subset": None, "split": "train", "files": []})}

    ins = [tmp_path / "a", tmp_path / "b"]
    _check_compatible(ins, [meta("1" * 40), meta("1" * 40)])
    with pytest.raises(MergeError, match="'chat' was read at different Hub commits"):
        _check_compatible(ins, [meta("1" * 40), meta("2" * 40)])


def test_metadata_json_files_are_not_data():
    from specgen.sources.hub import _is_data

    assert not _is_data("dataset_infos.json") and not _is_data("sub/dataset_info.json")
    assert not _is_data(".cache/train.jsonl")
    assert _is_data("data/train.json") and _is_data("train.jsonl.gz")
