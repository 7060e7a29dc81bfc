"""The burner of `testbed.Testbed.contended`: the same model decoding greedily on the cloud's
cores, nonstop while "on", so the device's decode meets the memory-system contention it meets
during DRAGON (the testbed control; docs/dragon.md, "Two sides on one box"); also the busy
device's decoders (`Testbed(busy_device=n)`), on the device's cores for the whole run.

    python -m tandem.baselines.dragon.burner --model M --threads N

stdin: "on" / "off", one per line; stdout: one `testbed.MARK` line per command (and one when
loaded): {"burning", and after "off" "steps", "ms_per_step"}, or {"error"} if decoding failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from tandem.baselines.dragon.testbed import MARK

BURN_CONTEXT = 160  # tokens of context the burner decodes after (about a DRAGON side's)
BURN_TOKENS = 64  # then it crops back to the context and goes on


def burn(model: str, threads: int) -> None:
    """The burner (`Testbed.contended`): "on" on stdin starts greedy decoding in a loop (the
    answer comes once the first step is done), "off" stops it (answered once stopped). The
    context is prefilled once, at start: while "on" it only decodes, as a DRAGON side does."""
    from tandem.models.registry import load_model
    from tandem.protocols.dragon.setup import set_threads

    set_threads(threads)
    lm = load_model(model, progress=False)
    ids = lm.tokenizer.encode("def parse(line):\n    return line.split(',')\n") * 40
    ids = ids[:BURN_CONTEXT]
    running, stepped, idle = threading.Event(), threading.Event(), threading.Event()
    steps: list[float] = []  # seconds of each step since "on"
    failed: list[str] = []

    def loop() -> None:
        try:
            state = lm.prefill([ids])
            token = int(state.logits[0].argmax())
            while True:
                idle.set()
                running.wait()
                idle.clear()
                while running.is_set():  # decode steps only, at a DRAGON side's context
                    if state.seq_len >= BURN_CONTEXT + BURN_TOKENS:
                        lm.crop(state, BURN_CONTEXT)  # back to the context, no new prefill
                    began = time.perf_counter()
                    token = int(lm.decode(state, [[token]])[0].argmax())
                    steps.append(time.perf_counter() - began)
                    stepped.set()
        except Exception as exc:  # noqa: BLE001 - answered on stdout, never a hang
            failed.append(f"{type(exc).__name__}: {exc}")
            stepped.set()
            idle.set()

    threading.Thread(target=loop, daemon=True).start()
    print(MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        answer: dict = {}
        if line.strip() == "on":
            steps.clear()
            stepped.clear()
            running.set()
            stepped.wait()
        else:
            running.clear()
            idle.wait()  # the step in flight ends
            answer = {"steps": len(steps), "ms_per_step": 1e3 * sum(steps) / max(1, len(steps))}
        if failed:
            answer = {"error": failed[0]}
        print(MARK + json.dumps({"burning": running.is_set(), **answer}), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tandem.baselines.dragon.burner")
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    burn(args.model, args.threads)


if __name__ == "__main__":
    main()
