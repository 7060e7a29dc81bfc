"""Shared fixtures: tiny models (fast) and the real 0.5B model (slow tests only)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_lm():
    from tandem.models.registry import load_model

    return load_model("tiny-qwen2")


@pytest.fixture(scope="session")
def tiny_lm_b():
    from tandem.models.registry import load_model

    return load_model("tiny-qwen2-b")


@pytest.fixture(scope="session")
def real_lm():
    """The real Qwen2.5-Coder-0.5B on the default engine (llama.cpp; prepared once)."""
    from tandem.models.registry import load_model

    return load_model("qwen2.5-coder-0.5b", progress=False)


@pytest.fixture(scope="session")
def real_hf_lm():
    """The real Qwen2.5-Coder-0.5B on transformers fp32 (the reference engine)."""
    from tandem.models.registry import load_model

    return load_model("qwen2.5-coder-0.5b", progress=False, backend="hf")


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch runs on one intra-op thread for the module (decoder threads share 2 cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
