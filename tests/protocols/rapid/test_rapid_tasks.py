"""The offline long-context task set: deterministic, answerable, scored as stated."""

from __future__ import annotations

import pytest

from tandem.models.tiny import ByteTokenizer
from tandem.protocols.rapid.tasks import build_tasks, needles, rouge_l, score_answer
from tandem.retrieval.document import Document


def doc(module: str, qual: str, signature: str, body: str, kind: str = "function") -> Document:
    return Document(
        doc_id=f"stdlib:{qual}",
        text=f"{qual}{signature}\n\n{body}",
        source="stdlib",
        meta={"module": module, "package": module.split(".")[0], "kind": kind},
    )


def corpus() -> list[Document]:
    docs = []
    for m in range(12):
        module = f"pkg{m}.mod"
        for f in range(4):
            docs.append(
                doc(
                    module,
                    f"{module}.func{f}",
                    f"(data, *, width={70 + 10 * m + f}, mode='fast{m}', flag=None)",
                    f"Transform data number {m}-{f} into a report of the requested width. "
                    + " ".join(f"detail{k}" for k in range(40)),
                )
            )
    return docs


def test_build_is_deterministic_and_the_needle_is_in_the_context():
    tokenizer = ByteTokenizer()
    first = build_tasks(tokenizer, context_tokens=6000, num_tasks=3, docs=corpus())
    second = build_tasks(tokenizer, context_tokens=6000, num_tasks=3, docs=corpus())
    assert first == second
    assert {t.kind for t in first} == {"default", "name", "quote"}
    assert len(first) == 9
    for task in first:
        assert task.needle in task.context
        assert task.answer.strip("'") in task.context or task.kind == "name"
        assert 6000 - 400 <= task.context_tokens <= 6000 + 64  # about the asked length
        assert task.score(task.answer) == 1.0
        assert 0.0 <= task.depth <= 1.0


def test_default_questions_skip_undistinctive_defaults():
    records = needles(corpus(), "default")
    assert records and all(r["answer"] not in ("None", "0", "1", "True", "False") for r in records)
    assert all("`data`" not in r["question"] for r in records)  # no default, never asked


def test_scoring_rules():
    assert score_answer("default", "'fast3'", "m.f", "The default is 'fast3'.") == 1.0
    assert score_answer("default", "'fast3'", "m.f", "It is fast3") == 1.0
    assert score_answer("default", "'fast3'", "m.f", "fast33") == 0.0
    assert score_answer("default", "80", "m.f", "width=180") == 0.0
    assert score_answer("name", "a.b.Stats.sort", "a.b.Stats.sort", "It is `Stats.sort`.") == 1.0
    assert score_answer("name", "a.b.Stats.sort", "a.b.Stats.sort", "It is `sort`.") == 0.0
    assert score_answer("name", "a.fnmatchcase", "a.fnmatchcase", "fnmatchcase") == 1.0
    assert rouge_l("the cat sat on the mat", "the cat sat on the mat") == 1.0
    assert rouge_l("", "x") == 0.0
    assert rouge_l("a b c d", "a x c y") == pytest.approx(0.5)


@pytest.mark.slow
def test_stdlib_task_set_builds_for_the_real_tokenizer(real_tokenizer):
    tasks = build_tasks(real_tokenizer, context_tokens=2048, num_tasks=2)
    assert len(tasks) == 6
    assert all(1800 <= t.context_tokens <= 2100 for t in tasks)
    assert tasks == build_tasks(real_tokenizer, context_tokens=2048, num_tasks=2)


def test_shared_tasks_ask_about_one_context_holding_each_needle_once():
    from tandem.protocols.rapid.tasks import SHARED_KINDS, build_shared_tasks

    tokenizer = ByteTokenizer()  # one token per byte: a needle here is ~500 tokens
    kw = dict(context_tokens=8000, num_tasks=2, docs=corpus(), max_needle_tokens=600)
    first = build_shared_tasks(tokenizer, **kw)
    assert first == build_shared_tasks(tokenizer, **kw)
    assert sorted(t.kind for t in first) == sorted(SHARED_KINDS * 2)
    assert len({t.context for t in first}) == 1
    assert len({t.needle for t in first}) == len(first)
    context = first[0].context
    for task in first:
        heading = f"{task.needle}("
        assert context.count(heading) == 1  # its entry, and no distractor from its package
        assert 8000 - 400 <= task.context_tokens <= 8000 + 64
        assert 0.0 <= task.depth <= 1.0
        if task.kind != "code":
            assert task.score(task.answer) == 1.0


def test_shared_tasks_fit_fewer_needles_in_a_short_context():
    from tandem.protocols.rapid.tasks import build_shared_tasks

    tasks = build_shared_tasks(
        ByteTokenizer(), context_tokens=2400, num_tasks=4, docs=corpus(), max_needle_tokens=600
    )
    assert 1 <= len(tasks) < 16
    assert all(t.context_tokens <= 2400 + 64 for t in tasks)


def test_code_tasks_are_scored_by_running_the_code_in_another_process():
    from tandem.protocols.rapid.tasks import code_of, passes

    right = "Here:\n```python\ndef answer():\n    return 'fast3'\n```\nDone."
    assert code_of(right).startswith("def answer():")
    assert score_answer("code", "'fast3'", "m.f", right) == 1.0
    assert score_answer("code", "'fast3'", "m.f", "def answer():\n    return 'fast33'") == 0.0
    assert score_answer("code", "80", "m.f", "def answer(:\n") == 0.0  # a syntax error
    assert score_answer("code", "80", "m.f", "80") == 0.0  # the bare value is not code
    assert not passes("while True:\n    pass", timeout=0.5)
    assert passes("import sys\nassert sys.flags.isolated")  # -I: no user site, no cwd
