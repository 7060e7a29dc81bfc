"""DRAGON: distributed RAG with Speculative Aggregation and a live aggregator scheduler.

Each side (device, cloud) retrieves from its own corpus only and decodes one row per
document; the two locally aggregated laws are merged token by token by Algorithm 1 on
whichever side holds the aggregator. Modules, bottom up (docs/dragon.md shows how they fit):

    config      DragonConfig (shared settings), sides, position seeds
    prompt      one row = document prefix + question suffix
    decoder     DocDecoder (batched rows, sync-to-prefix rollback), RelevanceSchedule, SideLaw
    knowledge   a side's corpus (Knowledge) and build_decoder(question)
    queues      Draft, make_draft (drafts drawn from the transmitted law), DraftQueue
    aggregator  aggregate_step (Algorithm 1 on a pair of drafts), expected acceptance
    scheduler   Eq. 7/8, Theorem 6.2, Scheduler (dragon | device | cloud | random)
    profiler    LatencyModel (offline fit + online slope), AcceptanceTracker, LinkEstimator
    worker      DraftWorker: the decoder thread, cancel + rollback on rejection
    wire        DRAGON events <-> tandem.transport messages
    session     DragonSide: one side's live session (queues, aggregation, switching, faults)
    report      SideReport: the measurements of one side
    runner      run_device, serve_cloud, start_cloud, connect_device, run_pair
    reference   CentralPair: the centralised greedy / token-wise references
"""

from tandem.protocols.dragon.config import CLOUD, DEVICE, SIDES, STRATEGIES, DragonConfig
from tandem.protocols.dragon.knowledge import Knowledge
from tandem.protocols.dragon.report import SideReport
from tandem.protocols.dragon.runner import (
    connect_device,
    run_device,
    run_pair,
    serve_cloud,
    start_cloud,
)

__all__ = [
    "CLOUD",
    "DEVICE",
    "SIDES",
    "STRATEGIES",
    "DragonConfig",
    "Knowledge",
    "SideReport",
    "connect_device",
    "run_device",
    "run_pair",
    "serve_cloud",
    "start_cloud",
]
