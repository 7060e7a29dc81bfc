"""`tandem device run`: one generation on the device, against a cloud (or alone), with stats."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import typer

from tandem.cli.demo import CLI_ROWS, CLI_SCORER, ROWS_HELP, SCORER_HELP
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
        "spec",
        "--mode",
        help="spec, ar (cloud AR), local (device only), dragon or private-spec.",
    ),
    corpus: str = typer.Option(
        None, "--corpus", help="dragon, private-spec: the device's private corpus."
    ),
    strategy: str = typer.Option(
        "dragon", help="DRAGON aggregator: dragon, device, cloud, random."
    ),
    docs: int = typer.Option(2, "--docs", help="dragon, private-spec: documents per side."),
    rows: str = typer.Option(CLI_ROWS, "--rows", help="dragon: " + ROWS_HELP),
    scorer: str = typer.Option(CLI_SCORER, "--scorer", help="dragon: " + SCORER_HELP),
    pipeline: str = typer.Option(
        None,
        "--pipeline",
        help="sync (stop-and-wait), async (PicoSpec), eager (the cloud decodes while it waits) "
        "or adaptive (eager with a controller that picks cloud AR or eager, the draft length "
        "each round and, with --branch-below, whether to branch) [adaptive; async with "
        "--codec separate or c-sqs].",
    ),
    codec: str = typer.Option(
        None,
        "--codec",
        help="Uplink: dense, separate, k-sqs, c-sqs, top-k, top-p [k-sqs k=3 ell=100: 64 bits "
        "per draft token].",
    ),
    eta: float = typer.Option(
        None, "--eta", help="private-spec: pull of the private draft on the cloud's law [4]."
    ),
    codec_param: list[str] = typer.Option([], "--codec-param", help="NAME=VALUE, e.g. k=8."),
    draft_len: int = typer.Option(4, "--draft-len", help="Draft tokens per block (gamma)."),
    bit_budget: int = typer.Option(None, "--bit-budget", help="SQS-SD: payload bits per block."),
    downlink_k: int = typer.Option(10, "--downlink-k", help="separate: target top-K sent down."),
    fast_verify: bool = typer.Option(True, "--fast-verify/--no-fast-verify"),
    truncate_factor: float = typer.Option(2.0, "--truncate-factor", help="0 = no truncation."),
    branch_below: float = typer.Option(
        0.0,
        "--branch-below",
        help="eager: also draft a branch on the second choice where the draft model's top "
        "probability is below this (0 = off).",
    ),
    branch_len: int = typer.Option(4, "--branch-len", help="eager: drafts per branch."),
    verify_calls: str = typer.Option(
        "block",
        "--verify-calls",
        help="spec: block, or token (the cloud's output equals its AR "
        "output bit for bit on llama.cpp; slower).",
    ),
    prompt: str = typer.Option(DEFAULT_PROMPT, "--prompt", "-p"),
    raw: bool = typer.Option(False, "--raw", help="Use the prompt without the chat template."),
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model", "-m", help="Device model."),
    host: str = typer.Option("127.0.0.1", help="Cloud address."),
    port: int = typer.Option(7700, help="Cloud port."),
    cloud: str = typer.Option(
        None, "--cloud", help="HOST:PORT of the cloud (instead of --host/--port)."
    ),
    secret: str = typer.Option(None, "--secret", envvar="TANDEM_SECRET"),
    delay: float = typer.Option(
        0.0, "--delay", help="Emulated one-way delay (ms) on the device -> cloud direction."
    ),
    max_new_tokens: int = typer.Option(
        64, "--max-new-tokens", "-n", help="Most tokens to generate (fewer at end-of-turn)."
    ),
    temperature: float = typer.Option(0.0, "--temperature", "-t", help="0 = greedy."),
    top_k: int = typer.Option(None, "--top-k"),
    top_p: float = typer.Option(None, "--top-p"),
    seed: int = typer.Option(0, "--seed"),
    threads: int = typer.Option(
        1,
        "--threads",
        min=1,
        help="Engine threads, llama.cpp and torch (at most the cores it may run on).",
    ),
    json_out: Path = typer.Option(None, "--json", help="Also write the full report here."),
    timeline: bool = typer.Option(
        False, "--timeline", help="dragon: where each side's time goes per token (ms, share)."
    ),
    fallback: bool = typer.Option(
        True,
        "--fallback/--no-fallback",
        help="If the cloud is unreachable or lost, the device model finishes the answer "
        "(--no-fallback: exit with the error instead).",
    ),  # fmt: skip
) -> None:
    """Generate with the device model drafting and the cloud verifying; print the stats."""
    import torch
    from rich.console import Console

    from tandem.baselines.spec_baselines import run_device_only
    from tandem.models.registry import load_model
    from tandem.protocols.decoding import text_stream
    from tandem.protocols.private_spec import sources
    from tandem.protocols.spec.config import PIPELINES, SpecConfig, device_codec
    from tandem.protocols.spec.stats import summary_table
    from tandem.serve.api.backends import GenParams, device_pipeline, protocol_pipeline
    from tandem.serve.api.server import build_backend
    from tandem.serve.device import DEVICE_MODES
    from tandem.serve.settings import DeviceServeSettings, merge_flags
    from tandem.testbed.proxy import parse_hostport

    if cloud:
        host, port = parse_hostport(cloud)
    if mode == "dragon":
        from tandem.cli.demo import run_dragon_device

        run_dragon_device(
            corpus=corpus, model=model, host=host, port=port, secret=secret, delay=delay,
            question=prompt, strategy=strategy, docs=docs, max_new_tokens=max_new_tokens,
            temperature=temperature, seed=seed, threads=threads, json_out=json_out,
            timeline=timeline, rows=rows, scorer=scorer,
        )  # fmt: skip
        return
    modes = (*DEVICE_MODES, "dragon", "private-spec")
    if mode not in modes:
        raise TandemError(f"unknown mode {mode!r}; choose one of {', '.join(modes)}")
    if mode == "private-spec" and not corpus:
        raise TandemError("--mode private-spec needs --corpus (the device's private corpus)")
    if pipeline not in (None, *PIPELINES, "adaptive"):
        raise TandemError(f"spec: pipeline must be one of {', '.join(PIPELINES)}, adaptive")
    if pipeline == "adaptive" and mode != "spec":
        raise TandemError("--pipeline adaptive is for --mode spec")
    uplink, uplink_params = device_codec(codec, parse_params(codec_param))
    if mode == "spec":  # the other modes keep None (private-spec: its own default, async)
        pipeline = device_pipeline(pipeline, uplink)
    config = SpecConfig(  # checks the flags before the model loads
        pipeline=protocol_pipeline(pipeline or "async"), codec=uplink, codec_params=uplink_params,
        draft_len=draft_len, bit_budget=bit_budget, downlink_k=downlink_k,
        fast_verify=fast_verify, first_chunk=1, truncate_factor=truncate_factor,
        verify_calls=verify_calls, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
        max_new_tokens=max_new_tokens, branch_below=branch_below, branch_len=branch_len,
    )  # fmt: skip
    torch.set_num_threads(threads)
    lm = load_model(model)
    ids = lm.tokenizer.encode(prompt) if raw else lm.tokenizer.chat_prompt(prompt)
    show = text_stream(lm.tokenizer, eos=lm.tokenizer.eos_token_id)

    console = Console(stderr=True)
    if mode == "local":
        report = run_device_only(lm, ids, config, on_token=show)
        print()
        console.print(summary_table(report))
        if json_out is not None:
            json_out.write_text(json.dumps(report.to_json(), indent=1))
        return
    # spec / ar: the serving backend, so a lost cloud is a fallback here too (the device
    # finishes from the tokens already committed), never a truncated answer
    settings = merge_flags(DeviceServeSettings(model=model), dict(
        mode=mode, cloud=f"{host}:{port}", delay=delay, pipeline=pipeline, codec=codec,
        codec_params=config.codec_params, corpus=corpus, docs=docs, eta=eta, draft_len=draft_len, bit_budget=bit_budget,
        downlink_k=downlink_k, fast_verify=fast_verify, truncate_factor=truncate_factor,
        verify_calls=verify_calls, threads=threads, branch_below=branch_below,
        branch_len=branch_len,
    ))  # fmt: skip
    backend = build_backend(settings, lm, secret=secret)
    backend.fallback = fallback
    logging.getLogger("tandem.serve.api").setLevel(logging.ERROR)  # said below, once
    params = GenParams(
        max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
        question=prompt,
    )  # fmt: skip
    start = time.perf_counter()
    result = backend.generate(ids, params, show)
    elapsed = time.perf_counter() - start
    print()
    if result.report is not None:
        console.print(summary_table(result.report))
        if mode == "private-spec":
            console.print(sources(result.report), highlight=False)
    record = {"mode": mode, "tokens": result.tokens, "finish_reason": result.finish_reason,
              "total_s": elapsed, "degraded": result.degraded}  # fmt: skip
    if (controller := getattr(backend, "controller", None)) is not None:
        plan = controller.plan(("ar", "eager"))
        record["adaptive"] = {"ran": result.info.get("plan"), "next": plan.method,
                              "gamma": plan.gamma, "alpha": controller.alpha_estimate}  # fmt: skip
        console.print(
            f"adaptive: ran as {result.info.get('plan')}; measured alpha "
            f"{controller.alpha_estimate:.2f}, the next generation would run {plan.method}"
            + (f" with {plan.gamma} drafts a block" if plan.gamma else "")
        )
    if result.degraded:
        record.update(degraded_at=result.degraded_at, degraded_reason=result.degraded_reason)
        console.print(
            f"[yellow]fell back[/yellow] at token {result.degraded_at}: "
            f"{result.degraded_reason}; the device model finished the answer alone "
            f"({len(result.tokens)} tokens in {elapsed:.2f} s, finish: {result.finish_reason})"
        )
    if json_out is not None:
        body = result.report.to_json() if result.report is not None else {}
        json_out.write_text(json.dumps({**body, **record}, indent=1))


@app.command("serve")
def serve(
    config: Path = typer.Option(None, "--config", help="TOML/YAML file; flags override it."),
    cloud: str = typer.Option(None, "--cloud", help="HOST:PORT of `tandem cloud serve`."),
    mode: str = typer.Option(
        None, "--mode", help="local, spec, ar, dragon, rapid or private-spec [spec]."
    ),
    model: str = typer.Option(None, "--model", "-m", help="Device model [qwen2.5-coder-0.5b]."),
    served_model_name: str = typer.Option(None, help="Model name clients use [--model]."),
    listen: str = typer.Option(None, "--listen", help="HOST:PORT of the API [127.0.0.1:8000]."),
    corpus: str = typer.Option(
        None, "--corpus", help="dragon, private-spec: the device's private corpus."
    ),
    strategy: str = typer.Option(None, help="dragon: aggregator strategy [dragon]."),
    docs: int = typer.Option(None, "--docs", help="dragon: documents per side [2]."),
    pipeline: str = typer.Option(
        None,
        "--pipeline",
        help="spec: sync, async, eager or adaptive [adaptive; async with --codec separate or "
        "c-sqs].",
    ),
    codec: str = typer.Option(None, "--codec", help="spec: uplink codec [k-sqs k=3 ell=100]."),
    eta: float = typer.Option(None, "--eta", help="private-spec: draft pull on the cloud [4]."),
    codec_param: list[str] = typer.Option([], "--codec-param", help="NAME=VALUE, e.g. k=8."),
    draft_len: int = typer.Option(None, "--draft-len", help="spec: drafts per block [4]."),
    bit_budget: int = typer.Option(None, "--bit-budget", help="SQS-SD: payload bits per block."),
    downlink_k: int = typer.Option(None, "--downlink-k", help="separate: top-K sent down [10]."),
    fast_verify: bool = typer.Option(None, "--fast-verify/--no-fast-verify"),
    truncate_factor: float = typer.Option(None, "--truncate-factor", help="0 = off [2]."),
    verify_calls: str = typer.Option(
        None, "--verify-calls", help="spec: block or token (AR-identical, slower) [block]."
    ),
    branch_below: float = typer.Option(
        None, "--branch-below", help="eager: branch where the draft's top prob is below [0: off]."
    ),
    branch_len: int = typer.Option(None, "--branch-len", help="eager: drafts per branch [4]."),
    max_context: int = typer.Option(None, "--max-context", help="Prompt + completion [4096]."),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Largest max_tokens [1024]."),
    default_max_tokens: int = typer.Option(None, help="max_tokens when a request has none."),
    connect_timeout: float = typer.Option(None, help="Seconds to reach the cloud [3]."),
    delay: float = typer.Option(None, "--delay", help="Emulated one-way delay (ms) upstream."),
    threads: int = typer.Option(
        None, "--threads", help="Engine threads, llama.cpp and torch (at most its cores) [1]."
    ),
    log_format: str = typer.Option(None, "--log-format", help="text or json [text]."),
    api_key: str = typer.Option(
        None,
        "--api-key",
        envvar="TANDEM_API_KEY",
        show_envvar=False,
        help="Clients must send `Authorization: Bearer KEY` [$TANDEM_API_KEY; needed to listen "
        "beyond loopback].",
    ),
) -> None:
    """Serve the OpenAI API (/v1/completions, /v1/chat/completions) on the device; the secret
    comes from $TANDEM_SECRET."""
    flags = dict(locals())  # first: only the parameters
    flags.pop("config")
    api_key = flags.pop("api_key") or None
    import torch

    from tandem.models.registry import load_model
    from tandem.serve.api.server import build_backend, check_exposure, serve_forever
    from tandem.serve.settings import device_settings

    flags["codec_params"] = parse_params(flags.pop("codec_param"))
    settings = device_settings(config, flags)
    check_exposure(settings.listen, api_key)  # before loading the model
    torch.set_num_threads(settings.threads)
    lm = load_model(settings.model, backend=settings.backend)
    backend = build_backend(settings, lm)

    def ready(host: str, port: int) -> None:
        where = "" if settings.mode == "local" else f" with the cloud at {settings.cloud}"
        typer.echo(
            f"tandem device: {settings.model} ({settings.mode}){where} on http://{host}:{port}"
        )
        sys.stdout.flush()

    serve_forever(settings, backend, api_key=api_key, on_ready=ready)
