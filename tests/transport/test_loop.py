"""transport.loop: which event loop `run` takes, and what it says when it cannot."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest

from tandem.errors import TandemError
from tandem.transport import loop

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop not installed")
@pytest.mark.parametrize("value", [None, "", "auto", "uvloop"])
def test_uvloop_by_default_and_when_asked(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(loop.ENV, raising=False)
    else:
        monkeypatch.setenv(loop.ENV, value)
    assert loop.name() == "uvloop"
    assert loop.run(_loop_module()).startswith("uvloop")


def test_asyncio_when_asked(monkeypatch):
    monkeypatch.setenv(loop.ENV, "asyncio")
    assert loop.name() == "asyncio"
    assert loop.run(_loop_module()).startswith("asyncio")


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    monkeypatch.setenv(loop.ENV, "auto")
    assert loop.name() == "asyncio"
    assert loop.run(_loop_module()).startswith("asyncio")
    monkeypatch.setenv(loop.ENV, "uvloop")
    with pytest.raises(TandemError, match="uvloop is not installed"):
        loop.name()


def test_a_bad_value_is_named_and_the_coroutine_is_not_left_unawaited(monkeypatch, recwarn):
    monkeypatch.setenv(loop.ENV, "trio")
    with pytest.raises(TandemError, match=r"TANDEM_EVENT_LOOP='trio': choose one of auto"):
        loop.run(_loop_module())
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_run_returns_the_result_and_raises_the_error(monkeypatch):
    monkeypatch.delenv(loop.ENV, raising=False)

    async def fails():
        raise ValueError("boom")

    async def answer():
        await asyncio.sleep(0)
        return 42

    assert loop.run(answer()) == 42
    with pytest.raises(ValueError, match="boom"):
        loop.run(fails())
