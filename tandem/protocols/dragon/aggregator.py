"""The aggregator: one step of Speculative Aggregation on a pair of drafts (Algorithm 1).

Words used here:
- *outcome*: the target token of a position and whether each side's draft was accepted
  (a draft is accepted iff it equals the target token).
- The device's draft always takes Algorithm 1's `local` slot and the cloud's the `remote`
  slot, and the step draws from the position seed (seed, "aggregate", position). So the
  target token does not depend on which side runs the aggregator: moving the aggregator
  changes latency, never the output.

The math lives in `tandem.sampling.aggregation`; this module only feeds it drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.protocols.dragon.config import CLOUD, DEVICE
from tandem.protocols.dragon.queues import Draft
from tandem.sampling.aggregation import (
    acceptance_rates,
    greedy_aggregate_kept,
    speculative_aggregate,
)
from tandem.sampling.seeds import position_generator


@dataclass(frozen=True)
class Outcome:
    position: int
    token: int
    accepted: dict[str, bool]  # side -> accepted


def aggregate_step(device: Draft, cloud: Draft, *, seed: int, greedy: bool) -> Outcome:
    """Algorithm 1 on the two drafts of one position."""
    assert device.side == DEVICE and cloud.side == CLOUD, (device.side, cloud.side)
    assert device.position == cloud.position, (device.position, cloud.position)
    if greedy and device.values is not None and cloud.values is not None:
        # both in the kept form: the argmax on the union of the kept ids, no [vocab] array
        token = greedy_aggregate_kept(
            (device.support.numpy(), device.values),
            (cloud.support.numpy(), cloud.values),
            device.logweight,
            cloud.logweight,
        )
        accepted = {DEVICE: device.token == token, CLOUD: cloud.token == token}
        return Outcome(position=device.position, token=token, accepted=accepted)
    token, device_ok, cloud_ok = speculative_aggregate(
        device.token,
        device.sent_probs,
        cloud.token,
        cloud.sent_probs,
        device.logweight,
        cloud.logweight,
        position_generator(seed, "aggregate", device.position),
        greedy=greedy,
    )
    return Outcome(
        position=device.position, token=token, accepted={DEVICE: device_ok, CLOUD: cloud_ok}
    )


def expected_acceptance(device: Draft, cloud: Draft) -> dict[str, float]:
    """Paper Eq. 5 for both drafts' laws (the scheduler's acceptance estimate)."""
    alpha_device, alpha_cloud = acceptance_rates(
        device.sent_probs, cloud.sent_probs, device.logweight, cloud.logweight
    )
    return {DEVICE: alpha_device, CLOUD: alpha_cloud}
