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


@pytest.fixture(scope="session")
def greedy():
    """Plain greedy decoding with margins, and the near-tie-aware equality check."""
    import types

    return types.SimpleNamespace(with_margins=greedy_with_margins, assert_equal=assert_greedy_equal)


def greedy_with_margins(lm, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """Plain greedy decoding (one token per call) and the top-1 minus top-2 logit margin of
    every step."""
    state = lm.prefill(ids)
    tokens, margins, logits = [], [], state.logits[0]
    for _ in range(n):
        top = logits.topk(2).values
        tokens.append(int(logits.argmax()))
        margins.append(float(top[0] - top[1]))
        logits = lm.decode(state, [tokens[-1]])[0, -1]
    return tokens, margins


def assert_greedy_equal(lm, got: list[int], expected: list[int], margins: list[float]) -> None:
    """`got` equals plain greedy `expected`, or first departs from it at a near-tie: a step
    whose top-2 margin is within twice the engine's measured batch-shape error. Exact
    equality for engines whose calls agree bit for bit (transformers here)."""
    if got == expected:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
    assert first is not None, f"lengths differ: {len(got)} vs {len(expected)}"
    from tandem.models.llamacpp import BATCH_SHAPE_ERROR

    tolerance = 2 * BATCH_SHAPE_ERROR if getattr(lm, "backend", "hf") == "llamacpp" else 0.0
    assert margins[first] < tolerance, (
        f"departs from greedy at step {first} where the margin is {margins[first]:.3f} "
        f"(not a near-tie: tolerance {tolerance})"
    )
