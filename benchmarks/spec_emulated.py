"""A timing-emulated draft/target pair: PicoSpec's step times without using the CPU.

Words used here:
- `SleepLM` (tandem.models.emulated): a `CausalLM` whose logits are a deterministic function
  of the context and whose forward passes *sleep* for their calibrated time. The draft's
  logits mix in the target's (`mix`), which sets how often they agree.
- `paper_pair()`: timings from PicoSpec Table 2 (Qwen3 0.6B on a Jetson, 32B on A100s,
  gsm8k): drafting 24 ms per token (T_draft = 97 ms for 4), cloud decode ~74 ms per token
  (AR 13.89 tok/s), verifying a 4-token block ~90 ms (T_verify 87 ms); greedy agreement of
  ~0.7 per token (their accepted length 2.5 at n = 4), or ~0.93 (`mix=0.95`, like their
  Llama pair's accepted length 4.3-4.9).

This isolates the protocol (pipelining, interrupts, the network) from this shared 2-core CPU,
where real drafting and verifying slow each other down.
"""

from __future__ import annotations

from tandem.models.emulated import SleepLM


def paper_pair(
    mix: float = 0.8, suffix: str = "", draft_token_s: float = 0.024
) -> tuple[SleepLM, SleepLM]:
    """(draft, target) with PicoSpec's Qwen timings (module docstring). `mix` 0.8 agrees
    greedily on ~0.7 of tokens (PicoSpec's Qwen pair), 0.95 on ~0.93 (its Llama pair), 1.0
    always. `draft_token_s`: one draft step (PicoSpec's Jetson: 24 ms; larger = slower device)."""
    target = SleepLM(f"emulated-target{suffix}", base_s=0.070, per_token_s=0.004, prefill_s=0.120)
    draft = SleepLM(
        f"emulated-draft{suffix}",
        base_s=draft_token_s - 0.002,
        per_token_s=0.002,
        prefill_s=0.040,
        other=target,
        mix=mix,
    )
    return draft, target
