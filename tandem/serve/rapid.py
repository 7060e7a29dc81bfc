"""Entry points behind `tandem rapid ...`: whole runs from model names, files and flags.

- `run_local`: retrieve, then RAPID (and, with `compare`, the LC and SD baselines on the same
  prefills) on one machine.
- `serve_cloud` / `run_device`: the edge-cloud split over TCP (`tandem.transport`); the cloud
  (the one `tandem.serve.cloud.CloudServer`, rapid mode only; `tandem cloud serve
  --long-context FILE` serves it beside every other mode) holds the long context, the device retrieves C^S from its own copy of the text. The device
  goes through the serving backend (`tandem.serve.api.retrieval.RapidBackend`), so a cloud
  that is unreachable or lost mid-answer is a fallback: the drafter finishes alone from the
  tokens already verified.
"""

from __future__ import annotations

import time
from typing import Any

from tandem.models.base import CausalLM
from tandem.protocols.rapid.config import RapidConfig, RetrievalConfig
from tandem.protocols.rapid.engine import RapidResult, check_pair, rapid
from tandem.protocols.rapid.prompts import drafter_prompt, target_prompt
from tandem.protocols.rapid.retrieval import retrieve
from tandem.protocols.rapid.states import Prefilled
from tandem.transport import loop as event_loop


def summary(name: str, result: RapidResult) -> dict[str, Any]:
    return {
        "method": name,
        "tokens": len(result.tokens),
        "prefill_s": round(result.prefill_s, 3),
        "decode_s": round(result.decode_s, 3),
        "tokens_per_s": round(result.tokens_per_s, 3),
        "acceptance": round(result.acceptance_rate, 3) if result.drafted else None,
        "text": result.text,
    }


def run_local(
    target_lm: CausalLM,
    drafter_lm: CausalLM,
    context: str,
    question: str,
    *,
    config: RapidConfig,
    retrieval: RetrievalConfig,
    embedder_name: str,
    compare: bool = False,
) -> list[dict[str, Any]]:
    """RAPID on one machine; with `compare`, LC and SD too (sharing the prefills)."""
    from tandem.baselines.rapid_baselines import lc, sd
    from tandem.retrieval.embedder import load_embedder

    check_pair(target_lm, drafter_lm)
    retrieved = retrieve(
        context, question, drafter_lm.tokenizer, load_embedder(embedder_name), retrieval
    )
    target = Prefilled(target_lm, target_prompt(target_lm.tokenizer, context, question))
    drafter = Prefilled(drafter_lm, drafter_prompt(drafter_lm.tokenizer, retrieved.text, question))
    rows = [summary(f"rapid-{config.mode}", rapid(target, drafter, config))]
    if compare:
        rows.append(summary("sd", sd(target, drafter, config)))
        rows.append(summary("lc", lc(target, config)))
    for row in rows:
        row.update(
            context_tokens=retrieved.context_tokens,
            retrieved_tokens=retrieved.tokens,
            retrieve_s=round(retrieved.retrieve_s, 3),
        )
    return rows


async def _serve(target_lm: CausalLM, context: str, host: str, port: int, secret: bytes) -> None:
    """The one cloud server (tandem.serve.cloud), serving only the rapid mode."""
    from tandem.serve.cloud import CloudServer, cloud_resources
    from tandem.transport import TransportConfig

    resources = cloud_resources(target_lm, batching=False)
    resources.extra["long_context"] = context
    cloud = CloudServer(resources, modes=["rapid"])
    server = await cloud.start(
        host, port, transport=TransportConfig.for_model(target_lm, role="cloud", secret=secret)
    )
    print(f"RAPID cloud serving {target_lm.name} on {host}:{server.port}", flush=True)
    try:
        await server.serve_forever()
    finally:
        await server.close()
        await cloud.close()


def serve_cloud(target_lm: CausalLM, context: str, *, host: str, port: int, secret: bytes) -> None:
    event_loop.run(_serve(target_lm, context, host, port, secret))


def run_device(
    drafter_lm: CausalLM,
    local_text: str,
    question: str,
    *,
    host: str,
    port: int,
    secret: bytes,
    config: RapidConfig,
    retrieval: RetrievalConfig,
    embedder_name: str,
    codec: tuple[str, dict],
    fallback: bool = True,
) -> dict[str, Any]:
    """Retrieve C^S from the device's own text, then draft for the cloud's target."""
    from tandem.retrieval.embedder import load_embedder
    from tandem.serve.api.backends import GenParams
    from tandem.serve.api.retrieval import RapidBackend
    from tandem.transport import TransportConfig

    retrieved = retrieve(
        local_text, question, drafter_lm.tokenizer, load_embedder(embedder_name), retrieval
    )
    transport = TransportConfig.for_model(drafter_lm, role="device", secret=secret)
    backend = RapidBackend(drafter_lm, host=host, port=port, transport=transport, rapid=config,
                           codec=codec)  # fmt: skip
    backend.fallback = fallback
    params = GenParams(max_tokens=config.max_new_tokens, temperature=config.temperature,
                       seed=config.seed, question=question, context=retrieved.text)  # fmt: skip
    start = time.perf_counter()
    out = backend.generate([], params, lambda _token: None)
    elapsed = time.perf_counter() - start
    if out.report is not None:
        row = summary(f"rapid-{config.mode} (edge)", out.report)
        row.update(out.report.extra)
    else:
        row = {"method": f"rapid-{config.mode} (edge, fell back at {out.degraded_at})",
               "tokens": len(out.tokens), "text": drafter_lm.tokenizer.decode(out.tokens),
               "prefill_s": 0.0, "decode_s": round(elapsed, 3),
               "tokens_per_s": round(len(out.tokens) / elapsed, 3) if elapsed > 0 else 0.0,
               "acceptance": None,
               "uplink_bytes": out.info.get("bytes_up", 0),
               "downlink_bytes": out.info.get("bytes_down", 0),
               "degraded_reason": out.degraded_reason}  # fmt: skip
    row.update(retrieved_tokens=retrieved.tokens)
    return row
