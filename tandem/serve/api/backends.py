"""One generation in one mode, behind a one-method protocol (`Backend.generate`).

Words used here:
- *params*: what a request asks for (`GenParams`: token budget, sampling, seed, and the raw
  text for the modes that build their own prompt).
- *on_token(token_id)*: called in order for every token the answer commits, as soon as it is
  known. It may raise `StopGeneration` (a stop string was seen, the client left); a backend
  then ends at once and returns what it has.
- *degraded*: the cloud was unreachable or died; the device finished the answer with its own
  model from the tokens already committed (none lost, none repeated). `degraded_at` is the
  first position the device produced alone.

`generate` is synchronous and runs in the engine's worker thread (it may run its own event
loop); backends connect to the cloud per request, so a cloud that comes back is used again by
the next request.

Why one file: the protocol, its result and the fallback every cloud mode shares (`Recorder`,
`finish_alone`) sit beside the backends of the modes without retrieval (local, spec, ar,
fake), which are each a few dozen lines over `CloudBackend`; the retrieval modes, which bring
their corpora, live in retrieval.py.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Protocol

from tandem.config import SamplingConfig
from tandem.errors import ModeNotServed, TandemError
from tandem.models.base import CausalLM
from tandem.protocols.decoding import OnToken
from tandem.protocols.report import finish_of
from tandem.protocols.spec.config import DEVICE_CODEC, NOT_EAGER_CODECS
from tandem.transport import TransportConfig, TransportError
from tandem.transport import loop as event_loop

log = logging.getLogger("tandem.serve.api")


class StopGeneration(Exception):
    """Raised by on_token: end the generation now (stop string seen, client gone)."""


@dataclass(frozen=True, kw_only=True)
class GenParams:
    max_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float | None = None
    top_k: int | None = None
    seed: int = 0
    question: str = ""  # the user's own text (dragon / rapid build their prompts from it)
    context: str | None = None  # rapid: the device's local text (C^S), per request


@dataclass
class GenResult:
    tokens: list[int]
    finish_reason: str  # "length" | "eos" | "stop" (ended by on_token)
    degraded: bool = False
    degraded_reason: str = ""
    degraded_at: int | None = None
    info: dict = field(default_factory=dict)  # the mode's numbers for the `tandem` object
    report: object | None = field(default=None, repr=False)  # the protocol's own report


class Backend(Protocol):
    mode: str
    lm: CausalLM  # the device model (its tokenizer renders prompts)
    needs_context: bool  # rapid: a request must carry `tandem_context`

    def generate(self, prompt_ids: list[int], params: GenParams, on_token: OnToken) -> GenResult:
        """One generation; see the module docstring."""
        ...

    async def cloud_reachable(self) -> bool | None:
        """Whether a session with the cloud opens now (None: this mode has no cloud)."""
        ...


class Recorder:
    """Wraps on_token, keeping the committed tokens (a fallback continues from them)."""

    def __init__(self, on_token: OnToken) -> None:
        self.tokens: list[int] = []
        self._on_token = on_token

    def __call__(self, token: int) -> None:
        self.tokens.append(token)
        self._on_token(token)


def local_continue(
    lm: CausalLM, prompt_ids: list[int], params: GenParams, recorder: Recorder
) -> None:
    """The device model alone, from prompt + the tokens already committed, to the budget."""
    from tandem.protocols.local import generate

    left = params.max_tokens - len(recorder.tokens)
    eos = lm.tokenizer.eos_token_id
    if left <= 0 or (recorder.tokens and recorder.tokens[-1] == eos):
        return
    config = SamplingConfig(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=params.seed + len(recorder.tokens),
        max_new_tokens=left,
    )
    generate(lm, [*prompt_ids, *recorder.tokens], config, on_token=recorder)


def reason_of(exc: BaseException) -> str:
    """An exception as one line (why the cloud could not finish the answer)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def finish_alone(
    lm: CausalLM,
    prompt_ids: list[int],
    params: GenParams,
    recorder: Recorder,
    reason: str,
    info: dict | None = None,
) -> GenResult:
    """The cloud failed: the device model finishes the answer from the tokens committed so far
    (`prompt_ids` is the device's own prompt for the mode), nothing lost or repeated."""
    at = len(recorder.tokens)
    log.warning("cloud lost at token %d (%s): the device finishes the answer alone", at, reason)
    try:
        local_continue(lm, prompt_ids, params, recorder)
        finish = finish_of(recorder.tokens, lm.tokenizer.eos_token_id)
    except StopGeneration:
        finish = "stop"
    return GenResult(recorder.tokens, finish, degraded=True, degraded_reason=reason,
                     degraded_at=at, info=info if info is not None else {})  # fmt: skip


async def probe_cloud(host: str, port: int, transport: TransportConfig) -> bool:
    """Open a session (handshake included) and close it at once."""
    from tandem.transport import connect

    try:
        channel = await connect(host, port, config=transport)
    except (TransportError, TandemError, OSError):
        return False
    with contextlib.suppress(TransportError, OSError):
        await channel.close("health probe")
    return True


class FakeBackend:
    """A scripted backend for HTTP tests: emits `script` (cycled) without any model."""

    needs_context = False

    def __init__(self, lm, script: list[int], *, mode: str = "fake", degraded: bool = False):
        self.lm, self.script, self.mode, self.degraded = lm, script, mode, degraded
        self.calls: list[tuple[list[int], GenParams]] = []

    def generate(self, prompt_ids: list[int], params: GenParams, on_token: OnToken) -> GenResult:
        self.calls.append((list(prompt_ids), params))
        recorder = Recorder(on_token)
        try:
            for i in range(params.max_tokens):
                recorder(self.script[i % len(self.script)])
                if recorder.tokens[-1] == self.lm.tokenizer.eos_token_id:
                    break
        except StopGeneration:
            return GenResult(recorder.tokens, "stop", info={"calls": len(self.calls)})
        reason = "scripted" if self.degraded else ""
        return GenResult(
            recorder.tokens,
            finish_of(recorder.tokens, self.lm.tokenizer.eos_token_id),
            degraded=self.degraded,
            degraded_reason=reason,
            degraded_at=0 if self.degraded else None,
            info={"calls": len(self.calls)},
        )

    async def cloud_reachable(self) -> bool | None:
        return None


class LocalBackend:
    """The device model alone (tandem.protocols.local.generate)."""

    mode = "local"
    needs_context = False

    def __init__(self, lm: CausalLM) -> None:
        self.lm = lm

    def generate(self, prompt_ids: list[int], params: GenParams, on_token: OnToken) -> GenResult:
        recorder = Recorder(on_token)
        try:
            local_continue(self.lm, prompt_ids, params, recorder)
        except StopGeneration:
            return GenResult(recorder.tokens, "stop")
        return GenResult(
            recorder.tokens, finish_of(recorder.tokens, self.lm.tokenizer.eos_token_id)
        )

    async def cloud_reachable(self) -> bool | None:
        return None


@dataclass(frozen=True, kw_only=True)
class SpecSettings:
    """The speculative-decoding knobs of `tandem device serve` (SpecConfig minus sampling);
    pipeline "adaptive" = eager with the adaptive controller (SpecBackend). The defaults are
    the device's: `device_pipeline`, `DEVICE_CODEC`."""

    pipeline: str = "adaptive"
    codec: str = DEVICE_CODEC[0]
    codec_params: dict = field(default_factory=lambda: dict(DEVICE_CODEC[1]))
    draft_len: int = 4
    bit_budget: int | None = None
    downlink_k: int = 10
    fast_verify: bool = True
    truncate_factor: float = 2.0
    verify_calls: str = "block"
    branch_below: float = 0.0
    branch_len: int = 4


class CloudBackend:
    """A mode with a cloud: one session per request (`_collaborate`), and when the cloud cannot
    be reached or is lost mid-answer, the device model finishes alone from the tokens already
    committed (`finish_alone`)."""

    mode: str
    needs_context = False
    fallback = True  # False: a cloud failure is raised (`tandem device run --no-fallback`)

    def __init__(self, lm: CausalLM, *, host: str, port: int, transport: TransportConfig):
        self.lm, self.host, self.port, self.transport = lm, host, port, transport

    def config(self, params: GenParams):
        """The protocol's config for one request (a bad setting raises TandemError)."""
        raise NotImplementedError

    def alone_prompt(self, prompt_ids: list[int], params: GenParams) -> list[int]:
        """The device's prompt when it continues alone."""
        return prompt_ids

    async def _collaborate(self, prompt_ids, params: GenParams, config, recorder: Recorder, info):
        """One session with the cloud; calls `recorder` for every committed token; returns
        the protocol's report."""
        raise NotImplementedError

    def generate(self, prompt_ids: list[int], params: GenParams, on_token: OnToken) -> GenResult:
        recorder = Recorder(on_token)
        info: dict = {"bytes_up": 0, "bytes_down": 0}
        config = self.config(params)  # a bad setting is an error, not a reason to degrade
        try:
            report = event_loop.run(self._collaborate(prompt_ids, params, config, recorder, info))
        except StopGeneration:
            return GenResult(recorder.tokens, "stop", info=info)
        except (TandemError, TransportError, OSError) as exc:
            if not self.fallback:
                raise TandemError(reason_of(exc)) from None
            ids = self.alone_prompt(prompt_ids, params)
            return finish_alone(self.lm, ids, params, recorder, reason_of(exc), info)
        eos = self.lm.tokenizer.eos_token_id
        return GenResult(recorder.tokens, finish_of(recorder.tokens, eos), info=info,
                         report=report)  # fmt: skip

    async def _connect(self, info: dict):
        from tandem.transport import connect

        start = time.perf_counter()
        channel = await connect(self.host, self.port, config=self.transport)
        info["connect_s"] = time.perf_counter() - start
        return channel

    @staticmethod
    async def _close(channel, info: dict, why: str) -> None:
        info["bytes_up"] = channel.bytes_sent
        info["bytes_down"] = channel.bytes_received
        with contextlib.suppress(TransportError, OSError):
            await channel.close(why)

    async def cloud_reachable(self) -> bool | None:
        return await probe_cloud(self.host, self.port, self.transport)


def device_pipeline(pipeline: str | None, codec: str) -> str:
    """The serving pipeline a device runs: `pipeline` where one is named, else "adaptive" (the
    fastest exact choice it can measure: on HumanEval over the real pair it ran 1.18-1.31x
    PicoSpec's async pipeline at RTT 0-200 ms, side by side, humaneval_rtt*.json), or "async"
    for an uplink codec the eager pipeline cannot carry (separate, c-sqs)."""
    if pipeline is not None:
        return pipeline
    return "async" if codec in NOT_EAGER_CODECS else "adaptive"


def protocol_pipeline(pipeline: str) -> str:
    """The protocol's pipeline (SpecConfig.pipeline) of a serving pipeline name: "adaptive" runs
    the eager pipeline (with a controller, `SpecBackend`)."""
    return "eager" if pipeline == "adaptive" else pipeline


class SpecBackend(CloudBackend):
    """Device drafts, cloud verifies (`tandem cloud serve`); falls back to the device model.

    Pipeline "adaptive": the eager pipeline with one adaptive controller for the backend's
    life (tandem.protocols.spec.planner.Controller), so each request starts from what the
    earlier ones measured (the first plan speculates: `planner.UNMEASURED`). Before a request
    `planner.Generations` plans it: the cloud's plain AR stream, eager (its draft length, or no
    drafting, re-planned every round, and with `branch_below` whether to branch), or, after
    `explore_every` - 1 requests in a row planned as AR, eager with the controller exploring,
    to measure speculation again: a regime that turned in its favour (a shorter round trip, a
    busier cloud) is noticed within that many requests."""

    mode = "spec"
    explore_every = 16

    def __init__(
        self,
        lm: CausalLM,
        *,
        host: str,
        port: int,
        transport: TransportConfig,
        spec: SpecSettings | None = None,
    ) -> None:
        super().__init__(lm, host=host, port=port, transport=transport)
        self.spec = spec or SpecSettings()
        self.controller = self.generations = None
        if self.spec.pipeline == "adaptive":
            from tandem.protocols.spec.planner import UNMEASURED, Controller, Generations

            self.controller = Controller(prior=UNMEASURED, measure_first=True)
            self.generations = Generations(self.controller, explore_every=self.explore_every)

    def config(self, params: GenParams):
        from tandem.protocols.spec.config import SpecConfig

        spec = self.spec
        return SpecConfig(
            pipeline=protocol_pipeline(spec.pipeline),
            codec=spec.codec, codec_params=spec.codec_params,
            draft_len=spec.draft_len, bit_budget=spec.bit_budget, downlink_k=spec.downlink_k,
            fast_verify=spec.fast_verify, truncate_factor=spec.truncate_factor,
            verify_calls=spec.verify_calls, branch_below=spec.branch_below,
            branch_len=spec.branch_len, temperature=params.temperature,
            top_p=params.top_p, top_k=params.top_k, seed=params.seed,
            max_new_tokens=params.max_tokens, first_chunk=1,
        )  # fmt: skip

    async def _collaborate(self, prompt_ids, params: GenParams, config, recorder: Recorder, info):
        from tandem.protocols.spec.device import run_device

        generations, plan = self.generations, "eager"
        if generations is not None:
            plan = generations.plan()
            if plan == "ar":
                report = await stream_cloud_ar(
                    self, prompt_ids, config, recorder, info, optional=True
                )
                if report is not None:
                    generations.measured_ar(report.summary()["tpot_ms"])
                    info["plan"] = "ar"
                    return report
                plan = generations.not_served()
            info["plan"] = plan
        channel = await self._connect(info)
        try:
            with generations.running(plan) if generations else contextlib.nullcontext() as ctl:
                report = await run_device(
                    channel, self.lm, prompt_ids, config, on_token=recorder, close=False,
                    controller=ctl,
                )  # fmt: skip
            summary = report.summary()
            info.update(
                acceptance_rate=summary["acceptance_rate"],
                accepted_len=summary["accepted_len_incl_bonus"],
                verdicts=summary["verdicts"],
                t_verify_ms=summary["t_verify_ms"],
                network_ms=summary["network_ms"],
            )
        finally:
            rtt = channel.rtt
            if rtt is None and info.get("network_ms"):
                rtt = info["network_ms"] / 1e3
            info["rtt_s"] = rtt
            await self._close(channel, info, "spec done")
        return report


class CloudARBackend(CloudBackend):
    """The cloud model decodes alone and streams its tokens (the autoregressive baseline);
    the device only renders them, and finishes alone if the cloud is lost."""

    mode = "ar"

    def config(self, params: GenParams):
        from tandem.protocols.spec.config import SpecConfig

        return SpecConfig(
            temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            seed=params.seed, max_new_tokens=params.max_tokens,
        )  # fmt: skip

    async def _collaborate(self, prompt_ids, params: GenParams, config, recorder: Recorder, info):
        return await stream_cloud_ar(self, prompt_ids, config, recorder, info)


async def stream_cloud_ar(
    backend: CloudBackend, prompt_ids, config, recorder: Recorder, info: dict, *,
    optional: bool = False,
):  # fmt: skip
    """One generation as the cloud's AR stream. `optional` (a spec backend that planned AR and
    has its own pipeline): None where the cloud does not serve the AR mode, before any token."""
    from tandem.baselines.spec_baselines import run_cloud_ar

    channel = await backend._connect(info)
    try:
        return await run_cloud_ar(
            channel, backend.lm.tokenizer, prompt_ids, config, on_token=recorder, close=False
        )
    except ModeNotServed:
        if not optional:
            raise
        return None
    finally:
        info["rtt_s"] = channel.rtt
        await backend._close(channel, info, "ar done")
