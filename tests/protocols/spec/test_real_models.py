"""Integration: Qwen2.5-Coder-0.5B drafts on the "device", Qwen2.5-Coder-1.5B verifies in the
"cloud" (a real draft/target pair sharing a tokenizer); greedy output equals the 1.5B model's
own greedy output. The 1.5B model (~7 GB in fp32) is loaded once and freed afterwards."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tandem.config import SamplingConfig
from tandem.protocols.local import generate
from tandem.protocols.spec import SpecConfig, run_pair
from tandem.transport import LinkConfig

pytestmark = pytest.mark.slow
N = 8
PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


@pytest.fixture(scope="module")
def cloud_lm():
    from tandem.models.registry import load_model

    lm = load_model("qwen2.5-coder-1.5b", progress=False)
    yield lm
    del lm
    gc.collect()


@pytest.fixture(scope="module")
def reference(cloud_lm):
    ids = cloud_lm.tokenizer.encode(PROMPT)
    config = SamplingConfig(temperature=0, max_new_tokens=N, stop_at_eos=False)
    return ids, generate(cloud_lm, ids, config).tokens


@pytest.mark.parametrize("pipeline,codec", [("async", "dense"), ("sync", "k-sqs")])
def test_qwen_half_b_drafts_for_one_and_a_half_b(real_lm, cloud_lm, reference, pipeline, codec):
    ids, expected = reference
    config = SpecConfig(
        pipeline=pipeline, codec=codec, temperature=0.0, max_new_tokens=N, stop_at_eos=False
    )
    report, _ = asyncio.run(
        run_pair(
            device_lm=real_lm,
            cloud_lm=cloud_lm,
            prompt_ids=ids,
            config=config,
            link=LinkConfig(delay_ms=10.0),
        )
    )
    assert report.tokens == expected, (real_lm.tokenizer.decode(report.tokens), expected)
    assert report.summary()["acceptance_rate"] > 0.3  # the 0.5B model is a useful drafter
