"""Serving tests run device and cloud models in threads of one process: one torch thread."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(one_torch_thread):
    """Every test here runs with one torch thread (tests/conftest.py)."""
