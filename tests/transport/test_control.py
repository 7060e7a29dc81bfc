"""Session control: the typed Start / Ready / End / Stats messages every mode opens and
closes with, their JSON bodies, and the data-carrying control frames."""

from __future__ import annotations

import pytest

from tandem.transport import DraftTokens, End, Ready, Start, Stats, control, encode_message

from .test_wire import parse_all


def round_trip(msg):
    return parse_all(encode_message(msg))[0]


def test_start_ready_end_stats_round_trip_with_their_bodies():
    start = round_trip(control.start("spec", {"config": {"draft_len": 4}}, (5, 6, 7)))
    assert isinstance(start, Start) and start.mode == "spec" and start.tokens == (5, 6, 7)
    assert control.body(start) == {"config": {"draft_len": 4}}
    assert control.start_mode(start) == "spec"
    ready = round_trip(control.ready({"model": "m", "prefill_s": 1.5}))
    assert isinstance(ready, Ready) and control.body(ready)["prefill_s"] == 1.5
    assert control.body(round_trip(control.ready())) == {}
    end = round_trip(control.end((1, 2)))
    assert isinstance(end, End) and end.tokens == (1, 2)
    stats = round_trip(control.stats({"tokens": 3, "verify_s": [0.1]}))
    assert isinstance(stats, Stats) and control.body(stats) == {"tokens": 3, "verify_s": [0.1]}


@pytest.mark.parametrize("body", [b"", b"[1, 2]", b"{not json", b"\xff\xfe"])
def test_a_malformed_body_is_a_value_error_naming_the_message(body):
    with pytest.raises(ValueError, match="malformed Start"):
        control.body(Start(mode="spec", body=body))
    with pytest.raises(ValueError, match="malformed Stats"):
        control.body(Stats(body=body))


def test_only_a_start_names_a_mode():
    assert control.start_mode(control.ready()) is None
    assert control.start_mode(DraftTokens(seq=0, position=-1, tokens=(), codec="spec")) is None


def test_data_frames_carry_a_kind_a_body_and_padding():
    frame = round_trip(control.control_message("x.docs", {"texts": ["a"]}, padding=100))
    assert control.control_kind(frame, ("x.docs",)) == "x.docs"
    assert control.control_kind(frame, ("y",)) is None
    assert control.body(frame) == {"texts": ["a"]}
    assert frame.arrays["body"].nbytes > 100
    draft = DraftTokens(seq=0, position=3, tokens=(1,), codec="x.docs")  # a real draft
    assert control.control_kind(draft, ("x.docs",)) is None
