"""Exactness: the first token's law is the target's for every uplink codec (chi-square over
seeds, fake models, sans-I/O drivers); separate rejection follows its own stated law, whose
TV error vs the target falls to 0 as K grows; greedy output equals the target's greedy output
for every pipeline x codec (tiny models, emulated link)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tandem.config import SamplingConfig
from tandem.protocols.local import generate
from tandem.protocols.spec import SpecConfig, run_pair
from tandem.protocols.spec import separate as sep
from tandem.sampling.warp import warp
from tandem.transport import LinkConfig

from .fakes import fake_pair
from .lockstep import chi_square_pvalue, lockstep

SAMPLES = 3000
UPLINKS = [
    ("dense", {}),
    ("identity", {}),
    ("k-sqs", {"k": 3, "ell": 12}),  # coarse on purpose: drafts from the wrong law would show
    ("c-sqs", {"ell": 12, "alpha": 0.05, "eta": 0.05, "beta": 0.05}),
    ("top-k", {"k": 3}),
]


def first_tokens(config: SpecConfig, *, draft_len: int = 3, vocab: int = 8) -> list[int]:
    draft, target = fake_pair(vocab)
    prompt = [1, 2, 3]
    out = []
    for seed in range(SAMPLES):
        cfg = SpecConfig(**{**config.to_json(), "seed": seed, "draft_len": draft_len})
        out.append(lockstep(draft, target, prompt, cfg)[0])
    return out


def target_first_law(temperature: float, vocab: int = 8) -> torch.Tensor:
    _, target = fake_pair(vocab)
    return warp(target.row((1, 2, 3)).double(), temperature=temperature)


@pytest.mark.parametrize("codec,params", UPLINKS)
def test_first_token_follows_the_target_law(codec, params):
    config = SpecConfig(
        codec=codec, codec_params=params, temperature=1.0, max_new_tokens=1, stop_at_eos=False
    )
    assert chi_square_pvalue(first_tokens(config), target_first_law(1.0)) > 1e-3


def test_chi_square_catches_drafts_from_the_wrong_law(monkeypatch):
    """Sampling drafts from the model's law while sending the quantized one breaks exactness;
    the test above must be able to see that."""
    from tandem.protocols.spec import drafter as drafter_module

    def patched(codec, draft_probs, generator):
        from tandem.codecs import Draft

        payload = codec.encode(draft_probs)
        sent = codec.transmitted_probs(draft_probs)
        token = int(torch.multinomial(draft_probs, 1, generator=generator))
        if sent[token] == 0:
            token = int(sent.argmax())
        return Draft(token=token, sent_probs=sent, payload=payload)

    monkeypatch.setattr(drafter_module, "qs_draft", patched)
    config = SpecConfig(
        codec="k-sqs",
        codec_params={"k": 3, "ell": 12},
        temperature=1.0,
        max_new_tokens=1,
        stop_at_eos=False,
    )
    assert chi_square_pvalue(first_tokens(config), target_first_law(1.0)) < 1e-3


def test_separate_rejection_follows_its_stated_law():
    """The device-side resampling produces exactly `separate.law` (not the target's law)."""
    k = 1  # top-1 downlink: the error is large enough for 3000 samples to see
    config = SpecConfig(
        codec="separate", downlink_k=k, temperature=1.0, max_new_tokens=1, stop_at_eos=False
    )
    draft, target = fake_pair(8)
    draft_probs = warp(draft.row((1, 2, 3)), temperature=1.0)
    target_probs = warp(target.row((1, 2, 3)), temperature=1.0)
    stated = sep.law(draft_probs, target_probs, k)
    samples = first_tokens(config)
    assert chi_square_pvalue(samples, stated) > 1e-3
    assert float(sep.law_tv(draft_probs, target_probs, k)) > 0.05  # it is approximate...
    assert chi_square_pvalue(samples, target_probs) < 1e-3  # ...and the test sees it


def test_separate_rejection_error_falls_to_zero_with_k():
    generator = torch.Generator().manual_seed(0)
    draft_probs = torch.softmax(2 * torch.randn(50, 64, generator=generator), -1)
    target_probs = torch.softmax(2 * torch.randn(50, 64, generator=generator), -1)
    errors = [float(sep.law_tv(draft_probs, target_probs, k).mean()) for k in (1, 4, 16, 64)]
    assert errors[0] > errors[1] > errors[2] > errors[3]
    assert errors[3] < 1e-3  # top-64 of 64 = the whole law (up to float16 rounding)
    assert errors[0] > 0.05


PIPELINE_CODECS = [
    (pipeline, codec, params)
    for pipeline in ("sync", "async")
    for codec, params in (
        ("dense", {}),
        ("separate", {}),
        ("k-sqs", {"k": 8}),
        ("c-sqs", {}),
    )
]


@pytest.mark.parametrize("pipeline,codec,params", PIPELINE_CODECS)
def test_greedy_equals_target_greedy(tiny_lm, tiny_target, prompt_ids, pipeline, codec, params):
    n = 24
    reference = generate(
        tiny_target, prompt_ids, SamplingConfig(temperature=0, max_new_tokens=n, stop_at_eos=False)
    ).tokens
    config = SpecConfig(
        pipeline=pipeline,
        codec=codec,
        codec_params=params,
        temperature=0.0,
        max_new_tokens=n,
        stop_at_eos=False,
    )
    link = LinkConfig(delay_ms=3.0, jitter_ms=2.0, seed=1)
    report, cloud = asyncio.run(
        run_pair(
            device_lm=tiny_lm, cloud_lm=tiny_target, prompt_ids=prompt_ids, config=config, link=link
        )
    )
    assert report.tokens == reference
    summary = report.summary()
    assert 0 < summary["acceptance_rate"] < 1  # partly accepted blocks: the paths ran
    assert report.cloud["agrees_with_device"]


@pytest.mark.parametrize("pipeline,codec", [("sync", "dense"), ("async", "k-sqs")])
def test_first_two_tokens_follow_the_target_chain(pipeline, codec):
    """Position 1 comes from a verified draft, a residual, or the next block's first draft
    (async: no bonus token): the joint law of two tokens is the target chain's either way."""
    vocab = 6
    draft, target = fake_pair(vocab)
    prompt = [1, 2, 3]
    samples = []
    for seed in range(SAMPLES):
        config = SpecConfig(
            pipeline=pipeline, codec=codec, codec_params={"k": 4, "ell": 20} if codec == "k-sqs" else {},
            draft_len=2, temperature=1.0, seed=seed, max_new_tokens=2, stop_at_eos=False,
        )  # fmt: skip
        first, second = lockstep(draft, target, prompt, config)
        samples.append(first * vocab + second)
    first_law = warp(target.row((1, 2, 3)).double(), temperature=1.0)
    joint = torch.stack(
        [
            first_law[a] * warp(target.row((1, 2, 3, a)).double(), temperature=1.0)
            for a in range(vocab)
        ]
    )  # [vocab, vocab]
    assert chi_square_pvalue(samples, joint.reshape(-1)) > 1e-3
