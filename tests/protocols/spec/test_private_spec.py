"""Private-RAG speculative decoding (tandem.protocols.private_spec): the two sides condition on
different prompts, the cloud verifies against RAPID's augmented target.

- the law: with eta > 0 at temperature 1, the joint law of the first two tokens is the chain of
  p_hat rows, enumerated from the fake tables with each side's own prompt and the codec's
  transmitted law (chi-square over fixed seeds); with eta = 0 it is the cloud's target chain
  whatever the device's prompt; a wrong claimed law is rejected by the same test;
- augmented greedy (eta > 0, temperature 0) equals step-by-step argmax of p_hat, for both
  pipelines, and eta = 0 at temperature 0 equals plain greedy decoding of the cloud's prompt;
- the mode end to end over an emulated link with two corpora: the start message carries no
  document, each side reports its own chunks.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from protocols.dragon.conftest import QUESTION  # the `corpora` fixture: ./conftest.py
from tandem.codecs import make_codec
from tandem.config import SamplingConfig
from tandem.errors import TandemError
from tandem.protocols.local import generate
from tandem.protocols.private_spec import (
    MODE,
    private_config,
    question_prompt,
    run_private_device,
    serve_private_session,
)
from tandem.protocols.spec import wire
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.drafter import Drafter
from tandem.protocols.spec.verifier import Verifier
from tandem.sampling.rapid import augmented_from_probs, augmented_target
from tandem.sampling.warp import warp
from tandem.transport import LinkConfig, control, memory_pair

from .fakes import fake_pair
from .lockstep import chi_square_pvalue, exchange

SAMPLES = 3000
DEVICE_PROMPT = [4, 5, 1]
CLOUD_PROMPT = [1, 2, 3]


def two_prompt_lockstep(draft_lm, target_lm, config: SpecConfig) -> list[int]:
    """The sans-I/O sides pumped in lock step, each with its own prompt."""
    drafter = Drafter(draft_lm, DEVICE_PROMPT, config, eos_id=None)
    verifier = Verifier(target_lm, CLOUD_PROMPT, config, eos_id=None)
    drafter.prefill(), verifier.prefill()
    seq = 0
    while not drafter.done:
        while drafter.unsent < config.draft_len and drafter.can_draft():
            drafter.draft_next()
        seq += 1
        exchange(drafter, verifier, config, seq)
    assert verifier.committed == drafter.committed
    return drafter.committed


def p_hat_row(draft_lm, target_lm, output: tuple[int, ...], config: SpecConfig) -> torch.Tensor:
    """The claimed law at the position after `output` (both prompts, transmitted draft law)."""
    codec = make_codec(config.codec, **config.codec_params)
    draft = warp(draft_lm.row(tuple(DEVICE_PROMPT) + output).double(), **config.law_sampling())
    sent = codec.transmitted_probs(draft.float()).double()
    target = warp(target_lm.row(tuple(CLOUD_PROMPT) + output).double(), **config.law_sampling())
    if not config.augmented:
        return target
    return augmented_from_probs(
        target, sent, config.eta, greedy=config.augmented_greedy, tail=config.tail
    )


def joint_law(draft_lm, target_lm, config: SpecConfig, vocab: int) -> torch.Tensor:  # [V * V]
    first = p_hat_row(draft_lm, target_lm, (), config)
    rows = [first[a] * p_hat_row(draft_lm, target_lm, (a,), config) for a in range(vocab)]
    return torch.stack(rows).reshape(-1)


def two_token_samples(config: SpecConfig, vocab: int) -> list[int]:
    draft, target = fake_pair(vocab)
    samples = []
    for seed in range(SAMPLES):
        cfg = SpecConfig(**{**config.to_json(), "seed": seed})
        first, second = two_prompt_lockstep(draft, target, cfg)
        samples.append(first * vocab + second)
    return samples


def law_config(**overrides) -> SpecConfig:
    base = dict(draft_len=2, temperature=1.0, max_new_tokens=2, stop_at_eos=False, eta=3.0)
    return SpecConfig(**{**base, **overrides})


@pytest.mark.parametrize(
    "pipeline,codec,params",
    [("sync", "dense", {}), ("async", "k-sqs", {"k": 3, "ell": 20}), ("sync", "top-k", {"k": 2})],
)
def test_two_tokens_follow_the_augmented_chain(pipeline, codec, params):
    vocab = 6
    config = law_config(pipeline=pipeline, codec=codec, codec_params=params)
    draft, target = fake_pair(vocab)
    law = joint_law(draft, target, config, vocab)
    assert abs(float(law.sum()) - 1.0) < 1e-6
    samples = two_token_samples(config, vocab)
    assert chi_square_pvalue(samples, law) > 1e-3
    # the same samples reject the cloud's plain target chain: the transfer is visible
    plain = joint_law(draft, target, law_config(pipeline=pipeline, codec=codec, eta=0.0), vocab)
    assert chi_square_pvalue(samples, plain) < 1e-6


def test_eta_zero_is_the_cloud_chain_whatever_the_device_reads():
    vocab = 6
    config = law_config(pipeline="async", codec="k-sqs", codec_params={"k": 3, "ell": 20}, eta=0.0)
    draft, target = fake_pair(vocab)
    samples = two_token_samples(config, vocab)
    assert chi_square_pvalue(samples, joint_law(draft, target, config, vocab)) > 1e-3


def test_augmented_from_probs_is_eq6_at_temperature_one():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 9, generator=generator, dtype=torch.float64)
    draft = torch.softmax(torch.randn(4, 9, generator=generator, dtype=torch.float64), -1)
    for tail in ("paper", "code", "none"):
        expected = augmented_target(logits, draft, 2.5, 1.0, tail=tail)
        got = augmented_from_probs(torch.softmax(logits, -1), draft, 2.5, tail=tail)
        assert torch.allclose(got, expected, atol=1e-12)
    greedy = augmented_from_probs(torch.softmax(logits, -1), draft, 2.5, greedy=True)
    assert torch.equal(greedy.argmax(-1), augmented_target(logits, draft, 2.5, 1.0).argmax(-1))
    assert torch.equal(greedy.sum(-1), torch.ones(4, dtype=torch.float64))
    cut = torch.softmax(logits, -1).clone()
    cut[:, :3] = 0.0  # a warp removed these tokens: p_hat keeps them at 0
    cut = cut / cut.sum(-1, keepdim=True)
    assert float(augmented_from_probs(cut, draft, 2.5)[:, :3].abs().max()) == 0.0


@pytest.mark.parametrize("pipeline", ["sync", "async"])
def test_augmented_greedy_is_argmax_of_p_hat(pipeline):
    vocab, n = 8, 10
    draft, target = fake_pair(vocab)
    config = SpecConfig(
        pipeline=pipeline, codec="k-sqs", codec_params={"k": 3, "ell": 20}, temperature=0.0,
        draft_len=3, max_new_tokens=n, stop_at_eos=False, eta=2.0,
    )  # fmt: skip
    output: tuple[int, ...] = ()
    for _ in range(n):
        output += (int(p_hat_row(draft, target, output, config).argmax()),)
    assert two_prompt_lockstep(draft, target, config) == list(output)
    plain = SpecConfig(**{**config.to_json(), "eta": 0.0})
    target_greedy: tuple[int, ...] = ()
    for _ in range(n):
        target_greedy += (int(target.row(tuple(CLOUD_PROMPT) + target_greedy).argmax()),)
    assert two_prompt_lockstep(draft, target, plain) == list(target_greedy)
    assert list(output) != list(target_greedy)  # eta moved the answer (else the test is idle)


def test_separate_rejection_cannot_carry_eta():
    with pytest.raises(TandemError, match="whole draft law"):
        SpecConfig(codec="separate", eta=1.0)
    with pytest.raises(TandemError, match="eta"):
        SpecConfig(eta=-1.0)


class Recording:
    """A channel wrapper that keeps every message the device sends."""

    def __init__(self, channel) -> None:
        self.channel, self.sent = channel, []

    def __getattr__(self, name):
        return getattr(self.channel, name)

    async def send(self, msg) -> None:
        self.sent.append(msg)
        await self.channel.send(msg)


@pytest.mark.parametrize("pipeline", ["sync", "async"])
def test_mode_end_to_end_eta_zero_is_cloud_greedy(tiny_lm, tiny_target, corpora, pipeline):
    """eta = 0 at temperature 0: the answer is the cloud model's greedy answer on its own
    (public) prompt; the start message holds the question, never a private chunk."""
    from tandem.protocols.private_spec import rag_prompt

    n = 16
    config = private_config(
        pipeline=pipeline, eta=0.0, temperature=0.0, max_new_tokens=n, stop_at_eos=False
    )
    device_knowledge, cloud_knowledge = corpora
    _, context = cloud_knowledge.context(QUESTION, 2)
    cloud_prompt = rag_prompt(tiny_target.tokenizer, context, QUESTION)
    reference = generate(
        tiny_target,
        cloud_prompt,
        SamplingConfig(temperature=0, max_new_tokens=n, stop_at_eos=False),
    ).tokens

    async def main():
        device_channel, cloud_channel = memory_pair(link=LinkConfig(delay_ms=3.0, seed=1))
        recording = Recording(device_channel)
        cloud = asyncio.create_task(
            serve_private_session(cloud_channel, tiny_target, cloud_knowledge)
        )
        report = await run_private_device(recording, tiny_lm, device_knowledge, QUESTION, config)
        return report, await cloud, recording.sent

    report, cloud, sent = asyncio.run(main())
    assert report.tokens == reference
    assert report.mode == MODE and len(report.docs) == 2 and len(cloud["public_docs"]) == 2
    assert report.cloud["agrees_with_device"]
    start = sent[0]
    assert start.mode == MODE and control.body(start)["question"] == QUESTION
    assert list(start.tokens) == question_prompt(tiny_lm.tokenizer, QUESTION)
    private_words = {"journald", "salinity", "factor 2"}
    for msg in sent:  # nothing the device sends spells a private chunk
        blob = repr(msg)
        assert not any(word in blob for word in private_words), blob[:200]


def test_mode_with_eta_runs_and_reports_both_sides(tiny_lm, tiny_target, corpora):
    from tandem.protocols.private_spec import run_private_pair

    config = private_config(temperature=0.0, max_new_tokens=12, stop_at_eos=False, eta=3.0)
    report, cloud = asyncio.run(
        run_private_pair(
            device_lm=tiny_lm, cloud_lm=tiny_target, device_knowledge=corpora[0],
            cloud_knowledge=corpora[1], question=QUESTION, config=config,
        )
    )  # fmt: skip
    assert len(report.tokens) == 12 and report.cloud["agrees_with_device"] and cloud["public_docs"]
    assert report.payload_bits <= 64 * report.drafts_sent  # K-SQS K=3: <= 64 bits per draft


def test_bad_start_is_refused_with_a_message(tiny_target, corpora):
    async def main():
        device_channel, cloud_channel = memory_pair()
        cloud = asyncio.create_task(serve_private_session(cloud_channel, tiny_target, corpora[1]))
        start = wire.start_message(MODE, private_config().to_json(), (1, 2), question="  ")
        await device_channel.send(start)
        reply = await device_channel.recv()
        return reply, await cloud

    reply, result = asyncio.run(main())
    assert result is None and "no question" in reply.message


README_QUESTION = (
    "Which base delay does our retry policy use, and which asyncio function does it sleep with?"
)


@pytest.mark.slow
def test_the_readme_question_gets_the_chunk_that_holds_its_answer():
    """The README's private-spec question over examples/private-notes, retrieved as the CLI
    does (the 0.5B's tokenizer, MiniLM, DOCS chunks): retrieval returns backoff.py's first and
    third chunks; the device's context puts the second (`base=0.5`) back between them, where
    the plain join left it out and the answer invented a 100 ms delay."""
    from pathlib import Path

    from tandem.models.registry import load_tokenizer
    from tandem.protocols.dragon import Knowledge
    from tandem.protocols.dragon.knowledge import joined_context
    from tandem.protocols.dragon.setup import ensure_index
    from tandem.protocols.private_spec import DOCS

    notes = Path(__file__).resolve().parents[3] / "examples" / "private-notes"
    tokenizer = load_tokenizer("qwen2.5-coder-0.5b", progress=False)
    index = ensure_index(str(notes), tokenizer=tokenizer, tokenizer_name="qwen2.5-coder-0.5b",
                         progress=False)  # fmt: skip
    knowledge = Knowledge.from_index(index)
    docs = knowledge.retrieve(README_QUESTION, DOCS)
    assert [d.doc_id for d in docs] == [f"private-notes/snippets/backoff.py#{i}" for i in (0, 2)]
    assert "base=0.5" not in joined_context(docs)  # what the retrieved chunks hold
    used = knowledge.filled(docs)
    assert [d.doc_id for d in used] == [f"private-notes/snippets/backoff.py#{i}" for i in range(3)]
    context = joined_context(used)
    assert "base=0.5" in context and "asyncio.sleep" in context and "\n...\n" not in context
