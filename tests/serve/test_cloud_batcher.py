"""Cross-session batching of verification (tandem.models.batching): sessions verified together
in one forward pass get the same verdicts (accepted drafts, next token) as each alone, greedy
and sampled (seeded), and a cancelled item leaves its state untouched."""

from __future__ import annotations

import threading

import pytest
import torch

from tandem.models.base import Cancelled
from tandem.models.batching import BatchedLM, VerifyBatcher, run_batch
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.verifier import Request, Verifier
from tandem.sampling.warp import warp

SESSIONS = 5
ROUNDS = 4


def prompts(lm):
    texts = ["def add(a, b):", "import os\n", "x = [", "class Stack:\n    def", "# sort"]
    return [lm.tokenizer.encode(t) for t in texts]


def draft_block(device_lm, context: list[int], config: SpecConfig, generator) -> tuple:
    """`draft_len` drafts from the device model and the laws they were drawn from."""
    tokens, rows = [], []
    for _ in range(config.draft_len):
        probs = warp(device_lm.score(context + tokens)[-1], **config.sampling())  # [vocab]
        if config.temperature == 0:
            token = int(probs.argmax())
        else:
            token = int(torch.multinomial(probs, 1, generator=generator))
        tokens.append(token)
        rows.append(probs)
    return tuple(tokens), torch.stack(rows)


def run_session(verifier: Verifier, device_lm, prompt, config, session: int) -> list[tuple]:
    verifier.prefill()
    verdicts = []
    for round_ in range(ROUNDS):
        generator = torch.Generator().manual_seed(1000 * session + round_)
        drafts, rows = draft_block(device_lm, prompt + verifier.committed, config, generator)
        request = Request(
            seq=round_, epoch=verifier.epoch, position=verifier.frontier, fixed=(),
            drafts=drafts, draft_rows=rows, final=True,
        )  # fmt: skip
        result = verifier.verify(request)
        verdicts.append((result.num_accepted, result.next_token, tuple(verifier.committed)))
    return verdicts


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_verification_equals_unbatched(tiny_lm, tiny_lm_b, temperature):
    configs = [
        SpecConfig(temperature=temperature, seed=s, max_new_tokens=64, stop_at_eos=False)
        for s in range(SESSIONS)
    ]
    eos = tiny_lm_b.tokenizer.eos_token_id
    alone = [
        run_session(Verifier(tiny_lm_b, p, c, eos_id=eos), tiny_lm, p, c, i)
        for i, (p, c) in enumerate(zip(prompts(tiny_lm), configs, strict=True))
    ]
    batcher = VerifyBatcher(tiny_lm_b, window_ms=50.0)
    batched: list = [None] * SESSIONS
    barrier = threading.Barrier(SESSIONS)

    def worker(i: int, prompt: list[int], config: SpecConfig) -> None:
        verifier = Verifier(BatchedLM(tiny_lm_b, batcher), prompt, config, eos_id=eos)
        barrier.wait()
        batched[i] = run_session(verifier, tiny_lm, prompt, config, i)

    threads = [
        threading.Thread(target=worker, args=(i, p, c))
        for i, (p, c) in enumerate(zip(prompts(tiny_lm), configs, strict=True))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    assert batched == alone
    assert max(batcher.batch_sizes) > 1  # verifications really ran together
    assert batcher.queued_tokens == 0
    if temperature == 0:
        assert any(v[0] < 4 for s in alone for v in s)  # rejections were exercised too


def test_run_batch_leaves_inputs_alone_and_matches_single_passes(tiny_lm_b):
    states = [tiny_lm_b.prefill(p) for p in prompts(tiny_lm_b)[:3]]
    blocks = [[1, 2, 3, 4, 5], [9], [7, 7]]
    before = [s.seq_len for s in states]
    out = run_batch(tiny_lm_b, states, blocks)
    assert [s.seq_len for s in states] == before
    for state, block, (new, logits) in zip(states, blocks, out, strict=True):
        alone = tiny_lm_b.decode(state, block)
        assert new.seq_len == state.seq_len and new.row_ids(0) == state.row_ids(0)
        torch.testing.assert_close(logits, alone, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(new.logits, state.logits, rtol=1e-4, atol=1e-4)


def test_a_cancelled_item_is_refused_and_its_state_kept(tiny_lm_b):
    batcher = VerifyBatcher(tiny_lm_b, window_ms=0.0)
    state = tiny_lm_b.prefill([1, 2, 3])
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        batcher.decode(state, [4, 5], cancel=cancel)
    assert state.seq_len == 3
    logits = batcher.decode(state, [4, 5])
    assert state.seq_len == 5 and logits.shape == (1, 2, tiny_lm_b.vocab_size)
    batcher.close()
