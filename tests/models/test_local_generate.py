"""Device-only generation: greedy equals transformers' greedy; sampling is seeded."""

from __future__ import annotations

import pytest
import torch

from tandem.config import SamplingConfig
from tandem.protocols.decoding import IncrementalDetokenizer, text_stream
from tandem.protocols.local import generate


def _hf_greedy(lm, ids, n):
    out = lm.model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def test_greedy_equals_transformers_greedy(tiny_lm):
    ids = tiny_lm.tokenizer.encode("hello world")
    config = SamplingConfig(temperature=0, max_new_tokens=12, stop_at_eos=False)
    pieces = []
    result = generate(tiny_lm, ids, config, on_token=text_stream(tiny_lm.tokenizer, pieces.append))
    assert result.tokens == _hf_greedy(tiny_lm, ids, 12)
    assert len(pieces) == 12 and "".join(pieces) == result.text


def test_sampling_is_reproducible_per_seed(tiny_lm):
    ids = tiny_lm.tokenizer.encode("abc")

    def run(seed):
        return generate(
            tiny_lm,
            ids,
            SamplingConfig(temperature=1.0, max_new_tokens=16, seed=seed, stop_at_eos=False),
        ).tokens

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_stops_at_eos(tiny_lm):
    ids = tiny_lm.tokenizer.encode("x")
    # Force EOS: a model whose logits always favour EOS is simulated by top-k=1 on a biased head.
    head = tiny_lm.model.lm_head.weight
    saved = head.data.clone()
    try:
        head.data[tiny_lm.tokenizer.eos_token_id] = 10 * head.data.abs().max()
        result = generate(tiny_lm, ids, SamplingConfig(temperature=0, max_new_tokens=8))
    finally:
        head.data.copy_(saved)
    assert result.finish_reason == "eos" and len(result.tokens) == 1


def test_detokenizer_waits_for_whole_characters(tiny_lm):
    detok = IncrementalDetokenizer(tiny_lm.tokenizer)
    pieces = [detok.push(b) for b in "é!".encode()]
    assert pieces == ["", "é", "!"]


def test_text_stream_hides_eos(tiny_lm):
    shown = []
    on_token = text_stream(tiny_lm.tokenizer, shown.append, eos=tiny_lm.tokenizer.eos_token_id)
    for token in [*b"ok", tiny_lm.tokenizer.eos_token_id]:
        on_token(token)
    assert shown == ["o", "k"]


@pytest.mark.slow
def test_real_model_greedy_equals_transformers(real_hf_lm):
    real_lm = real_hf_lm
    ids = real_lm.tokenizer.chat_prompt("Write hello world in Python.")
    result = generate(real_lm, ids, SamplingConfig(temperature=0, max_new_tokens=8))
    assert result.tokens == _hf_greedy(real_lm, ids, 8)
