"""The backends whose modes build their own prompts from retrieved text: dragon, rapid and
private-spec.

Words used here:
- *question*: the user's text (`GenParams.question`); DRAGON puts it after each side's
  retrieved documents, RAPID after the device's local text (C^S).
- *dragon*: `tandem.protocols.dragon` against `tandem cloud serve --corpus ...`, with the
  device's private corpus loaded once (`tandem.protocols.dragon.setup.load_side`). DRAGON
  degrades by itself when the cloud dies mid-generation (`SideReport.degraded`); a cloud that
  cannot be reached at the start is replaced by the device model alone on the plain prompt.
- *rapid*: `tandem.protocols.rapid.edge.device_generate` against a RAPID cloud
  (`tandem rapid serve`); every request carries its local text in `tandem_context`. Tokens
  stream as each round is verified; a lost cloud leaves the device model to finish from them.
- *private-spec*: `tandem.protocols.private_spec` against `tandem cloud serve --corpus ...`:
  the device drafts with its private chunks, the cloud verifies with its public ones; a lost
  cloud leaves the device model to finish on its own private-RAG prompt.
"""

from __future__ import annotations

from tandem.errors import TandemError
from tandem.protocols.decoding import OnToken
from tandem.protocols.report import finish_of
from tandem.serve.api.backends import (
    CloudBackend,
    GenParams,
    GenResult,
    Recorder,
    StopGeneration,
    finish_alone,
    probe_cloud,
    reason_of,
)
from tandem.transport import TransportConfig, TransportError
from tandem.transport import loop as event_loop


class _Swallow:
    """DRAGON's on_token must not raise inside its event handlers: after a StopGeneration the
    remaining tokens are dropped (the session runs to its own end)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder, self.stopped = recorder, False

    def __call__(self, token: int) -> None:
        if not self.stopped:
            try:
                self.recorder(token)
            except StopGeneration:
                self.stopped = True


class DragonBackend:
    mode = "dragon"
    needs_context = False

    def __init__(
        self, setup, *, host: str, port: int, transport: TransportConfig, strategy: str, docs: int
    ) -> None:
        self.setup, self.lm = setup, setup.lm
        self.host, self.port, self.transport = host, port, transport
        self.strategy, self.docs = strategy, docs

    def generate(self, prompt_ids: list[int], params: GenParams, on_token: OnToken) -> GenResult:
        from tandem.protocols.dragon import DragonConfig, connect_device

        recorder = Recorder(on_token)
        sink = _Swallow(recorder)
        config = DragonConfig(
            max_new_tokens=params.max_tokens, temperature=params.temperature, seed=params.seed,
            docs_per_side=self.docs, strategy=self.strategy,
        )  # fmt: skip

        async def run():
            return await connect_device(
                self.host, self.port, transport=self.transport, lm=self.lm,
                knowledge=self.setup.knowledge, question=params.question, config=config,
                profile=self.setup.profile, on_token=sink,
            )  # fmt: skip

        try:
            report = event_loop.run(run())
        except (TandemError, TransportError, OSError) as exc:
            return finish_alone(self.lm, prompt_ids, params, recorder, reason_of(exc))
        summary = report.summary()
        info = {
            "bytes_up": report.bytes_sent,
            "bytes_down": report.bytes_received,
            "acceptance_rate": summary["acceptance_rate"],
            "aggregated_by": summary["aggregated_by"],
            "switches": summary["switches"],
            "docs": len(report.docs),
            "peer_docs": report.peer_docs,
            "rtt_s": report.rtt_s,
        }
        finish = (
            "stop" if sink.stopped else finish_of(recorder.tokens, self.lm.tokenizer.eos_token_id)
        )
        return GenResult(
            recorder.tokens, finish, degraded=report.degraded,
            degraded_reason=report.degraded_reason, degraded_at=report.degraded_at, info=info,
        )  # fmt: skip

    async def cloud_reachable(self) -> bool | None:
        return await probe_cloud(self.host, self.port, self.transport)


class RapidBackend(CloudBackend):
    """RAPID's device side: drafts from the request's local text for the cloud's long-context
    target. `rapid`: the RAPID settings (mode, eta, gamma, ...; sampling and budget come from
    each request); `codec`: the uplink codec of the draft law."""

    mode = "rapid"
    needs_context = True

    def __init__(self, lm, *, host: str, port: int, transport: TransportConfig, rapid=None,
                 codec: tuple[str, dict] | None = None) -> None:  # fmt: skip
        super().__init__(lm, host=host, port=port, transport=transport)
        self.rapid, self.codec = rapid, codec

    def config(self, params: GenParams):
        import dataclasses

        from tandem.protocols.rapid.config import RapidConfig

        return dataclasses.replace(
            self.rapid or RapidConfig(), temperature=params.temperature, seed=params.seed,
            max_new_tokens=params.max_tokens,
        )  # fmt: skip

    def alone_prompt(self, prompt_ids: list[int], params: GenParams) -> list[int]:
        from tandem.protocols.rapid.prompts import drafter_prompt

        return drafter_prompt(self.lm.tokenizer, params.context or "", params.question)

    async def _collaborate(self, prompt_ids, params: GenParams, config, recorder: Recorder, info):
        from tandem.protocols.rapid.edge import device_generate

        channel = await self._connect(info)
        try:
            result = await device_generate(
                channel, self.lm, params.context or "", params.question, config,
                on_token=recorder, **({"codec": self.codec} if self.codec else {}),
            )  # fmt: skip
        finally:
            await self._close(channel, info, "rapid done")
        info.update(
            acceptance_rate=result.accepted / result.drafted if result.drafted else None,
            rounds=result.rounds,
        )
        return result


class PrivateSpecBackend(CloudBackend):
    """Private-RAG speculative decoding: the device's private corpus is loaded once; each
    request retrieves for its question, drafts, and lets the cloud verify."""

    mode = "private-spec"

    def __init__(self, lm, knowledge, *, host: str, port: int, transport: TransportConfig,
                 spec: dict | None = None, docs: int = 2) -> None:  # fmt: skip
        super().__init__(lm, host=host, port=port, transport=transport)
        self.knowledge, self.spec, self.docs = knowledge, dict(spec or {}), docs

    @classmethod
    def build(cls, settings, lm, *, host: str, port: int, transport: TransportConfig):
        """From `tandem device serve/run` settings: the corpus is indexed (cached) and opened."""
        from tandem.protocols.dragon import Knowledge
        from tandem.protocols.dragon.setup import ensure_index

        if not settings.corpus:
            raise TandemError("--mode private-spec needs --corpus (the device's private corpus)")
        if settings.pipeline == "adaptive":
            raise TandemError("--pipeline adaptive is for --mode spec; private-spec runs sync, "
                              "async or eager")  # fmt: skip
        index = ensure_index(settings.corpus, tokenizer=lm.tokenizer, tokenizer_name=settings.model)
        spec = dict(
            draft_len=settings.draft_len, bit_budget=settings.bit_budget,
            fast_verify=settings.fast_verify, truncate_factor=settings.truncate_factor,
        )  # fmt: skip
        if settings.pipeline is not None:  # else the mode's own (private_spec.private_config)
            spec["pipeline"] = settings.pipeline
        if settings.codec is not None:
            spec.update(codec=settings.codec, codec_params=settings.codec_params)
        if settings.eta is not None:
            spec["eta"] = settings.eta
        backend = cls(lm, Knowledge.from_index(index), host=host, port=port, transport=transport,
                      spec=spec, docs=settings.docs)  # fmt: skip
        backend.config(GenParams(max_tokens=1))  # check the settings now, not per request
        return backend

    def config(self, params: GenParams):
        from tandem.protocols.private_spec import private_config

        return private_config(
            **self.spec, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            seed=params.seed, max_new_tokens=params.max_tokens, first_chunk=1,
        )  # fmt: skip

    def alone_prompt(self, prompt_ids: list[int], params: GenParams) -> list[int]:
        from tandem.protocols.private_spec import rag_prompt

        _, context = self.knowledge.context(params.question, self.docs)
        return rag_prompt(self.lm.tokenizer, context, params.question)

    async def _collaborate(self, prompt_ids, params: GenParams, config, recorder: Recorder, info):
        from tandem.protocols.private_spec import run_private_device

        channel = await self._connect(info)
        try:
            report = await run_private_device(
                channel, self.lm, self.knowledge, params.question, config, docs=self.docs,
                on_token=recorder, close=False,
            )  # fmt: skip
            summary = report.summary()
            info.update(
                acceptance_rate=summary["acceptance_rate"], verdicts=summary["verdicts"],
                docs=len(report.docs), peer_docs=len(report.cloud.get("public_docs", [])),
            )  # fmt: skip
        finally:
            info["rtt_s"] = channel.rtt
            await self._close(channel, info, "private-spec done")
        return report
