"""`tandem generate`: stream text from one model (device-only), then print tokens/s."""

from __future__ import annotations

import sys

import typer

DEFAULT_PROMPT = "Write a Python function that checks whether a string is a palindrome."


def generate(
    prompt: str = typer.Option(DEFAULT_PROMPT, "--prompt", "-p", help="What to ask the model."),
    model: str = typer.Option(
        "qwen2.5-coder-0.5b", "--model", "-m", help="Model name or local HF directory."
    ),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", min=1),
    temperature: float = typer.Option(0.0, "--temperature", "-t", min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(None, "--top-p", min=0.0, max=1.0),
    top_k: int = typer.Option(None, "--top-k", min=1),
    seed: int = typer.Option(0, "--seed"),
    raw: bool = typer.Option(
        False, "--raw", help="Use the prompt as-is, without the chat template."
    ),
) -> None:
    """Generate text with one model, streaming tokens as they come."""
    from tandem.config import SamplingConfig
    from tandem.models.registry import load_model
    from tandem.protocols.decoding import text_stream
    from tandem.protocols.local import generate as run

    config = SamplingConfig(
        temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, max_new_tokens=max_new_tokens
    )
    lm = load_model(model)
    ids = lm.tokenizer.encode(prompt) if raw else lm.tokenizer.chat_prompt(prompt)

    result = run(lm, ids, config, on_token=text_stream(lm.tokenizer, eos=lm.tokenizer.eos_token_id))
    print()
    head = result.headline()
    print(
        f"[{head.tokens} tokens, first token {(head.ttft_s or 0.0) * 1000:.0f} ms, "
        f"{head.tokens_per_s:.2f} tokens/s, finish: {head.finish_reason}]",
        file=sys.stderr,
    )
