"""Contract tests every CausalLM backend must pass: the tiny model (transformers) always; the
real 0.5B on transformers fp32 and on llama.cpp marked slow.

Tolerances: transformers fp32 reassociates sums with the shape of a call (measured up to 1e-4
on the 0.5B model between a 1-token and a 7-token pass). llama.cpp's kernels differ more with
the number of tokens in a call (max |logit difference| measured 0.3-0.74, docs/backends.md):
for it "equal" means within BATCH_SHAPE_ERROR and the same argmax wherever the top-2 margin
is larger than twice that, not a loosened tolerance everywhere.
"""

from __future__ import annotations

import threading

import pytest
import torch

from tandem.models.base import Cancelled, CausalLM

ATOL = 5e-4  # transformers


def same(lm, a: torch.Tensor, b: torch.Tensor) -> bool:
    if getattr(lm, "backend", "hf") != "llamacpp":
        return torch.allclose(a, b, atol=ATOL)
    from tandem.models.llamacpp import BATCH_SHAPE_ERROR

    if (a - b).abs().max() > BATCH_SHAPE_ERROR:
        return False
    top = b.topk(2, dim=-1).values
    clear = (top[..., 0] - top[..., 1]) > 2 * BATCH_SHAPE_ERROR  # not a near-tie
    return bool((a.argmax(-1) == b.argmax(-1))[clear].all())


FIXTURES = {"tiny": "tiny_lm", "hf": "real_hf_lm", "llamacpp": "real_lm"}


@pytest.fixture(
    params=[
        "tiny",
        pytest.param("hf", marks=pytest.mark.slow),
        pytest.param("llamacpp", marks=pytest.mark.slow),
    ]
)
def lm(request) -> CausalLM:
    return request.getfixturevalue(FIXTURES[request.param])


def _hf_only(lm) -> None:
    if getattr(lm, "backend", "hf") != "hf":
        pytest.skip("transformers internals (layer hooks, model.generate)")


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
    assert same(lm, torch.stack(steps), full[2:])


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
    assert same(lm, after_crop, without)
    assert state.row_ids(0) == fresh.row_ids(0)


def test_crop_inside_last_block_restores_logits(lm):
    ids = _prompt(lm)
    state = lm.prefill(ids)
    block = lm.decode(state, [5, 6, 7])
    lm.rollback(state, 1)
    assert torch.allclose(state.logits, block[:, 1], atol=0)
    lm.crop(state, len(ids))  # back to the prompt: before the block, logits not kept
    assert state.logits is None or same(lm, state.logits, block[:, 0])


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
        assert same(lm, first[row], alone.logits[0])
        alone_step = lm.decode(alone, [7, 8])
        assert same(lm, step[row], alone_step[0])
        assert batched.row_ids(row) == ids + [7, 8]


def test_stack_equals_batched_prefill(lm):
    prompts = [_prompt(lm, t) for t in ("import os", "def f():\n    pass")]
    stacked = lm.stack([lm.prefill(p) for p in prompts])
    batched = lm.prefill(prompts)
    assert stacked.pads == batched.pads
    assert same(lm, lm.decode(stacked, [[3]] * 2), lm.decode(batched, [[3]] * 2))


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
    _hf_only(lm)
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
    assert same(lm, resumed, lm.decode(fresh, [4, 5]))


def test_save_load_state_round_trip(lm, tmp_path):
    ids = _prompt(lm)
    state = lm.prefill(ids)
    lm.save_state(state, tmp_path / "kv.safetensors")
    loaded = lm.load_state(tmp_path / "kv.safetensors")
    assert torch.allclose(loaded.logits, state.logits, atol=1e-6)
    assert torch.allclose(lm.decode(loaded, [9, 10]), lm.decode(state, [9, 10]), atol=1e-5)


def test_greedy_matches_transformers_generate(lm):
    _hf_only(lm)
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


class SetAfter(threading.Event):
    """An event that reads as set from its n-th check on: llama.cpp checks it between graph
    nodes, so the decode aborts in the middle of its graph, deterministically."""

    def __init__(self, checks: int):
        super().__init__()
        self.checks, self.left = 0, checks

    def is_set(self) -> bool:
        self.checks += 1
        self.left -= 1
        return self.left < 0


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.8])
def test_llamacpp_cancel_mid_graph_leaves_state_unchanged(real_lm, fraction):
    """A decode of two llama_decode chunks, aborted at its first check, in the first chunk and
    in the second one; then decoding goes on exactly as if it never started."""
    lm = real_lm
    ids = _prompt(lm)
    tokens = list(range(1000, 1700))  # two llama_decode chunks
    counter = SetAfter(10**9)
    lm.decode(lm.prefill(ids), tokens, cancel=counter)  # how many checks a whole run makes
    state = lm.prefill(ids)
    before = state.logits.clone()
    event = SetAfter(int(counter.checks * fraction))
    with pytest.raises(Cancelled):
        lm.decode(state, tokens, cancel=event)
    assert event.checks == int(counter.checks * fraction) + 1  # aborted at the first "set"
    assert state.seq_len == len(ids) and torch.equal(state.logits, before)
    resumed = lm.decode(state, [4, 5])
    assert same(lm, resumed, lm.decode(lm.prefill(ids), [4, 5]))


@pytest.mark.slow
def test_llamacpp_cancel_event_aborts_a_running_decode(real_lm):
    """A CancelEvent set from another thread stops a long decode (the GIL-free abort path)."""
    from tandem.models.base import CancelEvent

    lm = real_lm
    ids = _prompt(lm)
    state = lm.prefill(ids)
    event = CancelEvent()
    timer = threading.Timer(0.05, event.set)
    timer.start()
    try:
        with pytest.raises(Cancelled):
            lm.decode(state, list(range(1000, 3000)), cancel=event)  # seconds of work
    finally:
        timer.cancel()
    assert state.seq_len == len(ids)
    assert same(lm, lm.decode(state, [4])[0], lm.decode(lm.prefill(ids), [4])[0])


@pytest.mark.slow
def test_llamacpp_rows_are_freed_with_their_states(real_lm):
    import gc

    lm = real_lm
    for _ in range(3 * lm.n_seq_max):  # more states than sequences over time, few at once
        lm.decode(lm.prefill([1, 2, 3]), [4])
    gc.collect()
    live = [lm.prefill([1, 2, 3]) for _ in range(lm.n_seq_max - 8)]
    assert len({s.cache.seqs[0] for s in live}) == len(live)


@pytest.mark.slow
def test_llamacpp_free_gives_the_cells_back_now_and_a_fresh_layout(real_lm):
    """A state still referenced (as a traceback can keep one) is freed by `free`: its seqs are
    empty and free again, and the next prefill lies where it would on an empty cache, so its
    one-token steps give the logits of the same steps run on an empty cache bit for bit."""
    import gc

    lm, prompt = real_lm, list(range(100, 160))
    gc.collect()

    def steps(n=12):
        state = lm.prefill(prompt)
        rows = [state.logits[0].clone()]
        for token in range(200, 200 + n):
            rows.append(lm.decode(state, [token])[0, -1].clone())
        return state, torch.stack(rows)

    first, fresh = steps()
    (seq,) = first.cache.seqs
    lm.free(first)  # first is still referenced here
    assert first.cache.seqs == [] and seq in lm._free
    assert lm._lib.llama_memory_seq_pos_max(lm._mem, seq) == -1  # no cell holds it
    second, again = steps()
    assert torch.equal(again, fresh)
    lm.free(first)  # freeing twice is harmless
    lm.free(second)


@pytest.mark.slow
def test_llamacpp_extend_keeps_only_the_last_logits_of_a_decode(real_lm):
    """`extend` = `decode` without the vocab projection of all but each row's last position:
    the same state afterwards, last logits within the batch-shape tolerance (NUMERICS)."""
    from tandem.models.llamacpp import BATCH_SHAPE_ERROR

    lm = real_lm
    ids = [_prompt(lm), _prompt(lm, "import os\nprint(")]
    suffix = [_prompt(lm, " the sum of a and b")] * 2
    full, last = lm.prefill(ids), lm.prefill(ids)
    expected = lm.decode(full, suffix)[:, -1]  # [2, vocab]
    got = lm.extend(last, suffix)
    assert got.shape == (2, lm.vocab_size) and last.recent_logits is None
    assert torch.equal(last.ids, full.ids) and last.lengths == full.lengths
    assert (got - expected).abs().max() <= BATCH_SHAPE_ERROR
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    after, reference = lm.decode(last, [[7], [7]])[:, -1], lm.decode(full, [[7], [7]])[:, -1]
    assert (after - reference).abs().max() <= BATCH_SHAPE_ERROR  # the KV cache is the same


@pytest.mark.slow
def test_llamacpp_evict_matches_the_transformers_streaming_cache(real_lm, real_hf_lm):
    """evict() drops positions and shifts the later ones down (StreamingLLM's cache, RoPE
    re-rotated by llama.cpp); the transformers reference is compress_cache(), which re-rotates
    the kept keys itself. Same kept tokens, same next token, logits as close as the engines."""
    from tandem.baselines.rapid_baselines import compress_cache

    text = "import os\nimport sys\n\n\ndef main():\n    print(os.getcwd(), sys.argv)\n"
    ids = _prompt(real_lm, text * 2)
    sink, window = 4, len(ids) - 12
    state, ref = real_lm.prefill(ids), real_hf_lm.prefill(ids)
    assert compress_cache(real_lm, state, sink=sink, window=window) == 8
    assert compress_cache(real_hf_lm, ref, sink=sink, window=window) == 8
    assert state.row_ids(0) == ref.row_ids(0) == ids[:sink] + ids[sink + 8 :]
    shifted = real_lm.decode(state, [11])[0, -1]
    expected = real_hf_lm.decode(ref, [11])[0, -1]
    assert int(shifted.argmax()) == int(expected.argmax())
    assert torch.nn.functional.cosine_similarity(shifted, expected, dim=0).item() > 0.99


@pytest.mark.slow
def test_llamacpp_evict_on_a_row_sharing_its_cells_leaves_the_other_row_alone(real_lm):
    """`stack` copies a row by sharing its cells; a cell has one position for all its rows, so
    an eviction that shifted the shared cells in place would move the original row too (the
    StreamingLLM drafter reads a copy of the target's long prompt; shifting the shared cells
    in place made the copy's next llama_decode fail, status -1). The original decodes as
    before, and the evicted copy as an evicted row that shared nothing."""
    from tandem.baselines.rapid_baselines import compress_cache

    text = "import os\nimport sys\n\n\ndef main():\n    print(os.getcwd(), sys.argv)\n"
    ids = _prompt(real_lm, text * 3)
    sink, window = 4, 20
    state = real_lm.prefill(ids)
    before = real_lm.decode(real_lm.stack([state]), [11])[0, -1]
    shared = real_lm.stack([state])
    assert compress_cache(real_lm, shared, sink=sink, window=window) == len(ids) - sink - window
    alone = real_lm.prefill(ids)
    compress_cache(real_lm, alone, sink=sink, window=window)
    after = real_lm.decode(real_lm.stack([state]), [11])[0, -1]
    assert torch.allclose(after, before, atol=1e-3)
    assert state.row_ids(0) == ids
    evicted, reference = real_lm.decode(shared, [11])[0, -1], real_lm.decode(alone, [11])[0, -1]
    # the same kept tokens in other cells: equal up to the order of the sums (measured ~0.05)
    assert int(evicted.argmax()) == int(reference.argmax())
    assert torch.nn.functional.cosine_similarity(evicted, reference, dim=0).item() > 0.999


@pytest.mark.slow
def test_llamacpp_and_hf_agree(real_lm, real_hf_lm):
    """Same GGUF, two engines: same tokenizer and vocab (the handshake's check), next-token
    logits close (llama.cpp keeps Q4_K weights and quantizes activations; transformers
    dequantizes to fp32), and the same greedy tokens on a short prompt."""
    assert real_lm.tokenizer.fingerprint == real_hf_lm.tokenizer.fingerprint
    assert real_lm.vocab_size == real_hf_lm.vocab_size
    assert real_lm.fingerprint != real_hf_lm.fingerprint  # their KV caches are not interchangeable
    ids = _prompt(real_lm)
    a, b = real_lm.prefill(ids), real_hf_lm.prefill(ids)
    assert int(a.logits.argmax()) == int(b.logits.argmax())
    assert torch.nn.functional.cosine_similarity(a.logits, b.logits).item() > 0.99
