"""DRAGON's baselines (paper Sec. 7.2): CRCG/Device, CRCG/Cloud, DRCG/Text, DRCG/KV, DRDG/TW,
DRDG/SW, with DRAGON's models, corpora, prompts, settings and transport.

    context   context aggregation: the concatenated prompt (leading KV block + rest), local
              generation, KV state <-> bytes
    device    the device side of each method (`run_crcg_device`, `run_baseline_device`),
              `BaselineReport`, DRDG/SW's sequence rule
    cloud     the cloud side (`serve_baseline`), `serve_any` (DRAGON or a baseline by the
              first message), `cloud_main` (a cloud process for the benchmarks)

`run_baseline_pair(method, ...)` runs both sides in this process over `memory_pair`
(optionally an emulated link), like `tandem.protocols.dragon.run_pair` does for DRAGON.
docs/dragon-baselines.md says what each method measures and how it reads the paper.
"""

from __future__ import annotations

import asyncio

from tandem.baselines.dragon.device import (
    METHODS,
    NETWORK_METHODS,
    BaselineReport,
    run_baseline_device,
    run_crcg_device,
    sequence_choice,
)
from tandem.protocols.dragon.config import DragonConfig
from tandem.protocols.dragon.knowledge import Knowledge
from tandem.protocols.pair import run_in_process
from tandem.transport import LinkConfig


async def run_baseline_pair(
    method: str,
    *,
    device_lm,
    cloud_lm,
    device_knowledge: Knowledge,
    cloud_knowledge: Knowledge,
    question: str,
    config: DragonConfig,
    link: LinkConfig | None = None,
) -> tuple[BaselineReport, dict | None]:
    """(device report, cloud stats) of one baseline run; CRCG/Device runs alone."""
    if method == "crcg-device":
        report = await asyncio.to_thread(
            run_crcg_device, lm=device_lm, knowledge=device_knowledge, question=question,
            config=config,
        )  # fmt: skip
        return report, None
    from tandem.baselines.dragon.cloud import serve_any

    return await run_in_process(
        lambda channel, _: run_baseline_device(
            method, channel, lm=device_lm, knowledge=device_knowledge, question=question,
            config=config,
        ),
        lambda channel: serve_any(channel, lm=cloud_lm, knowledge=cloud_knowledge),
        link=link,
        cloud_wait_s=60.0,
    )  # fmt: skip


def __getattr__(name: str):
    """The cloud side's entry points, imported on first use: the package does not import
    `cloud`, which runs as `python -m tandem.baselines.dragon.cloud` (imported first by its
    package, runpy would execute the module a second time, and warns that it does)."""
    if name in ("serve_any", "serve_baseline"):
        from tandem.baselines.dragon import cloud

        return getattr(cloud, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "METHODS",
    "NETWORK_METHODS",
    "BaselineReport",
    "run_baseline_device",
    "run_baseline_pair",
    "run_crcg_device",
    "sequence_choice",
    "serve_any",
    "serve_baseline",
]
