"""PicoSpec's performance model (paper Sec. 3.4), as pure functions.

Words used here: gamma = draft tokens per block, alpha = per-token acceptance probability,
t_draft = time to draft a block, t_verify = the cloud's time to verify one, t_rtt = round trip
(serialization included). A *step* is one block's cycle; it yields EL tokens.

    EL       = (1 - alpha^gamma) / (1 - alpha)                                    (Eq. 5)
    L_sync   = t_draft + t_rtt + t_verify                                          (Eq. 6)
    R_sync   = EL / L_sync                                                          (Eq. 7)
    E[T]     = alpha^gamma max(t_draft, t_rtt + t_verify)
               + (1 - alpha^gamma)(t_draft + t_rtt + t_verify)                     (Eq. 9)
    R_async  = EL / E[T]

Eq. 5 counts a fully accepted block as gamma tokens (no bonus), which is what the async
pipeline emits; stop-and-wait adds a bonus token on full acceptance, so its tokens per
step are (1 - alpha^(gamma + 1)) / (1 - alpha) (`expected_tokens(..., bonus=True)`).
"""

from __future__ import annotations


def expected_tokens(alpha: float, gamma: int, *, bonus: bool = False) -> float:
    """Eq. 5: expected tokens per step (one more power of alpha with a bonus token)."""
    terms = gamma + 1 if bonus else gamma
    if alpha >= 1.0:
        return float(terms)
    return (1.0 - alpha**terms) / (1.0 - alpha)


def sync_step_time(t_draft: float, t_rtt: float, t_verify: float) -> float:
    """Eq. 6: one stop-and-wait step."""
    return t_draft + t_rtt + t_verify


def async_step_time(
    alpha: float, gamma: int, t_draft: float, t_rtt: float, t_verify: float
) -> float:
    """Eq. 9: expected amortized time of one pipelined step."""
    hit = alpha**gamma
    return hit * max(t_draft, t_rtt + t_verify) + (1.0 - hit) * (t_draft + t_rtt + t_verify)


def sync_throughput(
    alpha: float, gamma: int, t_draft: float, t_rtt: float, t_verify: float
) -> float:
    """Eq. 7 with the bonus token stop-and-wait actually gets (tokens per second)."""
    return expected_tokens(alpha, gamma, bonus=True) / sync_step_time(t_draft, t_rtt, t_verify)


def async_throughput(
    alpha: float, gamma: int, t_draft: float, t_rtt: float, t_verify: float
) -> float:
    """R_async = EL / E[T] (tokens per second)."""
    return expected_tokens(alpha, gamma) / async_step_time(alpha, gamma, t_draft, t_rtt, t_verify)


def speedup_bound(t_draft: float, t_rtt: float, t_verify: float) -> float:
    """Eq. 10: the async / sync speedup as alpha -> 1 (compute-bound case)."""
    return (t_draft + t_rtt + t_verify) / t_draft
