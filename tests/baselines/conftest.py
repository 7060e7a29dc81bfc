"""DRAGON baseline fixtures: the same two corpora and question as tests/protocols/dragon
(pytest puts tests/ on sys.path, so that conftest imports as `protocols.dragon.conftest`)."""

from protocols.dragon.conftest import (
    CLOUD_TEXTS,
    DEVICE_TEXTS,
    QUESTION,
    central_pair,
    corpora,
    tiny_config,
)

__all__ = ["CLOUD_TEXTS", "DEVICE_TEXTS", "QUESTION", "central_pair", "corpora", "tiny_config"]
