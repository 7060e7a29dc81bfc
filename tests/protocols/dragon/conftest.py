"""Fixtures for DRAGON tests: two small corpora (one per side) over a hashing embedder, the
settings tiny-model runs start from, and the central reference built from them."""

from __future__ import annotations

import pytest

DEVICE_TEXTS = [
    "Our retry policy: base delay 0.5 s, factor 2, cap 20 s, at most 5 attempts.",
    "Buoys report salinity and water temperature every minute over LTE.",
    "Deploy tidepool with systemd on the harbour box; logs go to journald.",
]
CLOUD_TEXTS = [
    "asyncio.sleep(delay) suspends the current task for delay seconds.",
    "random.uniform(a, b) returns a random float N such that a <= N <= b.",
    "time.monotonic() returns the value of a monotonic clock in seconds.",
]
QUESTION = "write a retry function with asyncio sleep and jitter"


@pytest.fixture(scope="session")
def corpora():
    from tandem.protocols.dragon import Knowledge
    from tandem.retrieval.embedder import HashingEmbedder

    embedder = HashingEmbedder(64)
    return Knowledge.from_texts(DEVICE_TEXTS, embedder), Knowledge.from_texts(CLOUD_TEXTS, embedder)


def tiny_config(**overrides):
    """DragonConfig for tiny-model runs: greedy, fixed length, a fast RTT probe, no bandwidth
    probe; `overrides` replace any of these."""
    from tandem.protocols.dragon import DragonConfig

    base = {
        "max_new_tokens": 12,
        "temperature": 0.0,
        "seed": 5,
        "stop_at_eos": False,
        "rtt_probe_s": 0.05,
        "bandwidth_probe_bytes": 0,
    }
    return DragonConfig(**{**base, **overrides})


def central_pair(device_lm, cloud_lm, corpora, config):
    """The centralised reference (tandem.protocols.dragon.reference) of one tiny-model run."""
    from tandem.protocols.dragon.reference import CentralPair

    device_knowledge, cloud_knowledge = corpora
    return CentralPair.build(
        device_lm=device_lm,
        cloud_lm=cloud_lm,
        device_knowledge=device_knowledge,
        cloud_knowledge=cloud_knowledge,
        question=QUESTION,
        config=config,
    )
