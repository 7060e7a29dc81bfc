"""DRAGON baseline fixtures: the same two corpora and question as tests/protocols/dragon."""

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
