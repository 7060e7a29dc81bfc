"""RAPID with the real Qwen2.5-Coder-0.5B (slow): greedy equivalence and one whole run
(MiniLM retrieval over a stdlib-docs context, both modes, short output)."""

from __future__ import annotations

import pytest

from tandem.baselines.rapid_baselines import lc
from tandem.protocols.rapid.config import RapidConfig, RetrievalConfig
from tandem.protocols.rapid.engine import rapid, run_rapid
from tandem.protocols.rapid.prompts import drafter_prompt, target_prompt
from tandem.protocols.rapid.states import Prefilled

pytestmark = pytest.mark.slow


def test_real_greedy_self_speculation_with_eta_zero_equals_target_greedy(real_lm, greedy):
    context = "\n".join(f"def f{i}(x):\n    return x + {i}" for i in range(30))
    question = "What does f7 return for x = 1? Answer briefly."
    retrieved = "def f7(x):\n    return x + 7"
    target = Prefilled(real_lm, target_prompt(real_lm.tokenizer, context, question))
    drafter = Prefilled(real_lm, drafter_prompt(real_lm.tokenizer, retrieved, question))
    reference = lc(target, RapidConfig(temperature=0.0, max_new_tokens=12))
    ids = target_prompt(real_lm.tokenizer, context, question)
    expected, margins = greedy.with_margins(real_lm, ids, len(reference.tokens))
    assert reference.tokens == expected
    for mode in ("exact", "paper"):
        cfg = RapidConfig(temperature=0.0, eta=0.0, mode=mode, gamma=4, max_new_tokens=12)
        greedy.assert_equal(real_lm, rapid(target, drafter, cfg).tokens, expected, margins)


def test_real_rapid_run_on_a_stdlib_task(real_lm):
    from tandem.protocols.rapid.tasks import build_tasks
    from tandem.retrieval.embedder import load_embedder

    task = build_tasks(real_lm.tokenizer, context_tokens=768, num_tasks=1, kinds=("default",))[0]
    retrieval = RetrievalConfig(chunk_tokens=128, min_tokens=256)
    embedder = load_embedder("all-minilm-l6-v2")
    for mode in ("exact", "paper"):
        cfg = RapidConfig(mode=mode, eta=10.0, gamma=4, temperature=0.1, max_new_tokens=8)
        result = run_rapid(
            real_lm, real_lm, task.context, task.question, config=cfg, embedder=embedder,
            retrieval=retrieval,
        )  # fmt: skip
        assert 1 <= len(result.tokens) <= 8
        assert 0.0 <= result.acceptance_rate <= 1.0
        assert result.rounds >= 1 and result.drafted >= result.accepted
        assert 0 < result.extra["retrieved_tokens"] <= result.extra["budget"] == 256
        assert result.extra["context_tokens"] == task.context_tokens
        assert 0.0 <= task.score(result.text) <= 1.0
