"""Every codec: decode(encode(probs)) == transmitted_probs(probs) bit for bit, the payload is
ceil(bits / 8) bytes, the TV error is within the stated bound, and bad bytes fail cleanly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tandem.codecs import (
    CODEC_NAMES,
    CodecError,
    DenseCodec,
    TopKCodec,
    TopPCodec,
    make_codec,
    sparse,
    tv_distance,
)
from tandem.errors import TandemError

QWEN_VOCAB = 151_936
SMALL_PARAMS = {"top-k": {"k": 4}, "k-sqs": {"k": 4, "ell": 20}, "c-sqs": {"ell": 20}}


def softmax(vocab: int, scale: float, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(vocab, generator=generator) * scale, dim=-1)


def one_hot(vocab: int, token: int) -> torch.Tensor:
    probs = torch.zeros(vocab)
    probs[token] = 1.0
    return probs


def with_zeros(vocab: int, seed: int) -> torch.Tensor:
    probs = softmax(vocab, 2.0, seed)
    probs[::3] = 0.0
    return probs / probs.sum()


DISTRIBUTIONS = {
    "one-hot-first": lambda: one_hot(50, 0),
    "one-hot-last-qwen": lambda: one_hot(QWEN_VOCAB, QWEN_VOCAB - 1),
    "uniform": lambda: torch.full((64,), 1 / 64),
    "uniform-qwen": lambda: torch.full((QWEN_VOCAB,), 1 / QWEN_VOCAB),
    "peaked-qwen": lambda: softmax(QWEN_VOCAB, 6.0, 0),
    "flat-qwen": lambda: softmax(QWEN_VOCAB, 1.0, 1),
    "zeros": lambda: with_zeros(200, 2),
    "two-tokens": lambda: torch.tensor([0.0, 0.3, 0.0, 0.7]),
    "vocab-1": lambda: torch.ones(1),
    "vocab-2": lambda: torch.tensor([0.5, 0.5]),
    "unnormalized": lambda: torch.tensor([2.0, 1.0, 1.0, 0.0, 4.0]),
}


@pytest.mark.parametrize("name", CODEC_NAMES)
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_round_trip_is_exact_and_within_bound(name, dist):
    codec = make_codec(name)
    probs = DISTRIBUTIONS[dist]()
    vocab = probs.shape[0]
    data = codec.encode(probs)
    decoded = codec.decode(data, vocab)
    sent = codec.transmitted_probs(probs)
    assert decoded.dtype == torch.float32 and decoded.shape == (vocab,)
    assert torch.equal(decoded, sent)
    assert len(data) == math.ceil(codec.bits(probs) / 8)
    assert (sent >= 0).all()
    if name != "identity":  # identity passes the values through unnormalized
        assert abs(float(sent.double().sum()) - 1) < 1e-5
    assert tv_distance(probs, sent) <= codec.tv_bound(probs)


@pytest.mark.parametrize("name", CODEC_NAMES)
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_encode_sent_is_encode_and_transmitted_probs(name, dist):
    """The one-pass form a drafter uses gives the same bytes and the same probs; its support
    (sparse codecs) holds every id the sent probs give mass to, and the receiver's
    `decode_sent` gives back the same probs and the same support."""
    probs = DISTRIBUTIONS[dist]()
    payload, sent, support = make_codec(name).encode_sent(probs)
    codec = make_codec(name)
    assert payload == codec.encode(probs)
    expected = codec.transmitted_probs(probs)
    assert sent.dtype == expected.dtype and torch.equal(sent, expected)
    decoded, decoded_support = codec.decode_sent(payload, probs.shape[0])
    assert torch.equal(decoded, expected)
    if name in ("top-k", "top-p"):
        outside = torch.ones_like(sent, dtype=torch.bool)
        outside[torch.from_numpy(support)] = False
        assert not sent[outside].any()
        assert sorted(support.tolist()) == sorted(decoded_support.tolist())
    else:
        assert support is None and decoded_support is None


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_small_parameters_round_trip(name):
    codec = make_codec(name, **SMALL_PARAMS.get(name, {}))
    for seed in range(20):
        probs = softmax(int(3 + seed * 7), 0.5 + seed / 4, seed)
        assert torch.equal(
            codec.decode(codec.encode(probs), probs.shape[0]), codec.transmitted_probs(probs)
        )
        assert tv_distance(probs, codec.transmitted_probs(probs)) <= codec.tv_bound(probs)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_batched_transmitted_probs_equal_rows(name):
    codec = make_codec(name)
    batch = torch.stack([softmax(300, 3.0, seed) for seed in range(3)])  # [batch, vocab]
    sent = codec.transmitted_probs(batch)
    assert sent.shape == batch.shape
    for row in range(3):
        assert torch.equal(sent[row], codec.transmitted_probs(batch[row]))


def test_identity_is_exact_and_dense_error_is_small_but_nonzero():
    probs = softmax(QWEN_VOCAB, 4.0, 3)
    assert torch.equal(make_codec("identity").transmitted_probs(probs), probs)
    dense = DenseCodec()
    error = tv_distance(probs, dense.transmitted_probs(probs))
    assert 0 < error <= dense.tv_bound(probs) < 0.01
    assert len(dense.encode(probs)) == 2 * QWEN_VOCAB


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.0625, 0.375, 0.3125, 0.15625, 0.09375])  # exact binary fractions
    codec = TopPCodec(p=0.8)
    kept = torch.nonzero(codec.transmitted_probs(probs)).flatten().tolist()
    assert kept == [1, 2, 3]  # 0.6875 < 0.8 <= 0.84375
    assert TopPCodec(p=0.6875).transmitted_probs(probs).nonzero().flatten().tolist() == [1, 2]
    assert TopPCodec(p=1.0).transmitted_probs(probs).nonzero().numel() == 5
    flat = softmax(QWEN_VOCAB, 1.0, 4)  # needs thousands of tokens: exercises the full sort
    sent = codec.transmitted_probs(flat)
    kept_ids = sent.nonzero().flatten()
    kept_mass = float(flat[kept_ids].double().sum())
    smallest_kept = float(flat[kept_ids].min())
    assert kept_mass >= 0.8 and kept_mass - smallest_kept < 0.8
    assert kept_ids.numel() > 1000


def test_sparse_selection_divides_only_what_it_keeps_and_keeps_the_same():
    """The drafter's path (`encode_sent`) passes the values and their total and divides only
    the entries it keeps: the same ids as on the normalized law, also for entries whose
    normalized value sits within an ulp or two of a candidate threshold."""
    from tandem.codecs.sparse import CANDIDATE_THRESHOLDS, sorted_head, top_k_ids, top_p_ids

    rng = np.random.default_rng(0)
    for trial in range(300):
        rest = rng.random(3000) * 10.0 ** rng.uniform(-9, -5)
        threshold = CANDIDATE_THRESHOLDS[trial % len(CANDIDATE_THRESHOLDS)]
        count = int(rng.integers(1, 6))
        edge = threshold * rest.sum() / (1 - count * threshold)  # normalized: about threshold
        near = [np.nextafter(edge, edge * (1 + step)) if step else edge for step in (-1, 0, 1)]
        special = rng.choice(near, size=count)
        big = rng.random(int(rng.integers(0, 4))) * 0.01
        values = rng.permutation(np.concatenate([rest, special, big]))
        total = values.sum()
        normalized = values / total
        for p in (0.3, 0.8, 0.999):
            assert np.array_equal(top_p_ids(values, p, total=total), top_p_ids(normalized, p))
        for k in (1, 3, 50):
            assert np.array_equal(top_k_ids(values, k, total=total), top_k_ids(normalized, k))
        assert np.array_equal(
            sorted_head(values, count=count, total=total), sorted_head(normalized, count=count)
        )


def test_top_p_on_float32_laws_takes_the_top_token_alone_as_the_sort_would():
    """A float32 law whose most probable token alone reaches p skips the sort: the same ids
    as the sorted path on the same values widened to float64 (ties at the top: the lowest
    id), also when the top token's normalized value sits an ulp either side of p."""
    from tandem.codecs.sparse import top_p_ids

    rng = np.random.default_rng(3)
    for trial in range(400):
        values = (rng.random(int(rng.integers(2, 3000))) * 1e-4).astype(np.float32)
        top = int(rng.integers(values.shape[0]))
        values[top] = np.float32(rng.uniform(0.2, 2.0))
        if trial % 4 == 0:  # a tie at the top: the lower id comes first
            values[int(rng.integers(values.shape[0]))] = values[top]
        total = values.sum(dtype=np.float64)
        best = float(values.max()) / total
        for p in (best, np.nextafter(best, 0.0), np.nextafter(best, 1.0), 0.5, 0.8, 0.95):
            if not 0 < p <= 1:
                continue
            assert np.array_equal(
                top_p_ids(values, p, total=total),
                top_p_ids(values.astype(np.float64), p, total=total),
            ), (trial, p)


@pytest.mark.parametrize("kept", [1, 2, 7, 63, 64, 65, 300])
def test_small_and_large_supports_pack_the_same_bits(kept, monkeypatch):
    """Up to `SMALL_SUPPORT` ids the payload is packed by BitWriter, above it with numpy's
    bit arrays: the same bytes either way, and each decoder reads the other's payload."""
    from tandem.codecs import sparse

    rng = np.random.default_rng(kept)
    ids = rng.choice(QWEN_VOCAB, size=kept, replace=False)
    ids[0] = QWEN_VOCAB - 1  # the widest id
    values = np.sort(rng.random(kept))[::-1] + 0.01
    small = sparse.encode_kept(QWEN_VOCAB, ids, values)
    small_decoded = sparse.decode_sparse_support(small, QWEN_VOCAB)
    monkeypatch.setattr(sparse, "SMALL_SUPPORT", 0)  # numpy's path for any size
    large = sparse.encode_kept(QWEN_VOCAB, ids, values)
    assert small == large and len(small) == math.ceil(18 * (kept + 1) / 8) + 2 * kept
    large_decoded = sparse.decode_sparse_support(small, QWEN_VOCAB)
    assert np.array_equal(small_decoded[1], ids) and np.array_equal(large_decoded[1], ids)
    assert torch.equal(small_decoded[0], large_decoded[0])
    padded = bytearray(small)
    if 18 * (kept + 1) % 8:  # a padding bit set is refused by both
        padded[math.ceil(18 * (kept + 1) / 8) - 1] |= 1
        for limit in (0, 64):
            monkeypatch.setattr(sparse, "SMALL_SUPPORT", limit)
            with pytest.raises(CodecError, match="padding"):
                sparse.decode_sparse_support(bytes(padded), QWEN_VOCAB)
    repeated = sparse.encode_kept(QWEN_VOCAB, np.array([5, 5]), np.array([0.5, 0.5]))
    for limit in (0, 64):  # a repeated id is refused by both
        monkeypatch.setattr(sparse, "SMALL_SUPPORT", limit)
        with pytest.raises(CodecError, match="repeated"):
            sparse.decode_sparse_support(repeated, QWEN_VOCAB)


def test_sparse_ids_near_the_top_of_qwen_vocab_survive():
    probs = torch.zeros(QWEN_VOCAB)
    top_ids = [QWEN_VOCAB - 1, QWEN_VOCAB - 2, 65_535, 65_536, 62_000, 0]
    probs[top_ids] = torch.tensor([0.3, 0.25, 0.2, 0.15, 0.06, 0.04])
    for codec in [TopKCodec(k=8), TopPCodec(p=0.99), make_codec("k-sqs", k=8)]:
        decoded = codec.decode(codec.encode(probs), QWEN_VOCAB)
        assert set(decoded.nonzero().flatten().tolist()) <= set(top_ids)
        assert decoded[QWEN_VOCAB - 1] > 0.25 and decoded[65_536] > 0.1
    payload = TopKCodec(k=8).encode(probs)
    # 18-bit ids: count + 6 ids = 126 bits -> 16 bytes, then 6 float16 values
    assert len(payload) == math.ceil(18 * 7 / 8) + 2 * 6


def test_top_k_with_k_above_the_support_sends_only_non_zero_tokens():
    probs = torch.tensor([0.0, 0.6, 0.0, 0.4])
    codec = TopKCodec(k=32)
    assert codec.bits(probs) == 2 * 3 + 16 * 2
    assert codec.decode(codec.encode(probs), 4).tolist() == pytest.approx(
        [0, 0.6, 0, 0.4], abs=1e-3
    )


def test_registry_refuses_unknown_names_and_parameters():
    with pytest.raises(TandemError):
        make_codec("gzip")
    with pytest.raises(CodecError):
        make_codec("top-p", k=3)
    with pytest.raises(CodecError):
        make_codec("top-p", p=0.0)
    with pytest.raises(CodecError):
        make_codec("k-sqs", ell=0)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_bad_probs_are_refused(name):
    codec = make_codec(name)
    for probs in [torch.zeros(5), torch.tensor([0.5, float("nan")]), torch.tensor([1.5, -0.5]),
                  torch.tensor(1.0), torch.ones(2, 2, 2)]:  # fmt: skip
        with pytest.raises(CodecError):
            codec.transmitted_probs(probs)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_truncated_extended_and_wrong_vocab_payloads_fail_cleanly(name):
    codec = make_codec(name, **SMALL_PARAMS.get(name, {}))
    probs = softmax(40, 2.0, 5)
    data = codec.encode(probs)
    for bad in [data[:-1], data + b"\x00", data + b"\xff", b""]:
        with pytest.raises(CodecError):
            codec.decode(bad, 40)
    for vocab in [0, -3, 1 << 30]:
        with pytest.raises(CodecError):
            codec.decode(data, vocab)


def check_decodes_cleanly(codec, data: bytes, vocab: int) -> None:
    try:
        decoded = codec.decode(data, vocab)
    except CodecError:
        return
    assert decoded.shape == (vocab,) and torch.isfinite(decoded).all() and (decoded >= 0).all()
    if codec.name != "identity":  # identity passes values through unnormalized
        assert abs(float(decoded.double().sum()) - 1) < 1e-5


@pytest.mark.parametrize("name", CODEC_NAMES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=64), vocab=st.integers(1, 40))
@example(data=b"\x00\x00\x00\x00\x00\x00\x01|", vocab=4)  # a signalling fp16 NaN: its sum warned
def test_random_bytes_only_raise_codec_errors(name, data, vocab):
    check_decodes_cleanly(make_codec(name, **SMALL_PARAMS.get(name, {})), data, vocab)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_mutated_payloads_only_raise_codec_errors(name):
    codec = make_codec(name, **SMALL_PARAMS.get(name, {}))
    rng = np.random.default_rng(6)
    for seed in range(40):
        vocab = int(rng.integers(1, 300))
        data = bytearray(codec.encode(softmax(vocab, 3.0, seed)))
        for _ in range(10):
            mutated = bytearray(data)
            if mutated:
                position = int(rng.integers(len(mutated)))
                mutated[position] ^= 1 << int(rng.integers(8))
            check_decodes_cleanly(codec, bytes(mutated), vocab)


def test_wire_params_name_what_the_decoder_needs():
    assert make_codec("dense").wire_params() == {}
    assert make_codec("top-p", p=0.5).wire_params() == {}  # p only matters to the sender
    assert make_codec("k-sqs", k=8, ell=64).wire_params() == {"k": 8, "ell": 64}
    assert make_codec("c-sqs", alpha=0.1, max_support=99).wire_params() == {
        "ell": 100,
        "max_support": 99,
    }


def test_normalized_fp16_of_one_value_is_the_general_formula_and_refuses_the_same_inputs():
    """One kept value (most greedy drafts) takes a shortcut: v / v. Every finite positive float16
    (subnormals included) gives what the general path's float64 division gives, and the inputs
    the general path refuses are refused with the same message."""
    from tandem.codecs.base import normalized_fp16

    bits = np.arange(1, 0x7C00, dtype=np.uint16)  # every positive finite float16
    for half in bits.view(np.float16)[::97]:
        wide = np.array([half], dtype=np.float16).astype(np.float64)
        assert (
            normalized_fp16(np.array([half])).tolist()
            == (wide / wide.sum()).astype(np.float32).tolist()
        )
        # the same value beside a zero takes the general path: the same kept number
        assert normalized_fp16(np.array([half, 0.0], dtype=np.float16))[0] == 1.0
    for bad, message in ((0.0, "all zero"), (-0.0, "all zero"), (-1.0, "negative"),
                         (np.inf, "non-finite"), (np.nan, "non-finite")):  # fmt: skip
        for values in ([bad], [bad, 0.0]):
            with pytest.raises(CodecError, match=message):
                normalized_fp16(np.array(values, dtype=np.float16))


def _certain_cases(vocab: int, rows: int, seed: int) -> list[torch.Tensor]:
    """float32 logit rows from flat to very peaked (scaled normals, a boosted top)."""
    generator = torch.Generator().manual_seed(seed)
    cases = []
    for i in range(rows):
        logits = torch.randn(vocab, generator=generator) * (0.5 + 4 * (i % 5))
        logits[int(torch.randint(0, vocab, (1,), generator=generator))] += 2.0 * (i % 7)
        cases.append(logits.float())
    return cases


@pytest.mark.parametrize("vocab", [2, 7, 1000, QWEN_VOCAB])
def test_softmax_single_id_is_what_top_p_keeps_whenever_it_answers(vocab):
    """On float32 softmax rows, and on the same rows scaled anywhere within the sum bound (the
    only thing the shortcut assumes of a softmax), an id it returns is the one id top-p keeps
    with the row's float64 total (the general path); and it answers on peaked rows."""
    codec = sparse.TopPCodec(p=0.8)
    bound = sparse.softmax_sum_bound(vocab)
    answered = 0
    for logits in _certain_cases(vocab, 120, seed=vocab):
        probs = torch.softmax(logits, dim=-1)
        assert abs(float(probs.double().sum()) - 1) <= bound  # what the bound claims
        for scale in (1.0, 1 - 0.999 * bound, 1 + 0.999 * bound):
            row = (probs.double() * scale).float()
            best = sparse.softmax_single_id(row.numpy(), 0.8)
            if best is not None:
                answered += 1
                _, ids, values = codec.encode_kept_sent(row)
                assert ids.tolist() == [best] and values.tolist() == [1.0]
                payload, single_ids, single_values = codec.softmax_kept(row)
                assert single_ids.tolist() == [best] and single_values.tolist() == [1.0]
                assert torch.equal(codec.decode(payload, vocab), codec.transmitted_probs(row))
    assert answered >= 10


def test_softmax_single_id_refuses_what_it_cannot_prove():
    bound = sparse.softmax_sum_bound(QWEN_VOCAB)
    assert 0.009 < bound < 0.0095
    assert sparse.softmax_sum_bound(1 << 24) == math.inf  # never for such a vocabulary
    row = np.zeros(QWEN_VOCAB, dtype=np.float32)
    row[[3, 9]] = 0.8 * (1 + bound) * 1.0001, 0.1
    assert sparse.softmax_single_id(row, 0.8) == 3
    row[3] = 0.8 * (1 + bound) * 0.9999  # inside the margin: the general path decides
    assert sparse.softmax_single_id(row, 0.8) is None
    row[5] = math.nan
    assert sparse.softmax_single_id(row, 0.8) is None


def test_kept_form_is_the_sent_probs_at_the_kept_ids():
    """`encode_kept_sent` / `decode_kept` hold the numbers `encode_sent` / `decode_sent` put in
    their [vocab] arrays, at the kept ids, with the same payload."""
    for name in ("top-p", "top-k"):
        codec = make_codec(name)
        for logits in _certain_cases(500, 40, seed=7):
            probs = torch.softmax(logits, dim=-1)
            sent = codec.encode_sent(probs)
            payload, ids, values = codec.encode_kept_sent(probs)
            assert payload == sent.payload and ids.tolist() == sent.support.tolist()
            assert torch.equal(torch.from_numpy(sparse.sent_array(500, ids, values)), sent.probs)
            got_ids, got_values = codec.decode_kept(payload, 500)
            assert got_ids.tolist() == ids.tolist() and got_values.tolist() == values.tolist()
