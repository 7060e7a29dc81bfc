"""Contract tests every CausalLM backend must pass (tiny model always; real 0.5B marked slow)."""

from __future__ import annotations

import threading

import pytest
import torch

from tandem.models.base import Cancelled, CausalLM

ATOL = 1e-4


@pytest.fixture(params=["tiny", pytest.param("real", marks=pytest.mark.slow)])
def lm(request) -> CausalLM:
    return request.getfixturevalue("tiny_lm" if request.param == "tiny" else "real_lm")


def _prompt(lm: CausalLM, text: str = "def add(a, b):\n    return") -> list[int]:
    return lm.tokenizer.encode(text)


def test_is_a_causal_lm(lm):
    assert isinstance(lm, CausalLM)
    assert lm.vocab_size >= lm.tokenizer.vocab_size - 1


def test_score_equals_incremental_decode(lm):
    ids = _prompt(lm)
    full = lm.score(ids)  # [n, vocab]
    state = lm.prefill(ids[:3])
    steps = [state.logits[0]] + [lm.decode(state, [t])[0, -1] for t in ids[3:]]
    assert torch.allclose(torch.stack(steps), full[2:], atol=ATOL)


def test_decode_after_crop_equals_decode_without_rolled_back_tokens(lm):
    ids = _prompt(lm)
    state = lm.prefill(ids)
    lm.decode(state, [11, 12, 13])
    lm.rollback(state, 2)  # keep ids + [11]
    assert state.seq_len == len(ids) + 1
    after_crop = lm.decode(state, [21, 22])

    fresh = lm.prefill(ids)
    lm.decode(fresh, [11])
    without = lm.decode(fresh, [21, 22])
    assert torch.allclose(after_crop, without, atol=ATOL)
    assert state.row_ids(0) == fresh.row_ids(0)


def test_crop_inside_last_block_restores_logits(lm):
    ids = _prompt(lm)
    state = lm.prefill(ids)
    block = lm.decode(state, [5, 6, 7])
    lm.rollback(state, 1)
    assert torch.allclose(state.logits, block[:, 1], atol=0)
    lm.crop(state, len(ids))  # back to the prompt: before the block, logits not kept
    assert state.logits is None or torch.allclose(state.logits, block[:, 0], atol=ATOL)


def test_crop_rejects_bad_lengths(lm):
    state = lm.prefill(_prompt(lm))
    with pytest.raises(ValueError):
        lm.crop(state, state.seq_len + 1)
    with pytest.raises(ValueError):
        lm.crop(state, 0)


def test_batched_rows_equal_separate_runs(lm):
    prompts = [_prompt(lm, t) for t in ("import os", "x = [1, 2, 3]\nprint(", "# a")]
    batched = lm.prefill(prompts)
    assert batched.pads == [max(map(len, prompts)) - len(p) for p in prompts]
    first = batched.logits.clone()
    step = lm.decode(batched, [[7, 8]] * 3)
    for row, ids in enumerate(prompts):
        alone = lm.prefill(ids)
        assert torch.allclose(first[row], alone.logits[0], atol=ATOL)
        alone_step = lm.decode(alone, [7, 8])
        assert torch.allclose(step[row], alone_step[0], atol=ATOL)
        assert batched.row_ids(row) == ids + [7, 8]


def test_stack_equals_batched_prefill(lm):
    prompts = [_prompt(lm, t) for t in ("import os", "def f():\n    pass")]
    stacked = lm.stack([lm.prefill(p) for p in prompts])
    batched = lm.prefill(prompts)
    assert stacked.pads == batched.pads
    assert torch.allclose(lm.decode(stacked, [[3]] * 2), lm.decode(batched, [[3]] * 2), atol=ATOL)


def test_cancel_before_decode_leaves_state_unchanged(lm):
    state = lm.prefill(_prompt(lm))
    before = (state.seq_len, state.logits.clone())
    event = threading.Event()
    event.set()
    with pytest.raises(Cancelled):
        lm.decode(state, [1, 2], cancel=event)
    assert state.seq_len == before[0] and torch.equal(state.logits, before[1])
    assert lm.decode(state, [1])[0, -1].isfinite().all()


def test_cancel_between_layers_leaves_cache_consistent(lm):
    """The event is set while layer 0 runs, so the pass aborts before layer 1 after layer 0
    already appended its keys/values; the backend must cut them back."""
    ids = _prompt(lm)
    state = lm.prefill(ids)
    event = threading.Event()
    handle = lm.layers[0].register_forward_hook(lambda *_: event.set())
    try:
        with pytest.raises(Cancelled):
            lm.decode(state, [4, 5, 6], cancel=event)
    finally:
        handle.remove()
    assert state.seq_len == len(ids)
    assert all(layer.keys.shape[-2] == len(ids) for layer in state.cache.layers)
    resumed = lm.decode(state, [4, 5])
    fresh = lm.prefill(ids)
    assert torch.allclose(resumed, lm.decode(fresh, [4, 5]), atol=ATOL)


def test_save_load_state_round_trip(lm, tmp_path):
    ids = _prompt(lm)
    state = lm.prefill(ids)
    lm.save_state(state, tmp_path / "kv.safetensors")
    loaded = lm.load_state(tmp_path / "kv.safetensors")
    assert torch.allclose(loaded.logits, state.logits, atol=1e-6)
    assert torch.allclose(lm.decode(loaded, [9, 10]), lm.decode(state, [9, 10]), atol=1e-5)


def test_greedy_matches_transformers_generate(lm):
    ids = _prompt(lm)
    ref = lm.model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=0)[
        0, len(ids) :
    ].tolist()
    state = lm.prefill(ids)
    out = []
    for _ in range(6):
        out.append(int(state.logits[0].argmax()))
        lm.decode(state, [out[-1]])
    assert out == ref


def test_load_state_refuses_other_model(tiny_lm, tiny_lm_b, tmp_path):
    from tandem.errors import TandemError

    tiny_lm.save_state(tiny_lm.prefill([1, 2, 3]), tmp_path / "kv.safetensors")
    with pytest.raises(TandemError, match="another model"):
        tiny_lm_b.load_state(tmp_path / "kv.safetensors")
