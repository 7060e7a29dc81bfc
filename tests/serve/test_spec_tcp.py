"""Speculative decoding over real TCP on loopback (handshake, auth, the cloud server's mode
registry): greedy output equals the cloud model's greedy output for every pipeline, the
baselines give what they should, and failures are one-line TandemErrors."""

from __future__ import annotations

import asyncio

import pytest

from tandem.baselines.spec_baselines import run_device_only
from tandem.config import SamplingConfig
from tandem.errors import TandemError
from tandem.protocols.local import generate
from tandem.protocols.spec import SpecConfig
from tandem.serve.cloud import CloudResources, CloudServer
from tandem.serve.device import run_generation
from tandem.transport import (
    AuthenticationFailed,
    ConnectError,
    FingerprintMismatch,
    LinkConfig,
    TransportConfig,
)

N = 20
SECRET = b"loopback-secret"


@pytest.fixture(scope="module")
def prompt(tiny_lm):
    return tiny_lm.tokenizer.encode("import os\n")


def greedy(lm, prompt, n=N):
    config = SamplingConfig(temperature=0, max_new_tokens=n, stop_at_eos=False)
    return generate(lm, prompt, config).tokens


async def with_cloud(lm, body, *, modes=None, secret=SECRET, link=None):
    """Start a cloud on 127.0.0.1:<any>, run body(port), close."""
    cloud = CloudServer(CloudResources(lm=lm), modes=modes)
    server = await cloud.start(
        "127.0.0.1",
        0,
        transport=TransportConfig.for_model(lm, role="cloud", secret=secret, link=link),
    )
    try:
        return await body(server.port), cloud
    finally:
        await server.close()


def run_mode(device_lm, cloud_lm, prompt, mode, config, *, secret=SECRET, modes=None, link=None,
             controller=None):  # fmt: skip
    async def body(port):
        transport = TransportConfig.for_model(device_lm, role="device", secret=secret, link=link)
        return await run_generation(
            mode, lm=device_lm, prompt_ids=prompt, config=config, port=port, transport=transport,
            controller=controller,
        )  # fmt: skip

    return asyncio.run(with_cloud(cloud_lm, body, modes=modes, link=link))


@pytest.mark.parametrize(
    "pipeline,codec",
    [("sync", "dense"), ("async", "dense"), ("async", "k-sqs"), ("sync", "separate")],
)
def test_spec_over_tcp_equals_cloud_greedy(tiny_lm, tiny_lm_b, prompt, pipeline, codec):
    config = SpecConfig(
        pipeline=pipeline, codec=codec, temperature=0.0, max_new_tokens=N, stop_at_eos=False
    )
    link = LinkConfig(delay_ms=2.0)
    report, cloud = run_mode(tiny_lm, tiny_lm_b, prompt, "spec", config, link=link)
    assert report.tokens == greedy(tiny_lm_b, prompt)
    assert cloud.resources.reports[0][0] == "spec"
    assert report.cloud["agrees_with_device"]
    summary = report.summary()
    assert summary["uplink_bytes_per_token"] > 0 and summary["downlink_bytes_per_token"] > 0


def test_cloud_autoregressive_baseline_equals_cloud_greedy(tiny_lm, tiny_lm_b, prompt):
    config = SpecConfig(temperature=0.0, max_new_tokens=N, stop_at_eos=False)
    report, _ = run_mode(tiny_lm, tiny_lm_b, prompt, "ar", config)
    assert report.tokens == greedy(tiny_lm_b, prompt)
    assert report.mode == "ar" and report.cloud["tokens"] == N


@pytest.mark.parametrize("served", [None, ["spec"]])
def test_adaptive_eager_that_plans_cloud_ar_runs_the_ar_stream(tiny_lm, tiny_lm_b, prompt, served):
    """A draft step slower than the cloud's AR step: the controller plans cloud AR, so the
    generation is the plain AR stream (its time per token teaches the controller t_ar); a
    cloud that serves no `ar` mode gets the eager pipeline instead. Same tokens either way."""
    from tandem.protocols.spec.planner import Controller, Costs

    prior = Costs(t_draft=1.0, decode_base=0.0, decode_per_token=0.1, rtt=0.0)
    controller = Controller(prior=prior)
    assert controller.plan(("ar", "eager")).method == "ar"
    config = SpecConfig(pipeline="eager", temperature=0.0, max_new_tokens=N, stop_at_eos=False)
    report, _ = run_mode(tiny_lm, tiny_lm_b, prompt, "spec", config, modes=served,
                         controller=controller)  # fmt: skip
    assert report.tokens == greedy(tiny_lm_b, prompt)
    if served is None:
        assert report.mode == "ar" and report.drafted == 0
        assert controller.costs().t_ar == pytest.approx(report.summary()["tpot_ms"] / 1e3)
    else:
        assert report.mode == "spec"


def test_device_only_baseline_equals_device_greedy(tiny_lm, prompt):
    config = SpecConfig(temperature=0.0, max_new_tokens=N, stop_at_eos=False)
    assert run_device_only(tiny_lm, prompt, config).tokens == greedy(tiny_lm, prompt)


def test_wrong_secret_is_refused(tiny_lm, tiny_lm_b, prompt):
    config = SpecConfig(max_new_tokens=4)
    with pytest.raises(AuthenticationFailed) as info:
        run_mode(tiny_lm, tiny_lm_b, prompt, "spec", config, secret=b"other")
    assert "\n" not in str(info.value)


def test_another_tokenizer_is_refused(tiny_lm, tiny_lm_b, prompt):
    from dataclasses import replace

    async def body(port):
        transport = replace(
            TransportConfig.for_model(tiny_lm, role="device", secret=SECRET),
            tokenizer_hash="0" * 64,
        )
        return await run_generation(
            "spec", lm=tiny_lm, prompt_ids=prompt, config=SpecConfig(), port=port,
            transport=transport,
        )  # fmt: skip

    with pytest.raises(FingerprintMismatch) as info:
        asyncio.run(with_cloud(tiny_lm_b, body))
    assert "\n" not in str(info.value)


def test_unreachable_cloud_is_one_line(tiny_lm, prompt):
    async def main():
        return await run_generation(
            "spec", lm=tiny_lm, prompt_ids=prompt, config=SpecConfig(), port=1,
            transport=TransportConfig.for_model(tiny_lm, role="device", secret=SECRET),
        )  # fmt: skip

    with pytest.raises(ConnectError) as info:
        asyncio.run(main())
    assert isinstance(info.value, TandemError) and "\n" not in str(info.value)


def test_a_mode_the_cloud_does_not_serve_is_refused(tiny_lm, tiny_lm_b, prompt):
    config = SpecConfig(max_new_tokens=4)
    with pytest.raises(TandemError, match="serves only: ar"):
        run_mode(tiny_lm, tiny_lm_b, prompt, "spec", config, modes=["ar"])


def test_unknown_modes_are_refused_at_once(tiny_lm):
    with pytest.raises(TandemError, match="unknown mode"):
        CloudServer(CloudResources(lm=tiny_lm), modes=["dragon-typo"])
    with pytest.raises(TandemError, match="unknown mode"):
        asyncio.run(run_generation("nope", lm=tiny_lm, prompt_ids=[1], config=SpecConfig()))
