"""The eager pipeline ("the cloud never idles") emits the target's law, whatever the order
in which drafts, AR steps, verdicts and adoptions happen.

Enumeration: for several schedules of the sans-I/O state objects (eager_driver.py) every
branch of every random draw is walked (draft sampling, accept test, residual, AR sample, each
written from its statement) and the law of the output is summed exactly; it must equal the
target chain's law, computed from the target's rows alone. The schedules cover: drafts
verified with no AR step, AR steps between verifications (the free bonus row), requests
arriving for positions the cloud has committed (matching prefix skipped, mismatch = stale),
the device adopting AR tokens while its drafts are in flight (match: keep, mismatch: new
chain). A planted fault (the device sends a draft only when its value is 0, so the choice
between verifying and AR at a position depends on the value drawn there) must change the law:
the enumeration can fail. Then fixed-seed chi-square tests run the real draws (position
generators), through the driver and through `run_pair` with a timed link.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch

from tandem.models.emulated import SleepLM
from tandem.protocols.spec import SpecConfig, run_pair
from tandem.sampling.warp import warp
from tandem.transport import LinkConfig

from .eager_driver import law, run_schedule
from .support import assert_chi_square

PROMPT = [1, 2]
SCHEDULES = (
    "ddsvR",  # verification only (async-like)
    "ddsvaR",  # an AR step after each verdict (the bonus row)
    "adsRv",  # the cloud commits first: the request is checked against it
    "ddsaRvR",  # the device adopts an AR token while its drafts are in flight
    "dsdsavrvR",  # two requests, AR in between, one message adopted at a time
    "adddsvR",  # one request: its first draft checked against an AR token, the rest verified
    "aaddsvR",  # the cloud runs ahead: skipped drafts, stale requests
)


def pair(vocab: int, mix: float = 0.5) -> tuple[SleepLM, SleepLM]:
    target = SleepLM("law-target", vocab_size=vocab, base_s=0, per_token_s=0, prefill_s=0)
    draft = SleepLM(
        "law-draft",
        vocab_size=vocab,
        base_s=0,
        per_token_s=0,
        prefill_s=0,
        other=target,
        mix=mix,
        scale=1.0,
    )
    return draft, target


def chain_law(target: SleepLM, length: int, vocab: int) -> dict[tuple[int, ...], float]:
    out = {}
    for tokens in itertools.product(range(vocab), repeat=length):
        weight = 1.0
        for i, token in enumerate(tokens):
            row = warp(target.row(tuple(PROMPT) + tokens[:i]).double(), temperature=1.0)
            weight *= float(row[token])
        out[tokens] = weight
    return out


def config(
    length: int, draft_len: int = 2, codec: str = "dense", seed: int = 0, **extra
) -> SpecConfig:
    params = {"k": 3, "ell": 8} if codec == "k-sqs" else {}
    return SpecConfig(
        pipeline="eager", codec=codec, codec_params=params, draft_len=draft_len,
        temperature=1.0, max_new_tokens=length, stop_at_eos=False, seed=seed, **extra,
    )  # fmt: skip


def max_gap(found: dict, expected: dict) -> float:
    keys = set(found) | set(expected)
    return max(abs(found.get(k, 0.0) - expected.get(k, 0.0)) for k in keys)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_enumerated_law_is_the_target_chain(schedule):
    vocab, length = 3, 3
    draft, target = pair(vocab)
    cfg = config(length)
    found = law(lambda: run_schedule(draft, target, PROMPT, cfg, schedule))
    assert abs(sum(found.values()) - 1.0) < 1e-9
    assert max_gap(found, chain_law(target, length, vocab)) < 1e-5


@pytest.mark.parametrize("schedule", ["ddsaRvR", "adsRv"])
def test_enumerated_law_with_a_quantized_uplink(schedule):
    """K-SQS: drafts come from the lattice law the codec sends; the law is still the target's."""
    vocab, length = 4, 2
    draft, target = pair(vocab)
    cfg = config(length, codec="k-sqs")
    found = law(lambda: run_schedule(draft, target, PROMPT, cfg, schedule))
    assert max_gap(found, chain_law(target, length, vocab)) < 1e-5


def test_enumeration_catches_a_value_dependent_choice():
    """Sending a draft only when it is token 0 (else the cloud decodes that position itself)
    makes the choice at a position depend on the value drawn there: the law moves."""
    vocab, length = 3, 2
    draft, target = pair(vocab)
    cfg = config(length, draft_len=1)

    def send_if(drafter) -> bool:
        return drafter.drafts[drafter.sent].token == 0

    found = law(lambda: run_schedule(draft, target, PROMPT, cfg, "dsvaR", send_if=send_if))
    assert abs(sum(found.values()) - 1.0) < 1e-9
    assert max_gap(found, chain_law(target, length, vocab)) > 1e-3


SAMPLES = 2000


@pytest.mark.parametrize("schedule", ["ddsaRvR", "aaddsvR"])
def test_real_draws_follow_the_target_chain(schedule):
    """Fixed seeds, the real position generators: chi-square of two tokens' joint law."""
    vocab, length = 5, 2
    draft, target = pair(vocab, mix=0.7)
    found = torch.zeros(vocab**length, dtype=torch.int64)
    for seed in range(SAMPLES):
        tokens = run_schedule(draft, target, PROMPT, config(length, seed=seed), schedule)
        found[tokens[0] * vocab + tokens[1]] += 1
    expected = chain_law(target, length, vocab)
    law_vector = torch.tensor([expected[t] for t in itertools.product(range(vocab), repeat=2)])
    assert_chi_square(found, law_vector)


@pytest.mark.parametrize("branch_below", [0.0, 1.0])
def test_timed_runs_follow_the_target_chain(branch_below):
    """Both asyncio layers over a delayed link: which positions the cloud decodes by itself
    depends on timing; the joint law of the first two tokens is the target chain's (with
    branches at every draft too)."""
    vocab, length, runs = 4, 2, 400
    extra = {"branch_below": branch_below, "branch_len": 1} if branch_below else {}
    draft, target = pair(vocab, mix=0.7)
    link = LinkConfig(delay_ms=1.0)

    promoted = []

    async def many() -> list[tuple[int, ...]]:
        outs = []
        for seed in range(runs):
            report, _ = await run_pair(
                device_lm=draft, cloud_lm=target, prompt_ids=PROMPT,
                config=config(length, draft_len=1, seed=seed, **extra), link=link,
            )  # fmt: skip
            outs.append(tuple(report.tokens))
            promoted.append(report.branches.get("promoted", 0))
        return outs

    found = torch.zeros(vocab**length, dtype=torch.int64)
    for first, second in asyncio.run(many()):
        found[first * vocab + second] += 1
    assert (sum(promoted) > 0) == bool(branch_below)  # branches were taken, and only then
    expected = chain_law(target, length, vocab)
    law_vector = torch.tensor([expected[t] for t in itertools.product(range(vocab), repeat=2)])
    assert_chi_square(found, law_vector)


BRANCH_SCHEDULES = (
    "dsbvR",  # a branch at every first draft, verified after its position
    "dsbdsvvR",  # the chain goes on after the branch: a promoted branch makes it stale
    "adsbvR",  # the cloud commits the position first: the branch is checked against it
    "dsbaRvR",  # an AR token at the branch's position, adopted while drafts are in flight
    "ddsbvaRvR",  # a branch after a two-draft chunk, AR steps between
    "dsbvvaR",  # the branch verified at once after its position's rejection, then AR
)


@pytest.mark.parametrize("schedule", BRANCH_SCHEDULES)
def test_enumerated_law_with_branches(schedule):
    """Branches (eager.py, *branch*): drafted wherever the draft is unsure (here: always),
    promoted when the committed token is the branch's; the law stays the target chain's."""
    vocab, length = 3, 3
    draft, target = pair(vocab)
    cfg = config(length, branch_below=1.0, branch_len=1)
    counts: dict = {}
    found = law(lambda: run_schedule(draft, target, PROMPT, cfg, schedule, counts=counts))
    assert abs(sum(found.values()) - 1.0) < 1e-9
    assert max_gap(found, chain_law(target, length, vocab)) < 1e-5
    # branches were taken by both sides (the cloud may not reach a branch the device took
    # before the output is complete: the schedule stops there)
    assert counts["device"] >= counts["cloud"] > 0


def test_enumeration_catches_a_value_dependent_promotion(monkeypatch):
    """Planted fault: both sides take the branch only when its first draft is token 0, else
    the cloud decodes that position itself; the choice there then depends on the value drawn
    there, and the law moves. (Taking a branch after the wrong token would not: its drafts are
    still verified against the target, only less often accepted.)"""
    from tandem.protocols.spec import eager

    device_promotion = eager.EagerDrafter._promotion

    def faulty_device(self, token):
        branch = self.branch
        if branch is None or not branch.drafts or branch.drafts[0].token != 0:
            return None
        return device_promotion(self, token)

    def admit(self, request, _admit=eager.EagerVerifier.admit):
        if request.fixed and (not request.drafts or request.drafts[0] != 0):
            return eager.Admission(verify=None, skipped=0, stale=True)
        return _admit(self, request)

    monkeypatch.setattr(eager.EagerDrafter, "_promotion", faulty_device)
    monkeypatch.setattr(eager.EagerVerifier, "admit", admit)
    vocab, length = 3, 2
    draft, target = pair(vocab)
    cfg = config(length, branch_below=1.0, branch_len=1)
    found = law(lambda: run_schedule(draft, target, PROMPT, cfg, "dsbvvaR"))
    assert abs(sum(found.values()) - 1.0) < 1e-9
    assert max_gap(found, chain_law(target, length, vocab)) > 1e-3


def test_real_draws_with_branches_follow_the_target_chain():
    """Fixed seeds, the real position generators, branches on: chi-square of the joint law."""
    vocab, length = 5, 2
    draft, target = pair(vocab, mix=0.7)
    found = torch.zeros(vocab**length, dtype=torch.int64)
    for seed in range(SAMPLES):
        cfg = config(length, seed=seed, branch_below=1.0, branch_len=1)
        tokens = run_schedule(draft, target, PROMPT, cfg, "dsbaRvR")
        found[tokens[0] * vocab + tokens[1]] += 1
    expected = chain_law(target, length, vocab)
    law_vector = torch.tensor([expected[t] for t in itertools.product(range(vocab), repeat=2)])
    assert_chi_square(found, law_vector)
