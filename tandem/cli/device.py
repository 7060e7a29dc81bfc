"""`tandem device run`: one generation on the device, against a cloud (or alone), with stats."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from tandem.errors import TandemError

app = typer.Typer(no_args_is_help=True)

DEFAULT_PROMPT = "Write a Python function that checks whether a string is a palindrome."


def parse_params(items: list[str]) -> dict[str, float]:
    """["k=8", "ell=100"] -> {"k": 8, "ell": 100}."""
    params: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise TandemError(f"--codec-param expects NAME=VALUE, got {item!r}")
        try:
            params[name] = int(value)
        except ValueError:
            try:
                params[name] = float(value)
            except ValueError:
                raise TandemError(f"--codec-param {name}: {value!r} is not a number") from None
    return params


@app.command("run")
def run(
    mode: str = typer.Option(
        "spec", "--mode", help="spec, ar (cloud AR), local (device only) or dragon."
    ),
    corpus: str = typer.Option(None, "--corpus", help="DRAGON: the device's private corpus."),
    strategy: str = typer.Option(
        "dragon", help="DRAGON aggregator: dragon, device, cloud, random."
    ),
    docs: int = typer.Option(2, "--docs", help="DRAGON: documents per side."),
    pipeline: str = typer.Option("async", "--pipeline", help="sync (stop-and-wait) or async."),
    codec: str = typer.Option(
        "dense", "--codec", help="Uplink: dense, separate, k-sqs, c-sqs, top-k, top-p."
    ),
    codec_param: list[str] = typer.Option([], "--codec-param", help="NAME=VALUE, e.g. k=8."),
    draft_len: int = typer.Option(4, "--draft-len", help="Draft tokens per block (gamma)."),
    bit_budget: int = typer.Option(None, "--bit-budget", help="SQS-SD: payload bits per block."),
    downlink_k: int = typer.Option(10, "--downlink-k", help="separate: target top-K sent down."),
    fast_verify: bool = typer.Option(True, "--fast-verify/--no-fast-verify"),
    truncate_factor: float = typer.Option(2.0, "--truncate-factor", help="0 = no truncation."),
    prompt: str = typer.Option(DEFAULT_PROMPT, "--prompt", "-p"),
    raw: bool = typer.Option(False, "--raw", help="Use the prompt without the chat template."),
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model", "-m", help="Device model."),
    host: str = typer.Option("127.0.0.1", help="Cloud address."),
    port: int = typer.Option(7700, help="Cloud port."),
    secret: str = typer.Option(None, "--secret", envvar="TANDEM_SECRET"),
    delay: float = typer.Option(
        0.0, "--delay", help="Emulated one-way delay (ms) on the device -> cloud direction."
    ),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n"),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy."),
    top_k: int = typer.Option(None, "--top-k"),
    top_p: float = typer.Option(None, "--top-p"),
    seed: int = typer.Option(0, "--seed"),
    threads: int = typer.Option(1, "--threads", min=1, help="torch intra-op threads."),
    json_out: Path = typer.Option(None, "--json", help="Also write the full report here."),
) -> None:
    """Generate with the device model drafting and the cloud verifying; print the stats."""
    import asyncio

    import torch
    from rich.console import Console

    from tandem.models.registry import load_model
    from tandem.protocols.spec.config import SpecConfig
    from tandem.protocols.spec.stats import summary_table
    from tandem.serve.device import DEVICE_MODES, device_transport, run_generation
    from tandem.transport import LinkConfig

    if mode == "dragon":
        from tandem.cli.demo import run_dragon_device

        run_dragon_device(
            corpus=corpus, model=model, host=host, port=port, secret=secret, delay=delay,
            question=prompt, strategy=strategy, docs=docs, max_new_tokens=max_new_tokens,
            temperature=temperature, seed=seed, threads=threads, json_out=json_out,
        )  # fmt: skip
        return
    if mode not in DEVICE_MODES:
        raise TandemError(f"unknown mode {mode!r}; choose one of {', '.join(DEVICE_MODES)}")
    config = SpecConfig(
        pipeline=pipeline,
        codec=codec,
        codec_params=parse_params(codec_param),
        draft_len=draft_len,
        bit_budget=bit_budget,
        downlink_k=downlink_k,
        fast_verify=fast_verify,
        first_chunk=1,
        truncate_factor=truncate_factor,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        max_new_tokens=max_new_tokens,
    )
    torch.set_num_threads(threads)
    lm = load_model(model)
    ids = lm.tokenizer.encode(prompt) if raw else lm.tokenizer.chat_prompt(prompt)
    transport = device_transport(
        lm, secret=secret, link=LinkConfig(delay_ms=delay) if delay else None
    )
    shown: list[int] = []
    printed = ""

    def show(token: int) -> None:
        nonlocal printed
        shown.append(token)
        text = lm.tokenizer.decode(shown)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(printed) :])
            sys.stdout.flush()
            printed = text

    report = asyncio.run(
        run_generation(
            mode,
            lm=lm,
            prompt_ids=ids,
            config=config,
            host=host,
            port=port,
            transport=transport,
            on_token=show,
        )
    )
    print()
    Console(stderr=True).print(summary_table(report))
    if json_out is not None:
        json_out.write_text(json.dumps(report.to_json(), indent=1))
