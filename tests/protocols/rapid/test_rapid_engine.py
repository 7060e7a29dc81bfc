"""The RAPID loop and its baselines on tiny models: greedy equivalence, KV bookkeeping, the
StreamingLLM cache, and (slow) the real 0.5B model."""

from __future__ import annotations

import pytest
import torch

from tandem.baselines.rapid_baselines import (
    StreamingDrafter,
    compress_cache,
    lc,
    sd,
    streaming_sd,
)
from tandem.models.hf import HFCausalLM
from tandem.models.tiny import ByteTokenizer, tiny_config
from tandem.protocols.rapid.config import RapidConfig
from tandem.protocols.rapid.engine import rapid
from tandem.protocols.rapid.prompts import drafter_prompt, target_prompt
from tandem.protocols.rapid.states import Prefilled, prefill_long

CONTEXT = " ".join(f"item{i} is stored in bucket {i % 7};" for i in range(40))
QUESTION = "Which bucket holds item12?"
RETRIEVED = "item12 is stored in bucket 5;"


def prompts(lm, retrieved=RETRIEVED):
    return (
        target_prompt(lm.tokenizer, CONTEXT, QUESTION),
        drafter_prompt(lm.tokenizer, retrieved, QUESTION),
    )


def config(**kw) -> RapidConfig:
    base = {"gamma": 4, "max_new_tokens": 24, "stop_at_eos": False, "temperature": 0.0}
    return RapidConfig(**{**base, **kw})


@pytest.mark.parametrize("mode", ["exact", "paper"])
@pytest.mark.parametrize("eta", [0.0, 20.0])
@pytest.mark.parametrize("drafter_name", ["same", "other"])
def test_greedy_rapid_equals_target_greedy(tiny_lm, tiny_lm_b, mode, eta, drafter_name):
    drafter_lm = tiny_lm if drafter_name == "same" else tiny_lm_b
    target_ids, drafter_ids = prompts(tiny_lm)
    cfg = config(mode=mode, eta=eta)
    reference = lc(Prefilled(tiny_lm, target_ids), cfg)
    result = rapid(Prefilled(tiny_lm, target_ids), Prefilled(drafter_lm, drafter_ids), cfg)
    assert result.tokens == reference.tokens
    assert len(result.tokens) == cfg.max_new_tokens
    assert result.rounds == len(result.accepted_per_round)
    assert sum(result.accepted_per_round) + result.rounds >= len(result.tokens)


def test_a_drafter_reading_what_the_target_reads_is_always_accepted(tiny_lm):
    """Same model, same prompt, greedy: every draft must pass. Wrong drafter KV bookkeeping
    (a token fed twice or never) would make drafts diverge and be rejected."""
    target_ids, _ = prompts(tiny_lm)
    for bonus in (False, True):
        cfg = config(gamma=3, max_new_tokens=30, bonus_from_draft=bonus)
        result = rapid(Prefilled(tiny_lm, target_ids), Prefilled(tiny_lm, target_ids), cfg)
        assert result.acceptance_rate == 1.0
        assert result.tokens == lc(Prefilled(tiny_lm, target_ids), cfg).tokens


def test_prefilled_state_is_reusable_across_methods(tiny_lm, tiny_lm_b):
    target_ids, drafter_ids = prompts(tiny_lm)
    target, drafter = Prefilled(tiny_lm, target_ids), Prefilled(tiny_lm_b, drafter_ids)
    cfg = config(temperature=1.0, eta=10.0, seed=3)
    first = rapid(target, drafter, cfg)
    sd(target, drafter, cfg)
    lc(target, cfg)
    again = rapid(target, drafter, cfg)
    assert again.tokens == first.tokens  # same seeds, same states -> same sample
    fresh = rapid(Prefilled(tiny_lm, target_ids), Prefilled(tiny_lm_b, drafter_ids), cfg)
    assert fresh.tokens == first.tokens


def test_block_prefill_equals_one_prefill(tiny_lm):
    ids = target_prompt(tiny_lm.tokenizer, CONTEXT, QUESTION)
    whole = tiny_lm.prefill(ids)
    blocks = prefill_long(tiny_lm, ids, block=97)
    assert blocks.seq_len == whole.seq_len
    assert torch.allclose(blocks.logits, whole.logits, atol=1e-4)


def test_a_prompt_continuing_a_shared_prefix_equals_its_own_prefill(tiny_lm):
    from tandem.errors import TandemError

    ids = target_prompt(tiny_lm.tokenizer, CONTEXT, QUESTION)
    cut = len(ids) - 9
    prefix = Prefilled(tiny_lm, ids[:cut])
    shared = Prefilled(tiny_lm, ids, prefix=prefix, block=4)
    alone = Prefilled(tiny_lm, ids)
    assert shared.state.row_ids(0) == ids and shared.state.seq_len == alone.state.seq_len
    assert torch.allclose(shared.state.logits, alone.state.logits, atol=1e-4)
    assert shared.prefill_s == pytest.approx(prefix.prefill_s + shared.tail_s)
    cfg = config(temperature=0.0, max_new_tokens=12)
    assert lc(shared, cfg).tokens == lc(alone, cfg).tokens
    assert prefix.fresh().seq_len == cut  # the prefix is untouched by its continuation
    for bad in (ids[:cut], [ids[0] + 1, *ids[1:]]):
        with pytest.raises(TandemError, match="prefix"):
            Prefilled(tiny_lm, bad, prefix=prefix)


def test_cached_prefill_is_saved_then_loaded(tiny_lm, tmp_path):
    ids = target_prompt(tiny_lm.tokenizer, CONTEXT, QUESTION)
    first = Prefilled.cached(tiny_lm, ids, tmp_path)
    assert not first.loaded and len(list(tmp_path.glob("*.kv"))) == 1
    again = Prefilled.cached(tiny_lm, ids, tmp_path)
    assert again.loaded and again.prefill_s == pytest.approx(first.prefill_s)
    assert first.load_s is None and again.load_s is not None and again.load_s >= 0.0
    assert again.state.row_ids(0) == ids
    assert torch.allclose(again.state.logits, first.state.logits)
    cfg = config(temperature=0.0, max_new_tokens=8)
    assert lc(again, cfg).tokens == lc(first, cfg).tokens
    next(tmp_path.glob("*.kv")).write_bytes(b"broken")
    redone = Prefilled.cached(tiny_lm, ids, tmp_path)  # unreadable: computed and saved again
    assert not redone.loaded and Prefilled.cached(tiny_lm, ids, tmp_path).loaded
    assert not Prefilled.cached(tiny_lm, ids, None).loaded


def test_sampled_rapid_is_reproducible_and_differs_from_sd(tiny_lm, tiny_lm_b):
    target_ids, drafter_ids = prompts(tiny_lm)
    target, drafter = Prefilled(tiny_lm, target_ids), Prefilled(tiny_lm_b, drafter_ids)
    runs = {
        (mode, seed): rapid(
            target, drafter, config(temperature=1.0, eta=50.0, mode=mode, seed=seed)
        )
        for mode in ("exact", "paper")
        for seed in range(3)
    }
    assert (
        runs[("exact", 0)].tokens
        == rapid(target, drafter, config(temperature=1.0, eta=50.0)).tokens
    )
    plain = [sd(target, drafter, config(temperature=1.0, seed=s)).tokens for s in range(3)]
    exact = [runs[("exact", s)].tokens for s in range(3)]
    assert plain != exact  # eta = 50 shifts the target law, so the samples change


# -- StreamingLLM drafter -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_layer_lm():
    """A one-layer tiny Qwen2: its cached keys/values depend only on token and position, so a
    compressed cache must give exactly the logits of the shortened prompt."""
    from transformers import Qwen2ForCausalLM

    cfg = tiny_config()
    cfg.num_hidden_layers = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = Qwen2ForCausalLM(cfg)
        for p in model.parameters():
            p.data.normal_(0, 0.2)
    return HFCausalLM(model, ByteTokenizer(), name="tiny-qwen2-1layer")


def test_compressed_cache_equals_prefill_of_kept_tokens(one_layer_lm):
    lm = one_layer_lm
    ids = list(b"a long prompt whose middle part will be evicted from the drafter cache!")
    sink, window = 4, 20
    state = lm.prefill(ids)
    assert compress_cache(lm, state, sink=sink, window=window) == len(ids) - sink - window
    kept = ids[:sink] + ids[-window:]
    assert state.row_ids(0) == kept
    reference = lm.prefill(kept)
    got = lm.decode(state, [[ord("x"), ord("y")]])
    want = lm.decode(reference, [[ord("x"), ord("y")]])
    assert torch.allclose(got, want, atol=1e-4)


def test_compress_is_a_no_op_when_the_prompt_fits(tiny_lm):
    state = tiny_lm.prefill(list(b"short prompt"))
    before = state.cache.layers[0].keys.clone()
    assert compress_cache(tiny_lm, state, sink=4, window=64) == 0
    assert torch.equal(state.cache.layers[0].keys, before)


def test_streaming_sd_greedy_equals_target_greedy(tiny_lm, tiny_lm_b):
    target_ids, _ = prompts(tiny_lm)
    cfg = config(max_new_tokens=40)
    target = Prefilled(tiny_lm, target_ids)
    reference = lc(target, cfg)
    for drafter_lm in (tiny_lm, tiny_lm_b):
        drafter_state = Prefilled(drafter_lm, target_ids).copy()
        result = streaming_sd(target, drafter_lm, drafter_state, cfg, sink=4, window=64)
        assert result.tokens == reference.tokens
        assert result.extra["dropped"] >= len(target_ids) - 68


def test_streaming_drafter_recompresses_as_it_grows(tiny_lm):
    target_ids, _ = prompts(tiny_lm)
    state = Prefilled(tiny_lm, target_ids).copy()
    drafter = StreamingDrafter(tiny_lm, state, sink=4, window=32, slack=8, seed=0, temperature=0.0)
    for round_ in range(10):
        tokens, _ = drafter.propose(4, 5 * round_)
        drafter.accept(4, tokens[0])
    assert drafter.state.seq_len <= 4 + 32 + 8 + 5 + 1
