"""Token ids -> client text: stop strings across token boundaries, held-back prefixes,
incomplete UTF-8, eos and the token budget. Streamed pieces always add up to the answer."""

from __future__ import annotations

import pytest

from tandem.models.tiny import ByteTokenizer
from tandem.serve.api.text import TextTracker, first_stop, held_back

EOS = ByteTokenizer.eos_token_id


def feed(tokens: list[int], stops: list[str], limit: int = 100) -> tuple[list[str], TextTracker]:
    tracker = TextTracker(ByteTokenizer(), eos_id=EOS, stops=stops, limit=limit)
    pieces = []
    for token in tokens:
        pieces.append(tracker.push(token))
        if tracker.done:
            break
    pieces.append(tracker.close("length"))
    return pieces, tracker


def test_held_back_and_first_stop():
    assert held_back("abc ST", ["STOP"]) == 2
    assert held_back("abc S", ["STOP", "SX"]) == 1
    assert held_back("abc", ["STOP"]) == 0
    assert held_back("abcSTO", ["STOP", "O"]) == 3
    assert first_stop("a STOP b END", ["END", "STOP"]) == 2
    assert first_stop("abc", ["x"]) is None


@pytest.mark.parametrize(
    "text,stops,answer,finish",
    [
        ("hello STOP world", ["STOP"], "hello ", "stop"),
        ("hello STOP world", ["world", "STOP"], "hello ", "stop"),
        ("hello ST world", ["STOP"], "hello ST world", "length"),
        ("abc", [], "abc", "length"),
        ("aaab", ["aab"], "a", "stop"),
    ],
)
def test_stop_strings(text, stops, answer, finish):
    pieces, tracker = feed(list(text.encode()), stops)
    assert "".join(pieces) == tracker.text == answer
    assert tracker.finish == finish


def test_a_stop_string_is_never_streamed():
    pieces, _ = feed(list(b"ab<|end|>cd"), ["<|end|>"])
    assert pieces[:3] == ["a", "b", ""]  # "<" might open the stop string: held back
    assert "".join(pieces) == "ab"


def test_incomplete_utf8_waits_for_its_last_byte():
    data = "né".encode()  # é is two bytes
    pieces, tracker = feed(list(data), [])
    assert pieces == ["n", "", "é", ""] and tracker.text == "né"


def test_eos_and_budget():
    pieces, tracker = feed([*b"ok", EOS, *b"more"], [])
    assert "".join(pieces) == "ok" and tracker.finish == "stop" and len(tracker.tokens) == 3
    pieces, tracker = feed(list(b"abcdef"), [], limit=4)
    assert "".join(pieces) == "abcd" and tracker.finish == "length" and not tracker.cut
