"""The both-knowledge question set of `tandem bench private-spec`: every question's private
fact is in the private notes, its public fact names a stdlib object that exists, and scoring
needs both."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from benchmarks.private_tasks import TASKS, score

NOTES = Path(__file__).resolve().parents[2] / "examples" / "private-notes"


def notes_text() -> str:
    return "\n".join(p.read_text() for p in sorted(NOTES.rglob("*")) if p.is_file()).lower()


def resolve(name: str):
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def test_there_are_at_least_twenty_questions():
    assert len(TASKS) >= 20
    assert len({task.question for task in TASKS}) == len(TASKS)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.public_name)
def test_each_fact_is_where_it_should_be(task):
    text = notes_text()
    assert any(key.lower() in text for key in task.private), task.private
    assert resolve(task.public_name) is not None
    name = task.public_name.lower()
    assert any(key.strip("().").lower() in name for key in task.public), task.public


def test_an_answer_needs_both_facts():
    task = TASKS[0]
    assert score(task, "Start at 0.5 s and await asyncio.sleep(delay).").correct
    assert not score(task, "Start at 0.5 s.").correct
    assert not score(task, "Use asyncio.sleep.").correct
    assert score(task, "USE ASYNCIO.SLEEP").public


def test_latency_skips_one_token_answers_and_pools_the_gaps():
    from benchmarks.private_spec import _aggregate

    def rec(tokens, ms, total):
        return {"method": "device-rag", "rtt_ms": 0.0, "tokens": tokens, "ms_per_token": ms,
                "ttft_s": 1.0, "total_s": total, "correct": False, "private": True,
                "public": False}  # fmt: skip

    cell = _aggregate([rec(1, float("nan"), 1.0), rec(5, 100.0, 1.4)], ("device-rag",), (0.0,))
    cell = cell[0]["by_rtt"]["0.0"]
    assert cell["ms_per_token_mean"] == 100.0  # the one-token answer has no gap (was NaN)
    assert abs(cell["ms_per_token_pooled"] - 100.0) < 1e-9
    assert cell["tokens"] == 6
