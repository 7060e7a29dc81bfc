"""The device runtime: one generation in a given mode, against a cloud or alone.

    mode     what runs                                          network
    spec     speculative decoding (sync / async / eager pipeline)  yes
             (eager with an adaptive controller that plans cloud AR runs as `ar`)
    ar       cloud autoregressive baseline (tokens streamed)    yes
    local    the device model alone                             no

`run_generation` connects (for the network modes), runs, closes, and returns a SpecReport.
Connection problems surface as one-line TandemErrors (`ConnectError`, `HandshakeError`).
The device's HTTP API (`tandem device serve`, docs/serving.md) lives in `tandem.serve.api`;
its spec backend drives `tandem.protocols.spec.device.run_device` directly, so it can keep the
committed tokens and finish alone when the cloud is lost.
"""

from __future__ import annotations

from tandem.errors import ModeNotServed, TandemError
from tandem.models.base import CausalLM
from tandem.protocols.decoding import OnToken
from tandem.protocols.spec.config import SpecConfig
from tandem.protocols.spec.device import run_device
from tandem.protocols.spec.planner import Controller, Generations
from tandem.protocols.spec.stats import SpecReport
from tandem.transport import TransportConfig, connect

DEVICE_MODES = ("spec", "ar", "local")


async def run_generation(
    mode: str,
    *,
    lm: CausalLM,
    prompt_ids: list[int],
    config: SpecConfig,
    host: str = "127.0.0.1",
    port: int = 7700,
    transport: TransportConfig | None = None,
    on_token: OnToken | None = None,
    controller: Controller | None = None,
) -> SpecReport:
    """One generation in `mode` (see the module docstring); `controller`: the eager pipeline's
    adaptive controller (tandem.protocols.spec.planner), kept by the caller across generations;
    its plan before the generation (planner.Generations, without exploring) may be the cloud's
    AR stream."""
    from tandem.baselines.spec_baselines import run_cloud_ar, run_device_only

    if mode not in DEVICE_MODES:
        raise TandemError(f"unknown mode {mode!r}; choose one of {', '.join(DEVICE_MODES)}")
    if not prompt_ids:
        raise TandemError("the prompt is empty")
    if mode == "local":
        return run_device_only(lm, prompt_ids, config, on_token=on_token)
    transport = transport or TransportConfig.for_model(lm, role="device", secret=None)
    adaptive = None
    if mode == "spec" and controller is not None and config.pipeline == "eager":
        adaptive = Generations(controller)
    if mode == "ar" or (adaptive and adaptive.plan() == "ar"):
        channel = await connect(host, port, config=transport)
        try:
            report = await run_cloud_ar(
                channel, lm.tokenizer, prompt_ids, config, on_token=on_token
            )
        except ModeNotServed:
            if mode == "ar":
                raise  # else this cloud streams AR only inside the eager pipeline: run that
            adaptive.not_served()
        else:
            if adaptive:
                adaptive.measured_ar(report.summary()["tpot_ms"])
            return report
    channel = await connect(host, port, config=transport)
    return await run_device(
        channel, lm, prompt_ids, config, on_token=on_token, controller=controller
    )
