"""PicoSpec's performance model: the formulas' limits and a small simulation check of Eq. 5."""

from __future__ import annotations

import random

import pytest

from tandem.protocols.spec import theory


def test_expected_tokens_limits_and_simulation():
    assert theory.expected_tokens(0.0, 4) == 1.0
    assert theory.expected_tokens(1.0, 4) == 4.0
    assert theory.expected_tokens(1.0, 4, bonus=True) == 5.0
    rng = random.Random(0)
    alpha, gamma, runs = 0.7, 4, 20000
    total = 0
    for _ in range(runs):  # accept each draft w.p. alpha; a rejection still emits one token
        accepted = 0
        while accepted < gamma and rng.random() < alpha:
            accepted += 1
        total += accepted + (1 if accepted < gamma else 0)
    assert total / runs == pytest.approx(theory.expected_tokens(alpha, gamma), rel=0.02)


def test_async_step_time_between_its_cases():
    args = (0.1, 0.05, 0.08)  # t_draft, t_rtt, t_verify
    full_hit = theory.async_step_time(1.0, 4, *args)
    miss = theory.async_step_time(0.0, 4, *args)
    assert full_hit == pytest.approx(max(0.1, 0.13))
    assert miss == pytest.approx(theory.sync_step_time(*args))
    assert full_hit < theory.async_step_time(0.8, 4, *args) < miss
    assert theory.speedup_bound(*args) == pytest.approx(2.3)
    # alpha -> 1: the async / sync throughput ratio reaches Eq. 10 when drafting dominates
    ratio = theory.async_throughput(1.0, 4, 0.2, 0.05, 0.05) / (
        theory.expected_tokens(1.0, 4) / theory.sync_step_time(0.2, 0.05, 0.05)
    )
    assert ratio == pytest.approx(theory.speedup_bound(0.2, 0.05, 0.05))
