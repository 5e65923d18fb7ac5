"""`[engine] event_loop`: uvloop when asked for or available, asyncio's loop otherwise."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest

from specgen.engine import event_loop


async def loop_name() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_asyncio_is_always_there() -> None:
    assert event_loop.loop_factory("asyncio") == (None, "asyncio")
    assert event_loop.run(loop_name(), "asyncio").startswith("asyncio")


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    assert event_loop.loop_factory("auto") == (None, "asyncio")
    assert event_loop.run(loop_name(), "auto").startswith("asyncio")
    with pytest.raises(event_loop.LoopUnavailable, match="specgen\\[fast\\]"):
        event_loop.loop_factory("uvloop")
    coro = loop_name()
    with pytest.raises(event_loop.LoopUnavailable):
        event_loop.run(coro, "uvloop")  # the coroutine is closed, not left unawaited


@pytest.mark.skipif(not importlib.util.find_spec("uvloop"), reason="uvloop not installed")
def test_auto_picks_uvloop_when_installed() -> None:
    assert event_loop.loop_factory("auto")[1] == "uvloop"
    assert event_loop.run(loop_name(), "auto").startswith("uvloop")


def test_a_run_asking_for_a_missing_uvloop_does_not_start(tmp_path, monkeypatch) -> None:
    from specgen.config import load_config
    from specgen.engine.runner import RunError, run

    (tmp_path / "data.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "run.toml").write_text('run_dir = "runs/x"\n[target]\nmodel = "m/x"\n'
                                       'tokenizer = "demo"\n[endpoint]\nbase_url = "sim"\n'
                                       '[engine]\nevent_loop = "uvloop"\n[[dataset]]\n'
                                       'name = "a"\npath = "data.jsonl"\n')
    cfg = load_config(tmp_path / "run.toml")
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(RunError, match="uvloop is not installed"):
        run(cfg)
    assert not (tmp_path / "runs/x").exists()  # refused before anything was made
