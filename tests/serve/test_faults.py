"""Fault suite: the cloud's connection is reset at a random committed token, in every mode with
a cloud (stop-and-wait, PicoSpec's async pipeline, SQS uplink, cloud AR, RAPID, DRAGON).

Each trial is one greedy request through the serving backend (what `tandem device serve` and
`tandem device run` call), with a relay in front of the cloud that resets both sockets when the
device has streamed k tokens (k uniform over the answer), as a SIGKILLed cloud would. Checked
every trial: what was streamed is exactly the result (nothing repeated, nothing lost); the
tokens before the fault are the cloud-assisted answer's; the tokens after are the device
model's own greedy continuation of them (its own documents for DRAGON); the answer runs to
its budget or eos; the result says it fell back and where. The relay comes back at once, so
the next trial also checks that a cloud that returns is used again.
"""

from __future__ import annotations

import os
import random

import pytest

from tandem.config import SamplingConfig
from tandem.protocols.local import generate
from tandem.serve.api.backends import GenParams
from tandem.serve.api.server import build_backend, device_transport_for
from tandem.serve.settings import DeviceServeSettings

from .api.helpers import SECRET, CloudThread, RapidCloudThread
from .fault_relay import FaultRelay

TRIALS = int(os.environ.get("TANDEM_FAULT_TRIALS", "200"))  # per mode
N = 16
PROMPT = "class Stack:\n"
CONTEXT = "The deploy key rotates every Tuesday. Backups run at 02:00 UTC."

SPEC_MODES = {
    "stop-and-wait": {"mode": "spec", "pipeline": "sync"},
    "picospec": {"mode": "spec", "pipeline": "async"},
    "sqs": {"mode": "spec", "pipeline": "async", "codec": "k-sqs", "codec_params": {"k": 8}},
    "cloud-ar": {"mode": "ar"},
}


@pytest.fixture(scope="module")
def cloud(tiny_lm_b):
    server = CloudThread(tiny_lm_b)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rapid_cloud(tiny_lm_b):
    cloud = RapidCloudThread(tiny_lm_b, CONTEXT * 4)
    yield cloud.port
    cloud.stop()


def device_alone(lm, prompt_ids: list[int], prefix: list[int], n: int) -> list[int]:
    """The device model's greedy continuation of prompt + prefix (what a fallback must add)."""
    left = n - len(prefix)
    eos = lm.tokenizer.eos_token_id
    if left <= 0 or (prefix and prefix[-1] == eos):
        return []
    config = SamplingConfig(temperature=0.0, seed=len(prefix), max_new_tokens=left)
    return generate(lm, [*prompt_ids, *prefix], config).tokens


def run_trials(backend, relay, prompt_ids, params, alone_prompt, *, check_rest=True):
    """TRIALS faulted requests against one no-fault reference; returns how many fell back."""
    lm = backend.lm
    eos = lm.tokenizer.eos_token_id
    reference = backend.generate(prompt_ids, params, lambda _t: None)
    assert not reference.degraded, reference.degraded_reason
    assert len(reference.tokens) >= 4, "the reference answer is too short to cut"
    rng = random.Random(1234)
    fell_back = 0
    for trial in range(TRIALS):
        k = rng.randrange(1, len(reference.tokens))
        streamed: list[int] = []

        def on_token(token: int, _k=k, _streamed=streamed) -> None:
            _streamed.append(token)
            if len(_streamed) == _k:
                relay.cut(stay_down=False)  # reset now; the cloud is back for the next trial

        result = backend.generate(prompt_ids, params, on_token)
        where = f"trial {trial}, cut at token {k}"
        assert streamed == result.tokens, f"{where}: stream and result differ"
        assert len(result.tokens) == params.max_tokens or result.tokens[-1] == eos, where
        if not result.degraded:  # the answer was complete before the reset took effect
            assert result.tokens == reference.tokens, where
            continue
        fell_back += 1
        at = result.degraded_at
        assert k <= at <= len(result.tokens), f"{where}: fell back at {at}"
        assert result.degraded_reason, where
        assert result.tokens[:at] == reference.tokens[:at], f"{where}: the prefix changed"
        if check_rest:
            rest = device_alone(lm, alone_prompt, result.tokens[:at], params.max_tokens)
            assert result.tokens[at:] == rest, f"{where}: the continuation is not the device's"
        assert result.finish_reason == ("eos" if result.tokens[-1] == eos else "length"), where
    return fell_back


def assert_most_fell_back(fell_back: int) -> None:
    # a reset after the last token has nothing to interrupt; most resets land mid-answer
    assert fell_back >= TRIALS // 2, f"only {fell_back}/{TRIALS} trials fell back"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SPEC_MODES))
def test_cloud_reset_at_a_random_token_loses_nothing(name, tiny_lm, cloud, one_torch_thread):
    relay = FaultRelay(cloud.port)
    try:
        settings = DeviceServeSettings(
            model=tiny_lm.name, cloud=f"127.0.0.1:{relay.port}", **SPEC_MODES[name]
        )
        backend = build_backend(settings, tiny_lm, secret=SECRET)
        ids = tiny_lm.tokenizer.encode(PROMPT)
        params = GenParams(max_tokens=N, temperature=0.0)
        assert_most_fell_back(run_trials(backend, relay, ids, params, ids))
    finally:
        relay.close()


@pytest.mark.slow
def test_rapid_cloud_reset_loses_nothing(tiny_lm, rapid_cloud, one_torch_thread):
    relay = FaultRelay(rapid_cloud)
    try:
        settings = DeviceServeSettings(
            model=tiny_lm.name, mode="rapid", cloud=f"127.0.0.1:{relay.port}"
        )
        backend = build_backend(settings, tiny_lm, secret=SECRET)
        params = GenParams(max_tokens=N, temperature=0.0, question="When do backups run?",
                           context=CONTEXT)  # fmt: skip
        alone = backend.alone_prompt([], params)
        assert_most_fell_back(run_trials(backend, relay, alone, params, alone))
    finally:
        relay.close()


@pytest.mark.slow
def test_dragon_cloud_reset_loses_nothing(tiny_lm, tiny_lm_b, one_torch_thread):
    from tandem.protocols.dragon import Knowledge
    from tandem.protocols.dragon.setup import SideSetup
    from tandem.retrieval.embedder import HashingEmbedder
    from tandem.serve.api.retrieval import DragonBackend

    embedder = HashingEmbedder(64)
    device = Knowledge.from_texts(
        ["Our retry policy: base delay 0.5 s, at most 5 tries."], embedder
    )
    public = Knowledge.from_texts(["asyncio.sleep(delay) suspends the task."], embedder)
    cloud = CloudThread(tiny_lm_b, dragon=SideSetup(tiny_lm_b, public, None))
    relay = FaultRelay(cloud.port)
    try:
        settings = DeviceServeSettings(model=tiny_lm.name, mode="dragon",
                                       cloud=f"127.0.0.1:{relay.port}")  # fmt: skip
        backend = DragonBackend(
            SideSetup(tiny_lm, device, None), host="127.0.0.1", port=relay.port,
            transport=device_transport_for(tiny_lm, settings, SECRET), strategy="dragon", docs=1,
        )  # fmt: skip
        params = GenParams(max_tokens=N, temperature=0.0, question="write a retry function")
        # after the fault DRAGON continues on the device's own documents (its local law),
        # which this test does not recompute: it checks the stream, the prefix and the length
        fell_back = run_trials(backend, relay, [], params, [], check_rest=False)
        assert_most_fell_back(fell_back)
    finally:
        relay.close()
        cloud.stop()
