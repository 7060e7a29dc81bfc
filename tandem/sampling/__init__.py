"""tandem.sampling: pure math on tensors (no models, no I/O).

- `warp`: temperature / top-k / top-p and sampling.
- `speculative`: block verification (accepted, recovered and bonus tokens).
- `aggregation`: DRAGON side weights, mixtures and Speculative Aggregation (Algorithm 1).
- `rapid`: RAPID's retrieval-augmented target and its two verification modes.
- `seeds`: the per-position seed scheme every protocol draws with.

Every function takes tensors and, when it draws, a `torch.Generator`. What each kernel's
output follows, and how that is tested, is in docs/exactness.md.
"""
