"""The emulated model (tandem.models.emulated.SleepLM): a forward pass takes its calibrated time
in all, the logits' computation included; a cancel stops it and changes nothing."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tandem.models.base import Cancelled
from tandem.models.emulated import SleepLM


class SlowRows(SleepLM):
    """Computing one row takes `row_s` (as if the emulator's own work were slow)."""

    row_s = 0.1

    def row(self, context):
        time.sleep(self.row_s)
        return super().row(context)


def test_a_pass_takes_its_calibration_in_all_the_logits_included():
    lm = SlowRows("slow", base_s=0.25, per_token_s=0.0, prefill_s=0.25)
    start = time.perf_counter()
    state = lm.prefill([1, 2, 3])
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    logits = lm.decode(state, [4])
    decode_s = time.perf_counter() - start
    # 0.25 s each; computing the row inside it (0.1 s) must not add to it (0.35 s before)
    assert 0.25 <= prefill_s < 0.33 and 0.25 <= decode_s < 0.33
    assert torch.equal(
        logits[0, -1], SleepLM("slow", base_s=0, per_token_s=0, prefill_s=0).row((1, 2, 3, 4))
    )


def test_a_cancelled_pass_raises_and_leaves_the_state_as_it_was():
    lm = SleepLM("lm", base_s=5.0, per_token_s=0.0, prefill_s=0.0)
    state = lm.prefill([1, 2])
    cancel = threading.Event()
    threading.Timer(0.05, cancel.set).start()
    start = time.perf_counter()
    with pytest.raises(Cancelled):
        lm.decode(state, [3], cancel=cancel)
    assert time.perf_counter() - start < 2.0 and state.ids == [1, 2]
