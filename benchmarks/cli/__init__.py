"""`tandem bench ...`: each command runs one experiment from `benchmarks` and saves JSON + PNG."""

from __future__ import annotations

from pathlib import Path

import typer

from benchmarks import RESULTS
from tandem.testbed.options import CLOUD_CPUS, DEVICE_CPUS, role_cpus

app = typer.Typer(
    no_args_is_help=True,
    help="Benchmarks (the top-level `benchmarks` package); results go to $TANDEM_RESULTS or "
    "benchmarks/results/ (--out to choose).",
)

OUT = typer.Option(RESULTS, "--out", help="Folder for the JSON and PNG results.")


@app.command("decode")
def decode(
    models: list[str] = typer.Option(
        ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"], "--model", help="Model name(s)."
    ),
    backends: str = typer.Option(
        "llamacpp,hf", "--backend", help="Engines side by side, comma-separated (llamacpp,hf)."
    ),
    contexts: list[int] = typer.Option(
        [32, 256, 1024, 4096], "--context", help="Context lengths (tokens) to profile."
    ),
    decode_tokens: int = typer.Option(16, help="Decode steps timed per context length."),
    repeats: int = typer.Option(2, help="Timed repeats per point (after one warm-up)."),
    hf_max_context: int = typer.Option(1024, help="Longest context run on transformers."),
    cpus: str = typer.Option("", help="Cores for the workers, e.g. 0 or 0-1 (default: all)."),
    out: Path = OUT,
) -> None:
    """Prefill, decode per token, verify-k and n-row cost per engine, side by side."""
    from benchmarks.decode import run
    from tandem.testbed.cpus import parse_cpus

    run(
        models=models,
        backends=[b.strip() for b in backends.split(",") if b.strip()],
        contexts=contexts,
        decode_tokens=decode_tokens,
        repeats=repeats,
        hf_max_context=hf_max_context,
        cores=parse_cpus(cpus) if cpus else None,
        out=out,
    )


@app.command("codecs")
def codecs(
    quick: bool = typer.Option(False, "--quick", help="48 tokens instead of --tokens."),
    tokens: int = typer.Option(300, "--tokens", help="Next-token distributions to code."),
    temperature: float = typer.Option(1.0, help="Softmax temperature of the distributions."),
    module: str = typer.Option("textwrap", help="Stdlib module whose source is scored."),
    model: str = typer.Option("qwen2.5-coder-0.5b", help="Model producing the distributions."),
    out: Path = OUT,
) -> None:
    """Bytes per token, coding time and TV error of each distribution codec on real Qwen outputs."""
    from benchmarks.codecs import run

    run(
        out=out,
        quick=quick,
        model=model,
        module=module,
        num_tokens=tokens,
        temperature=temperature,
    )


@app.command("link")
def link(
    quick: bool = typer.Option(False, "--quick", help="Fewer samples and shorter transfers."),
    path: str = typer.Option(
        "auto", "--path", help="auto (namespaces when root), netns, or loopback."
    ),
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    out: Path = OUT,
) -> None:
    """Round-trip latency vs a raw-socket floor, and delivered vs configured delay and rate."""
    from benchmarks.link import run

    run(out=out, quick=quick, path=path, cpus=role_cpus(device_cpus, cloud_cpus))


@app.command("retrieval")
def retrieval(
    quick: bool = typer.Option(False, "--quick", help="Smaller corpus and sets."),
    threads: int = typer.Option(1, help="torch threads for the measurements."),
    out: Path = OUT,
) -> None:
    """Index build time/size, query latency, HNSW recall@10, scorer cost, KV load vs prefill."""
    from benchmarks.retrieval import run

    run(out=out, quick=quick, threads=threads)


@app.command("rapid")
def rapid(
    quick: bool = typer.Option(False, "--quick", help="One 1K context, 3 tasks, short sweep."),
    contexts: list[int] = typer.Option(
        [], "--context", help="Context lengths in tokens (default 1024 2048 4096; quick 1024)."
    ),
    tasks_per_kind: int = typer.Option(
        0, "--tasks", help="Tasks per kind on each shared context (0: 2, quick 1)."
    ),
    eta: float = typer.Option(10.0, "--eta", help="eta of the main comparison."),
    gamma: int = typer.Option(5, "--gamma", min=1),
    temperature: float = typer.Option(0.1, "--temperature", min=0.0),
    max_new_tokens: int = typer.Option(0, "--max-new-tokens", help="0: 64 (quick 32)."),
    sweep_context: int = typer.Option(0, "--sweep-context", help="0: the first context."),
    sweep_tasks: int = typer.Option(-1, "--sweep-tasks", help="-1: 3 (quick 1); 0: no sweep."),
    seeds: int = typer.Option(
        1, "--seeds", min=1, help="Run every task with seeds 0..N-1 (quality: mean over them)."
    ),
    upward: str = typer.Option("", "--upward", help="Larger drafter model (upward speculation)."),
    methods: list[str] = typer.Option(
        [],
        "--method",
        help="Methods (repeat; default all): lc, rag, sd, streaming, "
        "rapid-exact, rapid-paper. lc is always needed.",
    ),  # fmt: skip
    backend: str = typer.Option("", "--backend", help="llamacpp (default) or hf."),
    kv_type: str = typer.Option("f16", "--kv-type", help="llama.cpp KV cache type: f16 or q8_0."),
    kv_cache: bool = typer.Option(
        True,
        "--kv-cache/--no-kv-cache",
        help="Save each long-context prefill to ~/.cache/tandem/kv/rapid and load it next time.",
    ),  # fmt: skip
    cpus: str = typer.Option("", help="Cores of the machine, e.g. 0-1 (default: all)."),
    threads: int = typer.Option(0, "--threads", min=0, help="Engine threads (0: one per core)."),
    name: str = typer.Option("", "--name", help="Result file name (default rapid / rapid_upward)."),
    out: Path = OUT,
) -> None:
    """RAPID vs LC, RAG, SD and a StreamingLLM drafter: quality, speedup, acceptance, eta sweep,
    the cost model's crossover context."""
    from benchmarks.rapid import DEFAULT_KV_CACHE, METHODS, run
    from tandem.testbed.cpus import parse_cpus

    run(
        out=out,
        quick=quick,
        contexts=contexts or None,
        tasks_per_kind=tasks_per_kind or None,
        eta=eta,
        gamma=gamma,
        temperature=temperature,
        max_new_tokens=max_new_tokens or None,
        sweep_context=sweep_context or None,
        sweep_tasks=None if sweep_tasks < 0 else sweep_tasks,
        seeds=seeds,
        upward=upward or None,
        methods=tuple(methods) or METHODS,
        backend=backend or None,
        kv_type=kv_type,
        kv_cache=DEFAULT_KV_CACHE if kv_cache else None,
        cpus=parse_cpus(cpus) if cpus else None,
        threads=threads or None,
        name=name or None,
    )


@app.command("rapid-steps")
def rapid_steps(
    contexts: list[int] = typer.Option(
        [4096, 8192, 16384], "--context", help="Context lengths in tokens (RAPID's shared ones)."
    ),
    variants: list[str] = typer.Option(
        ["f16", "f16+flash", "q8_0+flash"], "--variant", help="f16, f16+flash, q8_0+flash."
    ),
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model"),
    gamma: int = typer.Option(5, "--gamma", min=1),
    repeats: int = typer.Option(7, "--repeats", min=1),
    cpus: str = typer.Option("", help="Cores of the machine, e.g. 0-1 (default: all)."),
    name: str = typer.Option("rapid_steps", "--name", help="Result file name."),
    out: Path = OUT,
) -> None:
    """Decode step vs verification block at long contexts, with and without flash attention
    and a q8_0 KV cache (llama.cpp)."""
    from benchmarks.rapid import DEFAULT_KV_CACHE
    from benchmarks.rapid_steps import run
    from tandem.testbed.cpus import parse_cpus

    run(
        out=out, contexts=contexts, variants=variants, model=model, gamma=gamma,
        repeats=repeats, kv_cache=DEFAULT_KV_CACHE, cpus=parse_cpus(cpus) if cpus else None,
        name=name,
    )  # fmt: skip


@app.command("spec")
def spec(
    quick: bool = typer.Option(False, "--quick", help="One prompt, 16 tokens."),
    regime: list[str] = typer.Option(
        ["emulated", "emulated-high", "fast-cloud", "cpu"],
        "--regime",
        help="emulated[-high] (paper timings), fast-cloud (0.5B-int8 -> 0.5B), cpu (0.5B -> 1.5B).",
    ),
    rtt: list[float] = typer.Option([0, 50, 100, 200], "--rtt", help="Round-trip times (ms)."),
    method: list[str] = typer.Option(None, "--method", help="Subset of methods (default all)."),
    prompts: int = typer.Option(None, "--prompts", help="Number of prompts (default 1 quick / 4)."),
    max_new_tokens: int = typer.Option(None, "--max-new-tokens", "-n"),
    draft_len: int = typer.Option(4, "--draft-len"),
    rate: float = typer.Option(100.0, "--rate", help="Emulated link rate (Mbit/s), each way."),
    no_sqs: bool = typer.Option(False, "--no-sqs", help="Skip the SQS sweep."),
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    out: Path = OUT,
) -> None:
    """PicoSpec Tables 1/2/4, SQS-SD Fig. 2 and PicoSpec Eq. 9 on the emulated link."""
    from benchmarks.spec import METHODS, REGIMES, run
    from tandem.errors import TandemError

    unknown = [r for r in regime if r not in REGIMES] + [
        m for m in method or [] if m not in METHODS
    ]
    if unknown:
        raise TandemError(f"unknown regime or method: {', '.join(unknown)}")
    run(
        out=out,
        quick=quick,
        regimes=tuple(regime),
        rtts=tuple(rtt),
        methods=tuple(method) if method else tuple(METHODS),
        num_prompts=prompts,
        max_new_tokens=max_new_tokens,
        draft_len=draft_len,
        rate_mbit=rate,
        sqs=not no_sqs,
        cpus=role_cpus(device_cpus, cloud_cpus),
    )


@app.command("spec-regimes")
def spec_regimes(
    quick: bool = typer.Option(False, "--quick", help="One prompt, 16 tokens."),
    rtt: list[float] = typer.Option([0, 100, 200], "--rtt", help="Round-trip times (ms)."),
    prompts: int = typer.Option(None, "--prompts", help="Number of prompts (default 1 quick / 2)."),
    max_new_tokens: int = typer.Option(None, "--max-new-tokens", "-n"),
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    out: Path = OUT,
) -> None:
    """Where PicoSpec's async pipeline pays: agreement x draft speed x RTT (emulated pair)."""
    from benchmarks.spec_regimes import run

    run(
        out=out,
        quick=quick,
        rtts=tuple(rtt),
        num_prompts=prompts,
        max_new_tokens=max_new_tokens,
        cpus=role_cpus(device_cpus, cloud_cpus),
    )


@app.command("spec-net")
def spec_net(
    rtt: list[float] = typer.Option([0, 100, 200], "--rtt", help="Round-trip times (ms)."),
    prompts: int = typer.Option(1, "--prompts", help="Number of prompts."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", "-n"),
    rate: float = typer.Option(100.0, "--rate", help="Link rate (Mbit/s), each way."),
    device_model: str = typer.Option("qwen2.5-coder-0.5b", "--device-model"),
    cloud_model: str = typer.Option("qwen2.5-coder-1.5b", "--cloud-model"),
    path: str = typer.Option("auto", "--path", help="auto, netns (root) or loopback."),
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    out: Path = OUT,
) -> None:
    """The real pair as two processes over `tandem net`, each on its own cores: cloud AR,
    stop-and-wait, PicoSpec."""
    from benchmarks.spec_net import run

    run(
        out=out,
        rtts=tuple(rtt),
        num_prompts=prompts,
        max_new_tokens=max_new_tokens,
        rate_mbit=rate,
        device_model=device_model,
        cloud_model=cloud_model,
        path=path,
        cpus=role_cpus(device_cpus, cloud_cpus),
    )


@app.command("rapid-net")
def rapid_net(
    rtt: list[float] = typer.Option([0, 100, 200], "--rtt", help="Round-trip times (ms)."),
    context_tokens: int = typer.Option(1024, "--context-tokens", help="Long-context length."),
    tasks: int = typer.Option(2, "--tasks", help="Quote tasks."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", "-n"),
    model: str = typer.Option("qwen2.5-coder-0.5b", "--model", "-m"),
    device_cpus: str = DEVICE_CPUS,
    cloud_cpus: str = CLOUD_CPUS,
    out: Path = OUT,
) -> None:
    """RAPID split between device (drafter, C^S) and cloud (target, C) over the emulated link."""
    from benchmarks.rapid_net import run

    run(
        out=out,
        rtts=tuple(rtt),
        context_tokens=context_tokens,
        num_tasks=tasks,
        max_new_tokens=max_new_tokens,
        model=model,
        cpus=role_cpus(device_cpus, cloud_cpus),
    )


def _register_subcommands() -> None:
    """Benchmarks that live in their own CLI modules."""
    from benchmarks.cli import dragon as bench_dragon
    from benchmarks.cli.dragon_quality import perplexity, scheduling
    from benchmarks.cli.humaneval import humaneval, humaneval_sweep, humaneval_traces
    from benchmarks.cli.private import private_spec
    from benchmarks.cli.serve import serve_load
    from benchmarks.cli.spec_paper import spec_paper

    app.command("serve")(serve_load)
    app.command("humaneval")(humaneval)
    app.command("humaneval-sweep")(humaneval_sweep)
    app.command("humaneval-traces")(humaneval_traces)
    app.command("spec-paper")(spec_paper)
    app.command("private-spec")(private_spec)
    bench_dragon.app.command("perplexity")(perplexity)
    bench_dragon.app.command("scheduling")(scheduling)
    app.add_typer(bench_dragon.app, name="dragon", help="DRAGON: Figs. 5-8 and Theorem 6.2.")


_register_subcommands()
