"""Private-RAG speculative decoding ("private-spec"): the device's private knowledge, the
cloud's larger model and public knowledge, and no document leaving its side.

The device retrieves from its private corpus and drafts on the small model with those chunks
in its prompt; the cloud retrieves from its public corpus and verifies on the large model with
those chunks in its prompt, against RAPID's augmented target (the cloud's law shifted toward
the transmitted draft law, strength `eta`, tandem.sampling.rapid). Drafts go up SQS-coded
(K-SQS, K = 3: 64 bits per draft token), through PicoSpec's asynchronous pipeline. Everything
after the start message is the speculative protocol of `tandem.protocols.spec`, unchanged but
for `SpecConfig.eta`.

Theory of operation:

    device                                           cloud
    retrieve `docs` private chunks
    START {mode: private-spec, config,         ->    retrieve `docs` public chunks for the
           question}, tokens = the question's        question; target prompt = public
           chat prompt (no documents)                chunks + question; prefill
    device prompt = private chunks + question;
    prefill                                    <-    READY
    ... drafts (token + SQS payload) up, verdicts (accepted count + one token) down, as in
    tandem.protocols.spec, verified against p_hat instead of the target law ...

Words used here:
- *law*: eta = 0: the cloud model's law given the public chunks (exact speculative decoding;
  at temperature 0, its greedy output). eta > 0: p_hat at every position (the augmented
  target given both prompts: a well-defined autoregressive law, see SpecConfig), at
  temperature 0 its argmax ("augmented greedy").
- *downlink*: the cloud holds the whole transmitted draft law, so on a rejection it draws the
  recovered token itself and sends one token; PicoSpec's separate rejection (top-K of the
  target down, the device resamples) exists to spare an uplink the cloud already has here, and
  cannot compute p_hat (it needs the draft law), so it is refused with eta > 0.
What crosses the network: docs/private-spec.md.
"""

from __future__ import annotations

import contextlib
import weakref

from tandem.errors import TandemError
from tandem.models.base import CausalLM, Tokenizer
from tandem.protocols.decoding import OnToken
from tandem.protocols.dragon.knowledge import Knowledge, listed, named
from tandem.protocols.pair import run_in_process
from tandem.protocols.rapid.prompts import render
from tandem.protocols.spec import wire
from tandem.protocols.spec.cloud import Observer, parse_start, run_session
from tandem.protocols.spec.config import DEVICE_CODEC, SpecConfig
from tandem.protocols.spec.device import run_device
from tandem.protocols.spec.stats import SpecReport
from tandem.transport import ChannelClosed, LinkConfig, TransportError, control

MODE = "private-spec"
DOCS = 2  # chunks retrieved per side
ETA = 10.0  # knowledge-transfer strength (RAPID's default; the paper uses 5-20)
CODEC = DEVICE_CODEC  # K-SQS K=3: 64 bits per draft token (docs/spec.md)
TEMPLATE = (
    "<Context>\n{context}\n</Context>\n\n{question}\n"
    "Answer the question. Use the <Context> above where it helps; be brief and exact."
)


def private_config(**overrides) -> SpecConfig:
    """The mode's defaults (async pipeline, K-SQS K=3, eta = ETA), with `overrides`."""
    codec, params = CODEC
    base = dict(pipeline="async", codec=codec, codec_params=params, eta=ETA)
    return SpecConfig(**{**base, **overrides})


def rag_prompt(tokenizer: Tokenizer, context: str, question: str) -> list[int]:
    """One side's prompt: its context (`Knowledge.context`), then the question (chat
    template)."""
    return render(tokenizer, TEMPLATE.format(context=context, question=question))


def question_prompt(tokenizer: Tokenizer, question: str) -> list[int]:
    """What the start message carries: the question alone (the prompt without documents)."""
    return rag_prompt(tokenizer, "", question)


async def run_private_device(
    channel,
    lm: CausalLM,
    knowledge: Knowledge,
    question: str,
    config: SpecConfig,
    *,
    docs: int = DOCS,
    on_token: OnToken | None = None,
    close: bool = True,
) -> SpecReport:
    """The device side: retrieve, draft with the private chunks, let the cloud verify."""
    if not question.strip():
        raise TandemError("private-spec: the question is empty")
    used, context = knowledge.context(question, docs)
    prompt = rag_prompt(lm.tokenizer, context, question)
    question_ids = question_prompt(lm.tokenizer, question)
    start = wire.start_message(MODE, config.to_json(), question_ids, question=question, docs=docs)
    report = await run_device(
        channel, lm, prompt, config, on_token=on_token, close=close, start=start
    )
    report.mode = MODE
    report.docs, report.put_back = named(used)
    return report


def sources(report) -> str:
    """Two lines for a private-spec `SpecReport`: the chunks each side's prompt held (the
    device's never left it; the cloud names its own in its stats)."""
    cloud = report.cloud
    private = listed(report.docs, report.put_back) or "none"
    public = listed(cloud.get("public_docs", []), cloud.get("public_put_back", [])) or "?"
    return (
        f"private chunks (stayed on the device): {private}\npublic chunks (the cloud's): {public}"
    )


def parse_private_start(msg) -> tuple[SpecConfig, str, int]:
    """(config, question, docs) of a private-spec start message; ValueError if bad."""
    config, _question_ids, mode = parse_start(msg)
    if mode != MODE:
        raise ValueError(f"mode {mode!r} is not private-spec")
    body = control.body(msg)
    question, docs = body.get("question"), body.get("docs", DOCS)
    if not isinstance(question, str) or not question.strip():
        raise ValueError("no question")
    if not isinstance(docs, int) or not 0 <= docs <= 16:
        raise ValueError("docs must be an integer in 0..16")
    return config, question, docs


async def serve_private_session(
    channel,
    lm: CausalLM,
    knowledge: Knowledge,
    *,
    first=None,
    batcher=None,
    observer: Observer | None = None,
    live: weakref.WeakSet | None = None,
) -> dict | None:
    """The cloud side: retrieve public chunks for the question, then verify as in spec mode.
    Returns the session's stats (with the public chunks' ids), or None (the device is told)."""
    try:
        msg = first if first is not None else await channel.recv()
    except ChannelClosed:
        return None
    try:
        config, question, docs = parse_private_start(msg)
    except (ValueError, TypeError, TandemError) as exc:
        with contextlib.suppress(TransportError):
            await channel.send(wire.error_message(f"bad start message: {exc}"))
        return None
    used, context = knowledge.context(question, docs)
    prompt = rag_prompt(lm.tokenizer, context, question)
    public, put_back = named(used)
    stats = {"public_docs": public, "public_put_back": put_back}
    return await run_session(
        channel, lm, config, prompt, batcher=batcher, observer=observer, live=live, stats=stats
    )


async def run_private_pair(
    *,
    device_lm: CausalLM,
    cloud_lm: CausalLM,
    device_knowledge: Knowledge,
    cloud_knowledge: Knowledge,
    question: str,
    config: SpecConfig,
    docs: int = DOCS,
    link: LinkConfig | None = None,
    on_token: OnToken | None = None,
) -> tuple[SpecReport, dict | None]:
    """Both sides in this process over an in-memory channel (optionally an emulated link);
    returns (device report, cloud stats)."""
    return await run_in_process(
        lambda channel, _: run_private_device(
            channel, device_lm, device_knowledge, question, config, docs=docs, on_token=on_token
        ),
        lambda channel: serve_private_session(channel, cloud_lm, cloud_knowledge),
        link=link,
    )
