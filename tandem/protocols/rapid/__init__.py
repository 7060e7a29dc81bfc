"""RAPID: a RAG drafter (short retrieved context C^S) speculates for a long-context target
(the whole context C), verified against the retrieval-augmented target p_hat.

Modules, bottom up:
- `config`: RapidConfig (drafting, verification) and RetrievalConfig (chunks, budget);
- `retrieval`: C^S out of C (chunk, embed, threshold, budget), its bounds;
- `prompts`: the target's and the drafter's prompts (the authors' wording);
- `states`: block prefill of long prompts, `Prefilled` (one prefill shared by methods);
- `drafter`: `ModelDrafter`, the decoding core's `Drafter` (drafts sampled from the sent law);
- `engine`: RAPID on the one decoding core (`tandem.protocols.decoding`: `Target` verifying
  under the rule `tandem.sampling.acceptance.Augmented`, exact / paper mode; `Standard` for
  plain SD), `rapid`, `run_rapid`, plain decoding (no drafter);
- `edge`: the same split over `tandem.transport` (device drafts, cloud verifies);
- `tasks`: the offline long-context task set from the stdlib docs;
- `runner`: what `tandem rapid ...` calls.
Baselines (LC, RAG, SD, StreamingLLM drafter) are in `tandem.baselines.rapid_baselines`;
the benchmark in `benchmarks.rapid`; the output law of each mode in docs/rapid.md.
"""

from tandem.protocols.rapid.config import RapidConfig, RetrievalConfig
from tandem.protocols.rapid.engine import RapidResult, rapid, run_rapid

__all__ = ["RapidConfig", "RapidResult", "RetrievalConfig", "rapid", "run_rapid"]
