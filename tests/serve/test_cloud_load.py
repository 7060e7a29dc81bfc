"""One cloud, 32 concurrent device sessions over loopback TCP (tiny models): every output is
complete and equals that session's output when served alone, the verifications were really
batched, the metrics endpoint and the JSON session log say so, and no session state is left."""

from __future__ import annotations

import asyncio
import gc
import io
import json

import pytest

from tandem.config import SamplingConfig
from tandem.models.base import State
from tandem.protocols.local import generate as local_generate
from tandem.serve.cloud_metrics import session_logger

from .cloud_helpers import LoopbackCloud, generate, http_get, metric, session_config

SESSIONS = 32


def live_states() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, State))


@pytest.fixture(scope="module")
def alone(tiny_lm, tiny_lm_b):
    """Each session's tokens when it is the only one, on a cloud without batching."""

    async def main():
        async with LoopbackCloud(tiny_lm_b, batching=False) as cloud:
            return [
                (await generate(tiny_lm, cloud.port, *session_config(i))).tokens
                for i in range(SESSIONS)
            ]

    return asyncio.run(main())


def test_alone_greedy_sessions_equal_the_cloud_models_greedy_output(tiny_lm_b, alone):
    for i, tokens in enumerate(alone):
        prompt, config = session_config(i)
        if config.temperature == 0:
            sampling = SamplingConfig(temperature=0, max_new_tokens=16, stop_at_eos=False)
            assert tokens == local_generate(tiny_lm_b, prompt, sampling).tokens


def test_32_concurrent_sessions_equal_their_single_session_outputs(tiny_lm, tiny_lm_b, alone):
    states_before = live_states()
    log = io.StringIO()

    async def main():
        async with LoopbackCloud(
            tiny_lm_b, on_record=session_logger("json", log), metrics_port=0
        ) as cloud:
            reports = await asyncio.gather(
                *(generate(tiny_lm, cloud.port, *session_config(i)) for i in range(SESSIONS))
            )
            status, text = await http_get(cloud.cloud.metrics_port, "/metrics")
            missing, _ = await http_get(cloud.cloud.metrics_port, "/nope")
            states_left = live_states()  # the cloud is still up: it holds no session state
            return reports, status, text, missing, cloud, states_left

    reports, status, text, missing, cloud, states_left = asyncio.run(main())
    assert states_left <= states_before and len(cloud.resources.live) == 0
    assert [r.tokens for r in reports] == alone  # no lost, duplicated or crossed tokens
    assert all(len(r.tokens) == 16 and r.cloud["agrees_with_device"] for r in reports)

    assert status == 200 and missing == 404
    assert metric(text, "tandem_cloud_batch_size_max") > 1  # batching really happened
    assert metric(text, 'tandem_cloud_sessions_total{mode="spec"}') == SESSIONS
    assert metric(text, "tandem_cloud_sessions_open") == 0
    assert metric(text, "tandem_cloud_tokens_total") == SESSIONS * 16
    assert 0 < metric(text, "tandem_cloud_acceptance_rate") <= 1
    assert metric(text, "tandem_cloud_bytes_up_total") > 0
    assert max(cloud.resources.batcher.batch_sizes) > 1

    records = [json.loads(line) for line in log.getvalue().splitlines()]
    ends = [r for r in records if r["event"] == "session_end"]
    assert len(ends) == SESSIONS and sum(r["event"] == "session_start" for r in records) == SESSIONS
    assert {r["session"] for r in ends} == {r["session"] for r in records}
    assert all(r["tokens"] == 16 and r["bytes_up"] > 0 and r["error"] is None for r in ends)
    assert sum(r["accepted"] for r in ends) <= sum(r["drafts"] for r in ends)

    assert not cloud.cloud.open
