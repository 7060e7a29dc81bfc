"""`split_rows` is the inverse of `stack`: each split row continues decoding as the original
single-row state would (same greedy tokens, logits equal up to float rounding)."""

from __future__ import annotations

import torch

PROMPTS = [[5, 6, 7, 8, 9, 10], [65, 66], [1, 2, 3], [100] * 9]


def greedy_continue(lm, state, steps: int) -> tuple[list[int], torch.Tensor]:
    tokens, rows = [], []
    for _ in range(steps):
        token = int(state.logits[0].argmax())
        tokens.append(token)
        rows.append(lm.decode(state, [token])[0, -1])
    return tokens, torch.stack(rows)


def test_split_of_stack_continues_like_the_originals(tiny_lm):
    originals = [tiny_lm.prefill(p) for p in PROMPTS]
    stacked = tiny_lm.stack([tiny_lm.prefill(p) for p in PROMPTS])
    tiny_lm.decode(stacked, torch.tensor([[42, 43]] * len(PROMPTS)))  # a batched step first
    for state in originals:
        tiny_lm.decode(state, [42, 43])
    rows = tiny_lm.split_rows(stacked)
    assert len(rows) == len(PROMPTS)
    for prompt, row, original in zip(PROMPTS, rows, originals, strict=True):
        assert row.pads == [0] and row.row_ids(0) == prompt + [42, 43]
        assert row.seq_len == original.seq_len
        torch.testing.assert_close(row.logits, original.logits, rtol=1e-4, atol=1e-4)
        want_tokens, want_rows = greedy_continue(tiny_lm, original, 6)
        got_tokens, got_rows = greedy_continue(tiny_lm, row, 6)
        assert got_tokens == want_tokens
        torch.testing.assert_close(got_rows, want_rows, rtol=1e-4, atol=1e-4)


def test_split_rows_copy_the_state_and_allow_rollback(tiny_lm):
    stacked = tiny_lm.stack([tiny_lm.prefill(p) for p in PROMPTS[:2]])
    logits = tiny_lm.decode(stacked, torch.tensor([[7, 8, 9], [7, 8, 9]]))
    first, second = tiny_lm.split_rows(stacked)
    tiny_lm.crop(second, second.seq_len - 2)  # drop 8, 9 from the second row only
    torch.testing.assert_close(second.logits, logits[1:2, 0])
    assert second.row_ids(0) == PROMPTS[1] + [7] and first.row_ids(0) == PROMPTS[0] + [7, 8, 9]
    assert stacked.seq_len == len(PROMPTS[0]) + 3  # the batched state is untouched
