"""Fixtures for speculative decoding tests: a tiny draft/target pair that agrees often.

The target is tiny-qwen2 with every weight matrix nudged by N(0, 0.01): its greedy choice
matches the draft's about half of the time and the sampled acceptance rate is about 0.8, so
blocks are partly accepted (tiny-qwen2 vs tiny-qwen2-b almost never agree).
"""

from __future__ import annotations

import pytest

from protocols.dragon.conftest import corpora  # noqa: F401 (two corpora; see baselines/)

PROMPT = "def add(a, b):"


def perturbed_tiny(sigma: float = 0.01, seed: int = 0):
    import torch

    from tandem.models.hf import HFCausalLM
    from tandem.models.tiny import build_tiny

    model, tokenizer = build_tiny("tiny-qwen2")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.add_(sigma * torch.randn(param.shape, generator=generator))
    return HFCausalLM(model, tokenizer, name=f"tiny-qwen2-perturbed-{sigma}")


@pytest.fixture(scope="session")
def tiny_target():
    return perturbed_tiny()


@pytest.fixture(scope="session")
def prompt_ids(tiny_lm):
    return tiny_lm.tokenizer.encode(PROMPT)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(one_torch_thread):
    """One intra-op thread: on a shared 2-core machine, OpenMP threads waiting for a busy core
    make small forward passes 10-100x slower (tests/conftest.py restores it afterwards)."""
