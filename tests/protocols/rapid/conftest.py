"""Fixtures for RAPID tests: the real Qwen tokenizer (fast; no weights) when prepared."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def real_tokenizer():
    from tandem.models.registry import is_prepared, prepared_dir
    from tandem.models.tokenizer import HFTokenizer

    if not is_prepared("qwen2.5-coder-0.5b"):
        pytest.skip("qwen2.5-coder-0.5b is not prepared")
    return HFTokenizer.from_dir(prepared_dir("qwen2.5-coder-0.5b"))


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(one_torch_thread):
    """One intra-op thread: on a shared 2-core machine, OpenMP threads waiting for a busy core
    make small forward passes 10-100x slower (tests/conftest.py restores it afterwards)."""
