"""decoding.after_tokens: the stream tap crash tests and the demo use to kill the cloud."""

from __future__ import annotations

from tandem.protocols.decoding import after_tokens


def test_then_runs_once_right_after_the_nth_token_and_tokens_still_flow():
    seen, fired = [], []
    tap = after_tokens(seen.append, 2, lambda: fired.append(len(seen)))
    for token in (7, 8, 9, 10):
        tap(token)
    assert seen == [7, 8, 9, 10] and fired == [2]


def test_none_or_zero_never_fires_and_no_consumer_is_fine():
    fired = []
    for count in (None, 0):
        tap = after_tokens(None, count, lambda: fired.append(1))
        for token in range(5):
            tap(token)
    assert fired == []
