"""A sans-I/O driver for tests: a Drafter and a Verifier pumped in lock step, every message
encoded to bytes and parsed back, no event loop. Same draws as the real pipelines (position
generators), so its output is what `run_pair` produces in sync mode."""

from __future__ import annotations

import scipy.stats
import torch

from tandem.codecs import make_codec
from tandem.protocols.spec import wire
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.drafter import Drafter
from tandem.protocols.spec.verifier import Verifier
from tandem.transport import FrameParser, Limits, encode_message


def roundtrip(msg):
    parser = FrameParser(limits=Limits())
    parser.receive_data(encode_message(msg))
    return parser.next_event()


def make_sides(draft_lm, target_lm, prompt_ids, config: SpecConfig):
    drafter = Drafter(draft_lm, prompt_ids, config, eos_id=draft_lm.tokenizer.eos_token_id)
    verifier = Verifier(target_lm, prompt_ids, config, eos_id=target_lm.tokenizer.eos_token_id)
    drafter.prefill()
    verifier.prefill()
    return drafter, verifier


def exchange(drafter: Drafter, verifier: Verifier, config: SpecConfig, seq: int = 1):
    """Send the drafter's unsent drafts, verify them, apply the verdict; returns the Result."""
    codec = None if config.separate else make_codec(config.codec, **config.codec_params)
    msg = roundtrip(wire.request_message(seq, drafter.take_chunk(), config.codec))
    request = wire.parse_request(
        msg, codec_name=config.codec, codec=codec, vocab_size=verifier.lm.vocab_size
    )
    result = verifier.verify(request)
    fields = wire.parse_result(roundtrip(wire.result_message(result)))
    fields.pop("rejected"), fields.pop("verify_s")
    drafter.apply(**fields)
    return result


def lockstep(draft_lm, target_lm, prompt_ids, config: SpecConfig) -> list[int]:
    drafter, verifier = make_sides(draft_lm, target_lm, prompt_ids, config)
    while not drafter.done:
        while drafter.unsent < config.draft_len and drafter.can_draft():
            drafter.draft_next()
        exchange(drafter, verifier, config)
    return drafter.committed


def chi_square_pvalue(samples: list[int], law: torch.Tensor) -> float:
    """Goodness of fit of token samples to a [vocab] law; cells expected < 5 times pooled."""
    law = law.double() / law.double().sum()
    observed = torch.bincount(torch.tensor(samples), minlength=law.shape[0]).double()
    assert float(observed[law <= 1e-12].sum()) == 0, "a zero-probability token was drawn"
    expected = law * len(samples)
    small = expected < 5
    counts = torch.cat([observed[~small], observed[small].sum().view(1)])
    expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = expected > 0
    return float(scipy.stats.chisquare(counts[keep].numpy(), expected[keep].numpy()).pvalue)
