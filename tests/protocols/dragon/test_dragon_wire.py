"""DRAGON messages survive the real wire format; drafts decode to the sender's sent probs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tandem.codecs import make_codec
from tandem.protocols.dragon import DragonConfig, wire
from tandem.protocols.dragon.decoder import SideLaw
from tandem.protocols.dragon.queues import DraftQueue, make_draft
from tandem.transport import FrameParser, Limits, Start, control, encode_message


def roundtrip(msg):
    parser = FrameParser(limits=Limits())
    parser.receive_data(encode_message(msg, compression=None))
    return parser.next_event()


def law(vocab: int = 300, seed: int = 0) -> SideLaw:
    generator = torch.Generator().manual_seed(seed)
    probs = torch.softmax(3 * torch.randn(vocab, generator=generator), 0)
    return SideLaw(probs=probs, logweight=1.25, doc_weights=None)


@pytest.mark.parametrize("greedy", [True, False])
def test_draft_round_trip_keeps_the_transmitted_law(greedy):
    codec = make_codec("top-p", p=0.8)
    draft = make_draft(
        law(), codec=codec, side="cloud", position=4, epoch=2, seed=9, greedy=greedy, context=77
    )
    assert draft.sent_probs[draft.token] > 0  # drawn from what is transmitted (errata 2)
    if greedy:
        assert draft.token == int(draft.sent_probs.argmax())
    received = wire.parse_draft(
        roundtrip(wire.draft_message(3, draft, codec.name)),
        side="cloud",
        codec=codec,
        vocab_size=300,
    )
    assert torch.equal(received.sent_probs, draft.sent_probs)
    assert (received.position, received.epoch, received.token, received.context) == (
        4,
        2,
        draft.token,
        77,
    )
    assert received.logweight == 1.25
    assert received.branch_of is None


def test_a_branch_draft_round_trips_and_a_bad_branch_is_refused():
    codec = make_codec("top-p", p=0.8)
    draft = make_draft(law(), codec=codec, side="device", position=4, epoch=3, seed=9, greedy=True)
    branch = dataclasses.replace(draft, branch_of=(3, 17))

    def parse(d):
        return wire.parse_draft(
            roundtrip(wire.draft_message(1, d, codec.name)),
            side="device",
            codec=codec,
            vocab_size=300,
        )

    assert parse(branch).branch_of == (3, 17) and parse(branch).epoch == 3
    for bad in ((2, 17), (3, 300)):  # not the position before, a token outside the vocabulary
        with pytest.raises(ValueError, match="branch"):
            parse(dataclasses.replace(draft, branch_of=bad))


def test_a_stamp_round_trips_and_a_bad_one_is_refused():
    import numpy as np

    codec = make_codec("top-p", p=0.8)
    draft = make_draft(law(), codec=codec, side="device", position=4, epoch=0, seed=9, greedy=True)
    plain = roundtrip(wire.draft_message(1, draft, codec.name))
    assert wire.draft_stamp(plain) is None
    stamped = roundtrip(wire.draft_message(1, draft, codec.name, (3, 2**32 - 1)))
    assert wire.draft_stamp(stamped) == (3, 2**32 - 1)
    for bad in ([3, 2**32], [-1, 5], [1, 2, 3], [0.5, 1.0]):
        arrays = {**plain.arrays, "stamp": np.array(bad)}
        with pytest.raises(ValueError, match="stamp"):
            wire.draft_stamp(dataclasses.replace(plain, arrays=arrays))


def test_a_draft_without_finite_meta_is_refused_and_a_side_of_zero_weight_is_not():
    import numpy as np

    codec = make_codec("top-p", p=0.8)
    draft = make_draft(law(), codec=codec, side="device", position=4, epoch=0, seed=9, greedy=True)
    plain = roundtrip(wire.draft_message(1, draft, codec.name))

    def parse(meta):
        arrays = {**plain.arrays, "meta": np.array(meta)}
        if meta is None:
            arrays.pop("meta")
        msg = dataclasses.replace(plain, arrays=arrays)
        return wire.parse_draft(msg, side="device", codec=codec, vocab_size=300)

    assert parse([0.0, -np.inf, 0.5, 12.0]).logweight == -np.inf  # no documents on that side
    for bad in (None, [0.0, 1.0, 0.5], [np.nan, 1.0, 0.5, 12.0], [0.0, 1.0, np.inf, 12.0],
                [0.0, 1.0, 0.5, -np.inf]):  # fmt: skip
        with pytest.raises(ValueError, match="epoch, logweight"):
            parse(bad)


def test_control_messages_round_trip():
    config = DragonConfig(max_new_tokens=5, strategy="random", codec_params={"p": 0.9})
    msg = roundtrip(wire.start_message(config=config, question="why?", profile=[0.1, 2.0, 3.0]))
    assert isinstance(msg, Start) and msg.mode == wire.MODE
    body = control.body(msg)
    assert DragonConfig.from_json(body["config"]) == config
    assert body["question"] == "why?" and body["profile"] == [0.1, 2.0, 3.0]
    pad = roundtrip(wire.pad_message(2, 1000))
    assert wire.is_pad(pad) and not wire.is_pad(msg) and pad.arrays["body"].nbytes > 1000


def test_sampled_drafts_use_position_seeds():
    codec = make_codec("top-p", p=0.95)
    tokens = [
        make_draft(
            law(seed=1), codec=codec, side="device", position=p, epoch=0, seed=3, greedy=False
        ).token
        for p in range(40)
    ]
    again = make_draft(
        law(seed=1), codec=codec, side="device", position=7, epoch=5, seed=3, greedy=False
    )
    assert again.token == tokens[7] and len(set(tokens)) > 3


def test_draft_queue_resolution():
    codec = make_codec("top-p", p=0.8)
    queue = DraftQueue()
    drafts = [
        make_draft(law(), codec=codec, side="device", position=p, epoch=0, seed=0, greedy=True)
        for p in range(3)
    ]
    for draft in drafts:
        queue.push(draft)
    with pytest.raises(ValueError):
        queue.push(drafts[0])
    assert queue.front_at(1) is drafts[1] and len(queue) == 2  # position 0 was stale
    assert queue.front_at(5) is None and len(queue) == 0


def softmax_law(vocab: int, seed: int, scale: float) -> SideLaw:
    logits = scale * torch.randn(vocab, generator=torch.Generator().manual_seed(seed))
    return SideLaw(torch.softmax(logits, 0), 0.5, None, softmax=True)


@pytest.mark.parametrize("name", ["top-p", "top-k"])
def test_a_greedy_sparse_draft_is_in_the_kept_form_with_the_dense_path_numbers(name):
    """A sparse codec's greedy draft holds its kept ids and values, no [vocab] array; token,
    support and sent probs are those of the dense path (encode_sent, then the argmax), whether
    the row decided it without its total (a peaked softmax row) or not; the peer parses the
    same form."""
    from tandem.sampling.warp import support_argmax

    codec = make_codec(name)
    decided = 0
    for seed in range(40):
        law = softmax_law(2000, seed, scale=1.0 + seed % 8)
        decided += codec.softmax_kept(law.probs) is not None
        draft = make_draft(
            law, codec=codec, side="device", position=0, epoch=0, seed=0, greedy=True
        )
        assert draft.dense is None and draft.values is not None
        sent = codec.encode_sent(law.probs)
        assert draft.token == support_argmax(sent.probs, torch.from_numpy(sent.support))
        assert sorted(draft.support.tolist()) == sorted(sent.support.tolist())
        assert torch.equal(draft.sent_probs, sent.probs)  # built from the kept form
        received = wire.parse_draft(
            roundtrip(wire.draft_message(0, draft, codec.name)),
            side="device",
            codec=codec,
            vocab_size=2000,
        )
        assert received.dense is None and torch.equal(received.sent_probs, sent.probs)
    assert decided > 0 if name == "top-p" else decided == 0


def test_a_parsed_kept_draft_whose_token_it_does_not_hold_is_refused():
    codec = make_codec("top-p", p=0.8)
    draft = make_draft(law(), codec=codec, side="device", position=1, epoch=0, seed=9, greedy=True)
    outside = next(t for t in range(300) if t not in draft.support.tolist())
    msg = wire.draft_message(0, dataclasses.replace(draft, token=outside), codec.name)
    with pytest.raises(ValueError, match="not in the support"):
        wire.parse_draft(roundtrip(msg), side="device", codec=codec, vocab_size=300)
