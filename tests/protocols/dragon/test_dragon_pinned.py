"""DRAGON in one process with each side's model pinned to its own cores (what `tandem bench
dragon scheduling` records with): the decoder threads call the models through
`tandem.testbed.pinned`, and the output still equals the centralised greedy reference."""

from __future__ import annotations

from tandem.testbed.cpus import plan
from tandem.testbed.pinned import pinned

from .conftest import central_pair, tiny_config
from .test_dragon_end_to_end import LINK, dragon


def test_pinned_sides_reproduce_central_greedy(tiny_lm, tiny_lm_b, corpora):
    cfg = tiny_config(max_new_tokens=12, seed=11)
    expected = central_pair(tiny_lm, tiny_lm_b, corpora, cfg).greedy()
    observed: dict = {}
    with pinned({"device": tiny_lm, "cloud": tiny_lm_b}, plan(), observed) as sides:
        device, cloud = dragon(sides["device"], sides["cloud"], corpora, cfg, link=LINK)
    assert device.tokens == expected and cloud.tokens == expected
    assert device.rollbacks + cloud.rollbacks > 0  # the decoder threads re-drafted, pinned
    assert {role: seen["cpus"] for role, seen in observed.items()} == plan()
