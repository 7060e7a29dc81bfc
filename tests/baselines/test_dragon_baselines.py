"""DRAGON's baselines on tiny models (different weights per side, so the sides disagree):
DRDG/TW = DRAGON = the central reference; CRCG/Device = plain greedy decoding of its context;
DRCG/KV = DRCG/Text; DRDG/SW returns one side's answer by its sequence weight."""

from __future__ import annotations

import asyncio
import math

import pytest

from tandem.baselines.dragon import run_baseline_pair, sequence_choice
from tandem.baselines.dragon.context import context_layout
from tandem.protocols.dragon import run_pair
from tandem.transport import LinkConfig, control

from .conftest import QUESTION, central_pair, tiny_config

LINK = LinkConfig(delay_ms=2.0, jitter_ms=1.0, seed=3)


config = tiny_config


def baseline(method, tiny_lm, tiny_lm_b, corpora, cfg, link=LINK):
    device_knowledge, cloud_knowledge = corpora
    return asyncio.run(
        run_baseline_pair(
            method,
            device_lm=tiny_lm,
            cloud_lm=tiny_lm_b,
            device_knowledge=device_knowledge,
            cloud_knowledge=cloud_knowledge,
            question=QUESTION,
            config=cfg,
            link=link,
        )
    )


def plain_greedy(lm, ids: list[int], n: int) -> list[int]:
    """Greedy decoding by re-running the whole prompt each step (no KV cache reuse)."""
    out: list[int] = []
    for _ in range(n):
        out.append(int(lm.prefill(ids + out).logits[0].argmax()))
    return out


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_drdg_tw_equals_dragon_and_the_central_reference(tiny_lm, tiny_lm_b, corpora, temperature):
    cfg = config(temperature=temperature)
    device_knowledge, cloud_knowledge = corpora
    pair = central_pair(tiny_lm, tiny_lm_b, corpora, cfg)
    expected = pair.greedy() if cfg.greedy else pair.sampled()
    report, cloud = baseline("drdg-tw", tiny_lm, tiny_lm_b, corpora, cfg)
    dragon, _ = asyncio.run(
        run_pair(
            device_lm=tiny_lm, cloud_lm=tiny_lm_b, device_knowledge=device_knowledge,
            cloud_knowledge=cloud_knowledge, question=QUESTION, config=cfg, link=LINK,
        )
    )  # fmt: skip
    assert report.tokens == expected == dragon.tokens
    assert cloud["method"] == "drdg-tw" and cloud["tokens"] == len(expected)
    assert len(report.token_times) == len(expected) and report.transfer_bytes == 0


def test_crcg_device_is_plain_greedy_decoding_of_its_context(tiny_lm, corpora):
    cfg = config(max_new_tokens=8)
    report, _ = baseline("crcg-device", tiny_lm, tiny_lm, corpora, cfg)
    docs = [d.text for d in corpora[0].retrieve(QUESTION, cfg.docs_per_side)]
    ids = context_layout(tiny_lm.tokenizer, docs, [], QUESTION).ids
    assert all(doc in tiny_lm.tokenizer.decode(ids) for doc in docs) and len(docs) == 2
    assert report.tokens == plain_greedy(tiny_lm, ids, 8)
    assert report.bytes_sent == 0


def test_crcg_cloud_decodes_the_clouds_context_there(tiny_lm, tiny_lm_b, corpora):
    cfg = config(max_new_tokens=8)
    report, cloud = baseline("crcg-cloud", tiny_lm, tiny_lm_b, corpora, cfg)
    docs = [d.text for d in corpora[1].retrieve(QUESTION, cfg.docs_per_side)]
    ids = context_layout(tiny_lm_b.tokenizer, docs, [], QUESTION).ids
    assert report.tokens == plain_greedy(tiny_lm_b, ids, 8)
    assert cloud["context_tokens"] == len(ids)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_drcg_kv_equals_drcg_text(tiny_lm, corpora, temperature):
    cfg = config(temperature=temperature, max_new_tokens=10)
    text, _ = baseline("drcg-text", tiny_lm, tiny_lm, corpora, cfg)
    kv, cloud = baseline("drcg-kv", tiny_lm, tiny_lm, corpora, cfg)
    assert kv.tokens == text.tokens and len(kv.tokens) == 10
    cloud_docs = [d.text for d in corpora[1].retrieve(QUESTION, cfg.docs_per_side)]
    own_docs = [d.text for d in corpora[0].retrieve(QUESTION, cfg.docs_per_side)]
    ids = context_layout(tiny_lm.tokenizer, cloud_docs, own_docs, QUESTION).ids
    if cfg.greedy:  # both equal greedy decoding of cloud docs + own docs + question
        assert text.tokens == plain_greedy(tiny_lm, ids, 10)
    assert text.extra["context_tokens"] == kv.extra["context_tokens"] == len(ids)
    # the documents crossed the network: as text, and as a much bigger KV state
    assert text.transfer_bytes == sum(len(t.encode()) for t in cloud_docs)
    assert kv.transfer_bytes == cloud["kv_bytes"] > 10 * text.transfer_bytes
    assert kv.extra["kv_block_tokens"] == cloud["block_tokens"]


def test_drdg_sw_returns_the_side_with_the_larger_sequence_weight(tiny_lm, tiny_lm_b, corpora):
    cfg = config(max_new_tokens=10)
    report, cloud = baseline("drdg-sw", tiny_lm, tiny_lm_b, corpora, cfg)
    extra = report.extra
    assert extra["device_tokens"] != extra["cloud_tokens"]  # different models: a real choice
    chosen = extra["device_tokens"] if extra["chosen"] == "device" else extra["cloud_tokens"]
    assert report.tokens == chosen
    other = "cloud" if extra["chosen"] == "device" else "device"
    assert extra["scores"][extra["chosen"]] >= extra["scores"][other]
    assert math.isclose(cloud["logprob"], extra["scores"]["cloud"] - _log_eta(extra, "cloud"))
    # the answer arrives whole: every token at the same time, after both sides finished
    assert len(set(report.token_times)) == 1 and report.per_token_s > 0


def _log_eta(extra: dict, side: str) -> float:
    return extra["log_eta"][side]


def test_sequence_choice_rule():
    side, scores = sequence_choice({"device": 0.0, "cloud": 0.0}, {"device": -3.0, "cloud": -2.0})
    assert side == "cloud" and math.isclose(scores["cloud"], math.log(0.5) - 2.0)
    side, _ = sequence_choice({"device": 2.0, "cloud": 0.0}, {"device": -3.0, "cloud": -2.0})
    assert side == "device"  # log eta: 2 - logaddexp(2, 0) = -0.127 -> -3.13 > -3.87
    side, _ = sequence_choice({"device": 0.0, "cloud": 0.0}, {"device": -1.0, "cloud": -1.0})
    assert side == "device"  # ties go to the device


def test_sampled_drdg_sw_uses_position_seeds(tiny_lm, tiny_lm_b, corpora):
    cfg = config(temperature=0.9, max_new_tokens=6)
    first, _ = baseline("drdg-sw", tiny_lm, tiny_lm_b, corpora, cfg)
    again, _ = baseline("drdg-sw", tiny_lm, tiny_lm_b, corpora, cfg, link=None)
    assert first.tokens == again.tokens
    assert len(first.tokens) == 6


def test_kv_parts_of_a_real_sized_state_cross_the_wire():
    from tandem.baselines.dragon.cloud import KV_PART_BYTES, kv_messages
    from tandem.protocols.dragon import wire
    from tandem.transport.wire import FrameParser, Limits, encode_message

    data = bytes(range(256)) * (3 * 2**20 // 256 + 7)  # ~3 MiB: a 0.5B state of ~130 tokens
    parser, received = FrameParser(limits=Limits()), []
    for msg in kv_messages(data, block_tokens=130, docs=2):
        parser.receive_data(encode_message(msg, compression=None))
        received.append(parser.next_event())
    assert len(received) == -(-len(data) // KV_PART_BYTES)
    assert [control.body(m)["last"] for m in received][-1]
    assert b"".join(wire.message_blob(m) for m in received) == data


def test_the_cloud_module_runs_as_a_script_without_a_second_copy():
    """`python -m tandem.baselines.dragon.cloud` (the testbed's cloud process): its package
    must not import it first, or runpy executes it twice (and warns into the cloud's log)."""
    import subprocess
    import sys

    argv = [sys.executable, "-W", "error::RuntimeWarning", "-m", "tandem.baselines.dragon.cloud"]
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--corpus" in done.stdout, done.stderr[-2000:]
