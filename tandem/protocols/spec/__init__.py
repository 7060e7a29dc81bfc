"""Edge-cloud speculative decoding: stop-and-wait, PicoSpec's async pipeline, SQS uplinks.

The device drafts with a small model, the cloud verifies with a large one over a real
channel. Modules, bottom up (docs/spec.md shows how they fit):

    config     SpecConfig (shared settings), position generators
    context    LMContext: a model + its token sequence, fed lazily, rolled back by cropping
    separate   PicoSpec's separate rejection sampling: top-K downlink, exact law, TV error
    drafter    Drafter: the device's state (drafts, epochs, QS sampling, verdicts, rollback)
    verifier   Verifier: the cloud's state (one forward pass per request, exact verification)
    eager      pipeline "eager" (the cloud never idles): EagerVerifier (AR steps, chains,
               content checks), EagerDrafter (adopts committed tokens); the exactness argument
    wire       events <-> tandem.transport messages
    device     DeviceSession: sync / async / eager pipelines over a Channel (interrupt = cancel)
    cloud      CloudSession: merges requests (fast verification), verifies, answers
    stats      SpecReport: throughput, TTFT, TPOT, T_draft, T_verify, acceptance, bytes
    theory     PicoSpec Eq. 5, 7, 9 (expected length, step time, throughput)
    planner    cost model of every exact method (Eq. 9 extended to eager) + adaptive Controller
    runner     run_pair (both sides in one process), connect_device (TCP)
"""

from tandem.protocols.spec.config import CODECS, PIPELINES, SpecConfig
from tandem.protocols.spec.runner import connect_device, run_pair
from tandem.protocols.spec.stats import SpecReport

__all__ = ["CODECS", "PIPELINES", "SpecConfig", "SpecReport", "connect_device", "run_pair"]
