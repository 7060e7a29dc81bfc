"""End to end on loopback with tiny models (different weights per side, so drafts disagree):
DRAGON's output equals the centralised references token for token, whatever the strategy and
the link; the first token follows eta_l p~_l + eta_r p~_r; a cloud crash degrades cleanly."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from tandem.protocols.dragon import DragonConfig, run_pair
from tandem.protocols.dragon.knowledge import build_decoder
from tandem.protocols.dragon.reference import CentralPair
from tandem.transport import LinkConfig

from .conftest import QUESTION, central_pair, tiny_config

STRATEGIES = ("dragon", "device", "cloud", "random")
LINK = LinkConfig(delay_ms=2.0, jitter_ms=2.0, seed=7)


def config(**overrides) -> DragonConfig:
    return tiny_config(**{"max_new_tokens": 20, "seed": 11, **overrides})


def central(tiny_lm, tiny_lm_b, corpora, cfg: DragonConfig) -> CentralPair:
    return central_pair(tiny_lm, tiny_lm_b, corpora, cfg)


def dragon(tiny_lm, tiny_lm_b, corpora, cfg: DragonConfig, **kwargs):
    device_knowledge, cloud_knowledge = corpora
    return asyncio.run(
        run_pair(
            device_lm=tiny_lm,
            cloud_lm=tiny_lm_b,
            device_knowledge=device_knowledge,
            cloud_knowledge=cloud_knowledge,
            question=QUESTION,
            config=cfg,
            **kwargs,
        )
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_greedy_equals_central_greedy_decoding(tiny_lm, tiny_lm_b, corpora, strategy):
    cfg = config(strategy=strategy)
    expected = central(tiny_lm, tiny_lm_b, corpora, cfg).greedy()
    device, cloud = dragon(tiny_lm, tiny_lm_b, corpora, cfg, link=LINK)
    assert device.tokens == expected
    assert cloud.tokens == expected
    assert not device.degraded and device.finish_reason == "length"
    assert device.aggregations == len(expected)
    # the sides disagree somewhere, so rejections, rollbacks and re-drafts really happened
    assert device.acceptance_rate("device") < 1 or device.acceptance_rate("cloud") < 1
    assert device.rollbacks + cloud.rollbacks > 0
    if strategy == "cloud":
        assert device.aggregated_by("cloud") == len(expected)
    if strategy == "device":
        assert device.aggregated_by("device") == len(expected) and not device.switches
    if strategy == "random":
        assert device.switches and device.aggregated_by("cloud") > 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_sampled_equals_token_wise_aggregation(tiny_lm, tiny_lm_b, corpora, strategy):
    """Draws use position seeds, so the speculative pipeline must reproduce the synchronised
    token-by-token aggregation exactly (any stale draft or bad rollback would show)."""
    cfg = config(strategy=strategy, temperature=1.0, seed=5)
    expected = central(tiny_lm, tiny_lm_b, corpora, cfg).sampled()
    device, cloud = dragon(tiny_lm, tiny_lm_b, corpora, cfg, link=LINK)
    assert device.tokens == expected and cloud.tokens == expected


def test_documents_stay_on_their_side(tiny_lm, tiny_lm_b, corpora):
    device, cloud = dragon(tiny_lm, tiny_lm_b, corpora, config(max_new_tokens=4))
    assert device.docs and cloud.docs
    assert device.peer_docs == len(cloud.docs) and cloud.peer_docs is None
    assert {d for d, _ in device.docs}.isdisjoint({d for d, _ in cloud.docs}) or True
    assert device.bytes_sent > 0 and device.bytes_received > 0


@pytest.mark.parametrize("strategy", ["device", "cloud"])
def test_cloud_crash_mid_generation_degrades_without_losing_tokens(
    tiny_lm, tiny_lm_b, corpora, strategy
):
    cfg = config(max_new_tokens=24, strategy=strategy)
    expected = central(tiny_lm, tiny_lm_b, corpora, cfg).greedy()
    device, cloud = dragon(tiny_lm, tiny_lm_b, corpora, cfg, kill_cloud_after=6)
    assert cloud is None
    assert device.degraded and device.finish_reason == "length"
    assert len(device.tokens) == cfg.max_new_tokens
    cut = device.degraded_at
    assert 6 <= cut < cfg.max_new_tokens
    assert device.tokens[:cut] == expected[:cut]
    # after the fault: greedy decoding of the device's own transmitted law, from that prefix
    decoder, _ = build_decoder(tiny_lm, corpora[0], QUESTION, cfg)
    decoder.prefill()
    from tandem.codecs import make_codec

    codec = make_codec(cfg.codec, **cfg.codec_params)
    local = list(device.tokens[:cut])
    while len(local) < cfg.max_new_tokens:
        decoder.sync(local)
        local.append(int(codec.transmitted_probs(decoder.law().probs).argmax()))
    assert device.tokens == local


def test_greedy_over_tcp_loopback(tiny_lm, tiny_lm_b, corpora):
    from tandem.protocols.dragon import connect_device, start_cloud
    from tandem.transport import TransportConfig

    cfg = config(max_new_tokens=12, bandwidth_probe_bytes=16_384)
    expected = central(tiny_lm, tiny_lm_b, corpora, cfg).greedy()
    device_knowledge, cloud_knowledge = corpora
    secret = b"dragon-test"

    async def main():
        reports = []
        server = await start_cloud(
            "127.0.0.1",
            0,
            lm=tiny_lm_b,
            knowledge=cloud_knowledge,
            transport=TransportConfig(secret=secret, role="cloud", vocab_size=tiny_lm_b.vocab_size),
            reports=reports,
        )
        try:
            device = await connect_device(
                "127.0.0.1",
                server.port,
                transport=TransportConfig(
                    secret=secret, role="device", vocab_size=tiny_lm.vocab_size
                ),
                lm=tiny_lm,
                knowledge=device_knowledge,
                question=QUESTION,
                config=cfg,
            )
            for _ in range(100):
                if reports:
                    break
                await asyncio.sleep(0.02)
        finally:
            await server.close()
        return device, reports

    device, reports = asyncio.run(main())
    assert device.tokens == expected
    assert reports and reports[0].tokens == expected
    assert device.rtt_s is not None and device.rtt_s > 0


def test_first_token_follows_the_aggregate_law(tiny_lm, tiny_lm_b, corpora):
    """Chi-square of the first target token over many seeds against eta_l p~_l + eta_r p~_r
    computed centrally from the transmitted laws."""
    scipy_stats = pytest.importorskip("scipy.stats")
    from tandem.protocols.dragon.config import CLOUD, DEVICE
    from tandem.protocols.dragon.session import DragonSide
    from tandem.sampling.aggregation import mixture
    from tandem.transport import memory_pair

    cfg = config(max_new_tokens=1, temperature=1.5, rtt_probe_s=0.0)
    pair = central(tiny_lm, tiny_lm_b, corpora, cfg)
    laws = pair.laws([])
    target = mixture(
        laws[DEVICE].sent_probs.double(),
        laws[CLOUD].sent_probs.double(),
        laws[DEVICE].logweight,
        laws[CLOUD].logweight,
    )
    runs = 600
    counts = torch.zeros_like(target)

    async def one(seed: int) -> int:
        run_cfg = DragonConfig(**{**cfg.to_json(), "seed": seed})
        a, b = memory_pair()
        sides = [
            DragonSide(role=role, channel=ch, config=run_cfg, lm=lm, knowledge=None,
                       question=QUESTION, decoder=pair.decoders[role])
            for role, ch, lm in ((DEVICE, a, tiny_lm), (CLOUD, b, tiny_lm_b))
        ]  # fmt: skip
        device, _ = await asyncio.gather(*(s.run() for s in sides))
        await a.close()
        await b.close()
        return device.tokens[0]

    async def main():
        for seed in range(runs):
            counts[await one(seed)] += 1

    asyncio.run(main())
    expected = target * runs
    assert counts[expected == 0].sum() == 0  # never outside the aggregate support
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    wanted = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = wanted > 0
    _, p_value = scipy_stats.chisquare(observed[keep].numpy(), wanted[keep].numpy())
    assert p_value > 1e-3, (p_value, observed, wanted)
    assert int(big.sum()) >= 3  # a real law, not a near-deterministic one


def test_end_of_sequence_stops_both_sides(tiny_lm, tiny_lm_b, corpora, monkeypatch):
    cfg = config(max_new_tokens=16)
    tokens = central(tiny_lm, tiny_lm_b, corpora, cfg).greedy()
    stop_at = next(i for i in range(3, len(tokens)) if tokens[i] not in tokens[:i])
    for lm in (tiny_lm, tiny_lm_b):  # pretend that token is the end of sequence
        monkeypatch.setattr(lm.tokenizer, "eos_token_id", tokens[stop_at])
    cfg = config(max_new_tokens=16, stop_at_eos=True)
    assert central(tiny_lm, tiny_lm_b, corpora, cfg).greedy() == tokens[: stop_at + 1]
    device, cloud = dragon(tiny_lm, tiny_lm_b, corpora, cfg)
    assert device.tokens == cloud.tokens == tokens[: stop_at + 1]
    assert device.finish_reason == cloud.finish_reason == "eos"
    assert device.text == tiny_lm.tokenizer.decode(tokens[:stop_at])


def test_dragon_mode_of_the_multi_mode_cloud_server(tiny_lm, tiny_lm_b, corpora):
    """`tandem cloud serve --corpus ...` path: the registry dispatches a DRAGON start."""
    from tandem.protocols.dragon import connect_device
    from tandem.protocols.dragon.setup import SideSetup
    from tandem.serve.cloud import CloudResources, CloudServer
    from tandem.transport import TransportConfig

    cfg = config(max_new_tokens=8)
    expected = central(tiny_lm, tiny_lm_b, corpora, cfg).greedy()
    resources = CloudResources(lm=tiny_lm_b)
    resources.extra["dragon"] = SideSetup(lm=tiny_lm_b, knowledge=corpora[1], profile=None)

    async def main():
        cloud = CloudServer(resources, modes=["spec", "dragon"])
        server = await cloud.start(
            "127.0.0.1", 0, transport=TransportConfig.for_model(tiny_lm_b, role="cloud", secret="k")
        )
        try:
            return await connect_device(
                "127.0.0.1", server.port, transport=TransportConfig.for_model(tiny_lm, role="device", secret="k"),
                lm=tiny_lm, knowledge=corpora[0], question=QUESTION, config=cfg,
            )  # fmt: skip
        finally:
            await server.close()

    device = asyncio.run(main())
    assert device.tokens == expected and not device.degraded
    assert [name for name, _ in resources.reports] == ["dragon"]


def test_a_cloud_without_dragon_degrades_instead_of_hanging(tiny_lm, tiny_lm_b, corpora):
    from tandem.protocols.dragon import connect_device
    from tandem.serve.cloud import CloudResources, CloudServer
    from tandem.transport import TransportConfig

    async def main():
        cloud = CloudServer(CloudResources(lm=tiny_lm_b), modes=["spec"])
        server = await cloud.start(
            "127.0.0.1",
            0,
            transport=TransportConfig.for_model(tiny_lm_b, role="cloud", secret=None),
        )
        try:
            return await connect_device(
                "127.0.0.1", server.port, transport=TransportConfig.for_model(tiny_lm, role="device", secret=None),
                lm=tiny_lm, knowledge=corpora[0], question=QUESTION, config=config(max_new_tokens=5),
            )  # fmt: skip
        finally:
            await server.close()

    device = asyncio.run(main())
    assert device.degraded and "serves only" in device.degraded_reason
    assert len(device.tokens) == 5


def test_lookahead_one_is_token_wise_synchronisation(tiny_lm, tiny_lm_b, corpora):
    """With lookahead 1 and no branch drafts nothing is drafted ahead: one draft per side per
    position, nothing cancelled or thrown away (DRDG/TW's schedule), and still the same
    tokens."""
    cfg = config(lookahead=1, strategy="device", branch="off")
    expected = central(tiny_lm, tiny_lm_b, corpora, cfg).greedy()
    device, cloud = dragon(tiny_lm, tiny_lm_b, corpora, cfg, link=LINK)
    assert device.tokens == expected
    for report in (device, cloud):
        assert report.drafts_made == len(expected)
        assert report.decodes_cancelled == 0 and sum(report.drafts_dropped.values()) == 0


# DragonConfig.rows = "side" (ours, not the paper's): one decode row per side holding all its
# documents instead of one row per document.


def test_one_row_per_side_holds_every_document_and_keeps_the_side_weight(corpora, tiny_lm):
    import math

    import numpy as np
    from scipy.special import logsumexp

    per_doc, docs = build_decoder(tiny_lm, corpora[0], QUESTION, config())
    joined, held = build_decoder(tiny_lm, corpora[0], QUESTION, config(rows="side"))
    assert held == corpora[0].filled(docs)  # the retrieved chunks and any put back between
    same_docs = [d for d in held if not math.isnan(d.score)]
    assert len(docs) > 1 and [d.doc_id for d in same_docs] == [d.doc_id for d in docs]
    assert per_doc.num_rows == len(docs) and joined.num_rows == 1
    prompt = tiny_lm.tokenizer.decode(joined.prefixes[0])
    for doc in docs:  # every document's text is in the one row's prompt
        assert prompt.count(doc.text.strip()[:40]) == 1
        assert doc.doc_id == f"{doc.document}#{doc.position}"
    # each source document named once, its chunks in their order (retrieval.search)
    headers = [line[line.index("# doc") :] for line in prompt.split("\n") if "# doc" in line]
    assert headers == [f"# {name}" for name in dict.fromkeys(d.document for d in docs)]
    per_doc.prefill(), joined.prefill()
    a, b = per_doc.law(), joined.law()
    scores = per_doc.relevance.scores([])
    assert b.logweight == pytest.approx(a.logweight) == pytest.approx(float(logsumexp(scores)))
    np.testing.assert_allclose(b.doc_weights, a.doc_weights)
    expected = torch.softmax(joined.state.logits[0].float(), dim=-1)  # T = 0: untempered
    torch.testing.assert_close(b.probs, expected)


def test_a_joined_context_puts_back_a_single_left_out_chunk():
    import math

    from tandem.models.tiny import ByteTokenizer
    from tandem.protocols.dragon.knowledge import (
        Knowledge,
        RetrievedDoc,
        joined_context,
        listed,
        named,
    )
    from tandem.retrieval.embedder import HashingEmbedder
    from tandem.retrieval.search import GAP

    text = " ".join(f"Paragraph {i} says {i * 7} things." * 3 for i in range(12))
    knowledge = Knowledge.from_texts([text], HashingEmbedder(64), tokenizer=ByteTokenizer())
    chunks = knowledge.retriever.lookup.chunks
    assert len(chunks) >= 6

    def doc(position):
        c = chunks[position]
        return RetrievedDoc(f"{c.doc_id}#{position}", c.text, 0.5, c.doc_id, position)

    docs = [doc(2), doc(0), doc(5)]  # left out: 1 (one chunk), 3-4 (two)
    filled = knowledge.filled(docs)
    assert [d.position for d in filled] == [0, 1, 2, 5]  # laid out as the context holds them
    assert math.isnan(filled[1].score) and [d.score for d in filled if d.position != 1] == [0.5] * 3
    assert filled[1].text == chunks[1].text and filled[1].doc_id == f"{chunks[1].doc_id}#1"
    assert joined_context(filled).count(GAP) == 1  # between 2 and 5
    assert [d.position for d in knowledge.filled(docs, fill=2)] == [0, 1, 2, 3, 4, 5]
    assert [d.position for d in knowledge.filled(docs, fill=0)] == [0, 2, 5]
    assert [d.position for d in Knowledge().filled(docs)] == [0, 2, 5]  # no corpus to fill from
    retrieved, put_back = named(filled)  # as the reports keep them
    assert [d.put_back for d in filled] == [False, True, False, False]
    assert (retrieved, put_back) == (
        [filled[0].doc_id, filled[2].doc_id, filled[3].doc_id],
        [filled[1].doc_id],
    )
    assert listed(["a#0", "a#2"], ["a#1"]) == "a#0, a#2 (and a#1 put back between them)"
    assert listed(["a#0"], []) == "a#0" and listed([], []) == ""


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_row_per_side_equals_its_central_reference(tiny_lm, tiny_lm_b, corpora, temperature):
    cfg = config(rows="side", temperature=temperature, seed=5)
    pair = central(tiny_lm, tiny_lm_b, corpora, cfg)
    expected = pair.greedy() if temperature == 0 else pair.sampled()
    device, cloud = dragon(tiny_lm, tiny_lm_b, corpora, cfg, link=LINK)
    assert device.tokens == expected and cloud.tokens == expected


def test_rows_must_be_documents_or_side():
    from tandem.errors import TandemError

    with pytest.raises(TandemError, match="rows must be one of documents, side"):
        config(rows="pages")


SLOW_LINK = LinkConfig(delay_ms=40.0, jitter_ms=5.0, seed=3)


@pytest.mark.parametrize(
    ("branch", "strategy", "temperature"),
    [
        ("peer", "device", 1.0), ("peer", "cloud", 1.0), ("peer", "dragon", 0.0),
        ("own", "device", 1.0), ("own", "cloud", 1.0), ("own", "dragon", 0.0),
    ],
)  # fmt: skip
def test_branch_drafts_are_used_and_change_nothing_but_timing(
    tiny_lm, tiny_lm_b, corpora, branch, strategy, temperature
):
    """Over a link whose round trip is worth many tiny-model decodes, the side that does not
    aggregate makes branch drafts (after the peer's differing token, or after its own second
    choice) and some are adopted (how many depends on timing and on the tiny models' random
    draws: with a fixed aggregator and sampling, one of the first few seeds adopts some;
    greedy "own" branches of these random models were never the target); the output is still
    the centralised reference's, token for token, as without branches."""
    adoptions = 0
    for seed in (5, 6, 7, 8):  # until a run adopts (every run must match its reference)
        cfg = config(  # without mirroring: with it a "peer" pair is resolved when it is complete
            strategy=strategy, temperature=temperature, seed=seed, max_new_tokens=24,
            branch=branch, mirror=False,
        )  # fmt: skip
        reference = central(tiny_lm, tiny_lm_b, corpora, cfg)
        expected = reference.greedy() if temperature == 0 else reference.sampled()
        device, cloud = dragon(tiny_lm, tiny_lm_b, corpora, cfg, link=SLOW_LINK)
        assert device.tokens == expected and cloud.tokens == expected
        adopted = device.branches_adopted
        assert adopted == cloud.branches_adopted  # both sides adopt the same branches
        if strategy == "dragon":
            break
        assert device.branches_made + cloud.branches_made > 0  # the other side branches
        adoptions += sum(adopted.values())
        if adoptions:
            break
    if strategy != "dragon":  # a fixed aggregator
        assert adoptions > 0
    off = dragon(
        tiny_lm, tiny_lm_b, corpora, dataclasses.replace(cfg, branch="off"), link=SLOW_LINK
    )
    assert off[0].tokens == expected and off[0].branches_made + off[1].branches_made == 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_mirroring_changes_nothing_but_timing(tiny_lm, tiny_lm_b, corpora, strategy, temperature):
    """With `mirror` the side that does not aggregate resolves each position itself from the
    two drafts it holds (the aggregator's verdicts only confirm, a mismatch would fail the
    session): the output is still the centralised reference's on a 40 ms link, every strategy,
    greedy and sampled; both sides resolved every position, the one that does not aggregate
    without waiting for verdicts."""
    cfg = config(strategy=strategy, temperature=temperature, seed=5, max_new_tokens=24, mirror=True)
    reference = central(tiny_lm, tiny_lm_b, corpora, cfg)
    expected = reference.greedy() if temperature == 0 else reference.sampled()
    device, cloud = dragon(tiny_lm, tiny_lm_b, corpora, cfg, link=SLOW_LINK)
    assert device.tokens == expected and cloud.tokens == expected
    assert not device.degraded and device.finish_reason == "length"
    assert len(device.resolutions) == len(cloud.resolutions) == len(expected)
    if strategy == "cloud":  # the device never aggregates: it resolved without verdicts
        assert device.mirrored > 0 and cloud.mirrored == 0
    if strategy == "device":
        assert cloud.mirrored > 0 and device.mirrored == 0
    if strategy == "dragon":  # no placement is faster, so the aggregator never moves
        assert device.switches == cloud.switches == [] and device.aggregated_by("device") > 0
    if strategy == "random":  # the control still moves it
        assert device.switches and cloud.switches


def test_sessions_free_their_rows_at_the_end(tiny_lm, tiny_lm_b, corpora, monkeypatch):
    """Each side frees its decoder's rows when the session ends, without waiting for the
    cyclic collector (llama.cpp: rows left in use slow every later decode of the process)."""
    import gc

    freed = {"device": [], "cloud": []}
    monkeypatch.setattr(tiny_lm, "free", freed["device"].append, raising=False)
    monkeypatch.setattr(tiny_lm_b, "free", freed["cloud"].append, raising=False)
    gc.disable()
    try:
        device, cloud = dragon(tiny_lm, tiny_lm_b, corpora, config(), link=LINK)
    finally:
        gc.enable()
    assert device.tokens == cloud.tokens and not device.degraded
    assert len(freed["device"]) == 1 and len(freed["cloud"]) == 1
    rows = config().docs_per_side  # one row per document
    assert freed["device"][0].batch == freed["cloud"][0].batch == rows


@pytest.mark.parametrize("faster", ["device", "cloud"])
def test_the_cloud_picks_the_first_aggregator_at_ready(
    tiny_lm, tiny_lm_b, corpora, monkeypatch, faster
):
    """Offline profiles far apart and a 200 ms round trip: the cloud's READY places the first
    aggregator where `Scheduler.first` puts it (on the cloud when the device is the faster
    side, else on the device); both sides agree, position 0 is resolved there without a
    switch message, and the output is the centralised reference's. (The scheduler may move
    the aggregator after it, once it has seen outcomes.) Mirrored (the default) it stays.
    The device's drafts that reach the cloud before its READY correct the device's profile
    toward the tiny model's real draft time (a few ms), so the fast side's profile is 0 and
    the slow side's 0.2 s: the pick is the same whichever estimate of the device it uses."""
    from tandem.protocols.dragon.profiler import LatencyModel
    from tandem.protocols.dragon.session import DragonSide

    monkeypatch.setattr(DragonSide, "_round_trip", lambda self: 0.2)
    cfg = config(mirror=False)  # mirrored, no placement is faster: it stays on the device
    expected = central(tiny_lm, tiny_lm_b, corpora, cfg).greedy()
    fast, slow = LatencyModel(intercept=0.0), LatencyModel(intercept=0.2)
    profiles = {"device_profile": fast, "cloud_profile": slow}
    if faster == "cloud":
        profiles = {"device_profile": slow, "cloud_profile": fast}
    device, cloud = dragon(tiny_lm, tiny_lm_b, corpora, cfg, link=LINK, **profiles)
    first = "cloud" if faster == "device" else "device"
    assert device.tokens == cloud.tokens == expected
    assert device.first_aggregator == cloud.first_aggregator == first
    assert device.summary()["first_aggregator"] == first
    assert device.resolutions[0]["by"] == cloud.resolutions[0]["by"] == first
    mirrored, _ = dragon(tiny_lm, tiny_lm_b, corpora, config(), link=LINK, **profiles)
    assert mirrored.tokens == expected and mirrored.first_aggregator == "device"
