"""Retry with exponential backoff and full jitter (ADR 0002)."""

import asyncio
import random


class PermanentError(Exception):
    """A failure that must not be retried (HTTP 4xx)."""


async def retry_async(call, *, attempts=5, base=0.5, factor=2.0, cap=20.0, rng=random.random):
    """Await `call()` until it succeeds, at most `attempts` times."""
    for attempt in range(attempts):
        try:
            return await call()
        except PermanentError:
            raise
        except (TimeoutError, ConnectionError):
            if attempt == attempts - 1:
                raise
            delay = min(cap, base * factor**attempt)
            await asyncio.sleep(rng() * delay)  # full jitter
