"""One Report: every mode's result answers `headline()` with the same numbers under the same
names (tandem/protocols/report.py)."""

from __future__ import annotations

import pytest

from tandem.baselines.dragon.device import BaselineReport
from tandem.protocols.dragon.report import SideReport
from tandem.protocols.local import GenerationResult
from tandem.protocols.rapid.engine import RapidResult
from tandem.protocols.report import Headline, Report, finish_of
from tandem.protocols.spec.stats import SpecReport

TOKENS = [5, 6, 7, 8, 9]
TIMES = [0.5, 0.75, 1.0, 1.25, 1.5]  # first token at 0.5 s, then one every 0.25 s


def results() -> dict[str, object]:
    return {
        "local": GenerationResult(TOKENS, "", prefill_s=0.5, decode_s=1.0, finish_reason="eos"),
        "spec": SpecReport(mode="spec", config={"max_new_tokens": 5}, tokens=TOKENS, text="",
                           total_s=1.5, token_times=TIMES, uplink_bytes=100, downlink_bytes=40),
        "dragon": SideReport(role="cloud", tokens=TOKENS, token_times=TIMES,
                             finish_reason="length", bytes_sent=40, bytes_received=100),
        "drdg-tw": BaselineReport(method="drdg-tw", tokens=TOKENS, token_times=TIMES,
                                  bytes_sent=100, bytes_received=40),
    }  # fmt: skip


@pytest.mark.parametrize("mode", ["local", "spec", "dragon", "drdg-tw"])
def test_every_result_gives_the_same_headline_for_the_same_run(mode):
    result = results()[mode]
    assert isinstance(result, Report)
    head = result.headline()
    assert head.mode == mode and head.tokens == 5 and head.ttft_s == 0.5
    assert head.decode_tokens == 4 and head.decode_s == pytest.approx(1.0)
    assert head.tokens_per_s == pytest.approx(4.0)
    if mode != "local":  # over a network: device -> cloud 100 bytes, back 40
        assert (head.uplink_bytes, head.downlink_bytes) == (100, 40)


def test_finish_reasons():
    assert results()["local"].headline().finish_reason == "eos"
    assert results()["spec"].headline().finish_reason == "length"  # the whole budget
    short = SpecReport(mode="ar", config={"max_new_tokens": 9}, tokens=TOKENS, text="",
                       total_s=1.5, token_times=TIMES)  # fmt: skip
    assert short.headline().finish_reason == "eos"  # stopped before the budget
    assert finish_of([1, 2], eos_id=2) == "eos" and finish_of([1, 2], eos_id=3) == "length"
    assert finish_of([], eos_id=2) == "length"


def test_rapid_times_rounds_not_tokens_and_drdg_sw_gets_its_answer_whole():
    rapid = RapidResult(TOKENS, "", rounds=2, drafted=6, accepted=3, accepted_per_round=[1, 2],
                        prefill_s=3.0, decode_s=2.0, extra={"uplink_bytes": 7})  # fmt: skip
    head = rapid.headline()
    assert head.ttft_s is None and head.decode_tokens == 5 and head.tokens_per_s == 2.5
    assert head.uplink_bytes == 7 and rapid.tokens_per_s == 2.5
    whole = BaselineReport(method="drdg-sw", tokens=TOKENS, token_times=[2.0] * 5,
                           decode_start_s=1.0)  # fmt: skip
    assert whole.headline().tokens_per_s == pytest.approx(5.0)
    assert whole.headline().tokens_per_s == pytest.approx(1 / whole.per_token_s)


def test_an_empty_run_has_no_throughput():
    empty = Headline("local", 0, None, 0, 0.0, "length")
    assert empty.tokens_per_s == 0.0 and empty.to_json()["tokens_per_s"] == 0.0
    assert GenerationResult([], "", 0.0, 0.0, "length").headline().ttft_s is None


def test_spec_table_says_nothing_was_verified_instead_of_zero():
    """An eager generation whose cloud decoded every token on its own verified no draft: the
    table says so (an acceptance rate of 0.00 would read as every draft rejected)."""
    from rich.console import Console

    from tandem.protocols.spec.stats import VerdictRecord, summary_table

    def table(report) -> str:
        console = Console(width=100, record=True)
        console.print(summary_table(report))
        return " ".join(console.export_text().split())

    eager = SpecReport(mode="spec", config={"pipeline": "eager", "draft_len": 4}, tokens=TOKENS,
                       text="", total_s=1.5, token_times=TIMES, cloud={"ar_tokens": 5})  # fmt: skip
    said = table(eager)
    assert "acceptance rate │ - (no draft verified)" in said
    assert "T_verify (ms) │ - (no draft verified)" in said
    assert "tokens the cloud decoded on its own │ 5" in said
    eager.verdicts = [VerdictRecord(3, True, False, 0.05, 0.06)]
    said = table(eager)
    assert "acceptance rate │ 1.00" in said and "T_verify (ms) │ 50" in said
    assert "no draft verified" not in said
