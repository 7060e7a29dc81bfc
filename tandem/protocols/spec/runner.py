"""Entry points: both sides in one process (tests, benchmarks) or the device over TCP.

- `run_pair(...)`: device and cloud joined by `memory_pair` (optionally an emulated link).
- `connect_device(...)`: connect to a cloud over TCP and run the device side.
The cloud side as a server lives in `tandem.serve.cloud` (it dispatches several modes).
"""

from __future__ import annotations

from tandem.models.base import CausalLM
from tandem.protocols.decoding import OnToken
from tandem.protocols.pair import run_in_process
from tandem.protocols.spec.cloud import serve_session
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.device import run_device
from tandem.protocols.spec.planner import Controller
from tandem.protocols.spec.stats import SpecReport
from tandem.transport import LinkConfig, TransportConfig, connect


async def run_pair(
    *,
    device_lm: CausalLM,
    cloud_lm: CausalLM,
    prompt_ids: list[int],
    config: SpecConfig,
    link: LinkConfig | None = None,
    on_token: OnToken | None = None,
    controller: Controller | None = None,
) -> tuple[SpecReport, dict | None]:
    """One generation with both sides in this process; returns (device report, cloud stats).
    `controller`: the eager pipeline's adaptive controller (planner.py)."""
    return await run_in_process(
        lambda channel, _: run_device(
            channel, device_lm, prompt_ids, config, on_token=on_token, controller=controller
        ),
        lambda channel: serve_session(channel, cloud_lm),
        link=link,
    )


async def connect_device(
    host: str,
    port: int,
    *,
    transport: TransportConfig,
    lm: CausalLM,
    prompt_ids: list[int],
    config: SpecConfig,
    on_token: OnToken | None = None,
) -> SpecReport:
    """Connect to a cloud over TCP and run the device side of one generation."""
    channel = await connect(host, port, config=transport)
    return await run_device(channel, lm, prompt_ids, config, on_token=on_token)
