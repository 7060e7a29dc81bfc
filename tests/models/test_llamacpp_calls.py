"""Small llama.cpp calls fed one token at a time where that is cheaper (`split_calls`,
tandem/models/llamacpp.py "Small calls"): the setting, its calibration and cache, and that a
split call is computed as one-token steps compute it."""

from __future__ import annotations

import types

import pytest
import torch

from tandem.errors import TandemError


def test_the_split_setting_is_a_count_or_auto(monkeypatch):
    from tandem.models import llamacpp

    monkeypatch.setattr(llamacpp, "calibrated_split", lambda lm: 7)
    lm = object()
    monkeypatch.delenv("TANDEM_LLAMA_SPLIT", raising=False)
    assert llamacpp._split_setting(lm, None) == 7  # measured (here: stubbed)
    assert llamacpp._split_setting(lm, 0) == 0 and llamacpp._split_setting(lm, 3) == 3
    monkeypatch.setenv("TANDEM_LLAMA_SPLIT", "2")
    assert llamacpp._split_setting(lm, None) == 2 and llamacpp._split_setting(lm, 0) == 0
    monkeypatch.setenv("TANDEM_LLAMA_SPLIT", "auto")
    assert llamacpp._split_setting(lm, None) == 7
    for bad in ("-1", "three", ""):
        monkeypatch.setenv("TANDEM_LLAMA_SPLIT", bad)
        with pytest.raises(TandemError, match="TANDEM_LLAMA_SPLIT must be 'auto' or a token"):
            llamacpp._split_setting(lm, None)


def test_a_split_timed_while_the_cores_were_busy_is_timed_again_by_the_next_processes(
    monkeypatch, tmp_path
):
    import json

    from tandem.models import llamacpp

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    lib = types.SimpleNamespace(llama_print_system_info=lambda: b"CPU : AVX2 = 1")
    lm = types.SimpleNamespace(_lib=lib, fingerprint="f", threads=1, flash_attn=False, name="m")
    busy = llamacpp.SPLIT_DISTURBED * 10

    def measured(*timings):  # (split, share of the time spent waiting for a core) per timing
        calls = iter(timings)

        def measure(lm):
            split, waited = next(calls)  # StopIteration: timed once more than expected
            return split, {"1": 20.0, "2": 70.0}, waited

        monkeypatch.setattr(llamacpp, "_measure_split", measure)

    def new_process():
        monkeypatch.setattr(llamacpp, "_SPLITS_TIMED", {})

    def record():
        (path,) = (tmp_path / "calibration").glob("split-*.json")
        return json.loads(path.read_text())

    def new_box():  # an empty cache, and a new process
        for path in (tmp_path / "calibration").glob("split-*.json"):
            path.unlink()
        new_process()

    new_process()
    measured((2, busy))  # busy: used, and cached as disturbed
    assert llamacpp.calibrated_split(lm) == 2 and record()["disturbed"] == 1
    measured()  # the same process does not time it again
    assert llamacpp.calibrated_split(lm) == 2
    for n in range(2, llamacpp.SPLIT_TRIES + 1):  # the next processes do, one timing each
        new_process()
        measured((n, busy))
        assert llamacpp.calibrated_split(lm) == n and record()["disturbed"] == n
    new_process()
    measured()  # disturbed SPLIT_TRIES times: the last timing stands
    assert llamacpp.calibrated_split(lm) == llamacpp.SPLIT_TRIES

    new_box()
    measured((2, busy))
    assert llamacpp.calibrated_split(lm) == 2
    new_process()
    measured((3, 0.0))  # a quiet timing replaces a disturbed one, and stands
    assert llamacpp.calibrated_split(lm) == 3 and record()["disturbed"] == 0
    assert record()["waited"] == 0.0 and record()["ms"] == {"1": 20.0, "2": 70.0}
    new_process()
    measured()
    assert llamacpp.calibrated_split(lm) == 3

    new_box()
    measured((2, None))  # a kernel that cannot tell: its one timing stands, as before
    assert llamacpp.calibrated_split(lm) == 2 and record()["waited"] is None
    new_process()
    measured()
    assert llamacpp.calibrated_split(lm) == 2

    new_box()
    monkeypatch.setattr(llamacpp, "_measure_split", lambda lm: (0, {}, None))
    assert llamacpp.calibrated_split(lm) == 0  # no scratch context: nothing timed, no file
    assert list((tmp_path / "calibration").glob("split-*.json")) == []


def test_the_queue_wait_of_this_process_is_read_from_the_kernel():
    from tandem.models import llamacpp

    first = llamacpp._queue_wait_s()
    assert first is not None and first >= 0.0  # Linux: /proc/self/task/*/schedstat
    assert llamacpp._queue_wait_s() >= first


class CountingLib:
    """llama-cpp-python's module, with the token count of every `llama_decode` recorded."""

    def __init__(self, lib):
        self._lib, self.calls = lib, []

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def llama_decode(self, ctx, batch):
        self.calls.append(int(batch.n_tokens))
        return self._lib.llama_decode(ctx, batch)


@pytest.mark.slow
def test_a_split_call_is_fed_one_token_at_a_time_as_one_token_steps_are(real_lm, monkeypatch):
    lm, prompt = real_lm, list(range(100, 160))
    counting = CountingLib(lm._lib)
    monkeypatch.setattr(lm, "_lib", counting)
    monkeypatch.setattr(lm, "split_calls", 3)

    def run(blocks):
        state = lm.prefill(prompt)
        counting.calls.clear()
        out = torch.cat([lm.decode(state, [block])[0] for block in blocks])
        lm.free(state)  # the next run's rows lie where these did (a fresh layout)
        return out, list(counting.calls)

    steps, calls = run([[200], [201], [202], [203], [204]])
    assert calls == [1, 1, 1, 1, 1]
    split, calls = run([[200, 201], [202, 203, 204]])
    assert calls == [1, 1, 1, 1, 1]  # blocks of 2 and 3 tokens: one token per call
    assert torch.equal(split, steps)  # bit for bit what one-token steps give
    _, calls = run([[200, 201, 202, 203], [204]])
    assert calls == [4, 1]  # above split_calls: one call


@pytest.mark.slow
def test_the_split_is_measured_once_per_box_and_read_back(real_lm, monkeypatch, tmp_path):
    from tandem.models import llamacpp

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    monkeypatch.setattr(llamacpp, "_SPLITS_TIMED", {})  # as a new process: nothing timed yet
    split = llamacpp.calibrated_split(real_lm)
    (saved,) = (tmp_path / "calibration").glob("split-*.json")
    record = __import__("json").loads(saved.read_text())
    ms = {int(k): v for k, v in record["ms"].items()}
    assert record["split_calls"] == split and record["threads"] == real_lm.threads
    rule = [k for k in llamacpp.SPLIT_SIZES if k in ms]  # the sizes timed, in order
    expected = 0
    for k in rule:  # the largest k whose every size up to it costs more than its steps
        if ms[k] <= llamacpp.SPLIT_MARGIN * k * ms[1]:
            break
        expected = k
    assert split == expected and rule == list(llamacpp.SPLIT_SIZES[: len(rule)])
    monkeypatch.setattr(llamacpp, "_measure_split", types.SimpleNamespace)  # must not run
    llamacpp._SPLITS_TIMED.clear()  # another process: reads the file
    assert llamacpp.calibrated_split(real_lm) == split
