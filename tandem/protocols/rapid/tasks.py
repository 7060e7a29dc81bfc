"""An offline long-context task set built deterministically from the stdlib docstring corpus.

Why one file: the builders and the scoring are one unit; each task's reference answer and
its check follow from how the task was cut from the corpus.

How a task is built (nothing is downloaded, nothing is random):
1. The corpus is `tandem.retrieval.stdlib.stdlib_documents()`: one document per documented
   public module, class, function and method of the local Python's standard library (so the
   set depends only on the Python version; this file states 3.11's in docs/rapid.md).
   A *module text* is its documents joined by blank lines, in corpus order.
2. A *needle* is one function or method documentation, chosen by kind:
   - "default": its signature has a parameter whose default is a distinctive literal (an int
     other than -1/0/1, a float, or a short non-empty string); question: "What is the default
     value of the parameter `P` of `F`?"; answer: the literal; metric: the literal appears in
     the output (exact match, word-bounded).
   - "name": its docstring's first sentence (30-200 characters) is unique in the corpus;
     question: which function is documented as "<sentence>"; answer: its qualified name;
     metric: its last two dotted parts ("fnmatch.fnmatchcase") appear in the output, or its
     name alone if that has 8 characters or more ("fnmatchcase", not "parse").
   - "quote": question: copy the first sentences of the documentation of `F`; answer: the
     first `quote_words` words of the docstring; metric: ROUGE-L F1 over words (a longer
     output, for throughput and acceptance).
   - "code": a code task whose needed API fact is documented in the context: write
     `def answer():` returning the default of the parameter `P` of `F` (a "default" needle);
     metric: pass@1, the model's code plus `assert answer() == <literal>` executed by
     `tandem.sandbox` (another process, a timeout, limits; never the benchmark's process).
   Candidates of a kind are ordered by sha256(salt, kind, document id) and taken in order.
3. The *long context* of a task (`build_tasks`): the needle's module text plus *distractor* module texts
   (every other module whose text fits, ordered by sha256(salt, task id, module)), added until
   `context_tokens` tokens (counted with the generating model's tokenizer); the needle module
   is inserted at depth sha256(...) in [0, 1); the last distractor is cut to fit.
4. A *shared* long context (`build_shared_tasks`, the 4K-32K runs): many tasks ask about one
   context, so a benchmark prefills it once and every question continues from that KV. The
   needles are the documentation entries themselves (not whole modules), each at its own
   hashed depth among distractor modules; distractors exclude the needles' top-level packages,
   so each needle's entry appears once.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.models.base import Tokenizer
from tandem.retrieval.document import Document

KINDS = ("default", "name", "quote")
SHARED_KINDS = (*KINDS, "code")
CODE_TIMEOUT_S = 10.0
SALT = "tandem-rapid-tasks-v1"


@dataclass(frozen=True, kw_only=True)
class LongContextTask:
    task_id: str
    kind: str
    context: str
    question: str
    answer: str
    needle: str  # qualified name of the documented function
    needle_module: str
    depth: float  # where the needle module starts, as a fraction of the context's modules
    context_tokens: int  # measured with the tokenizer the set was built with

    def score(self, output: str) -> float:
        return score_answer(self.kind, self.answer, self.needle, output)


def _rank(*parts: str) -> str:
    return hashlib.sha256(":".join((SALT, *parts)).encode()).hexdigest()


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9_]+|[^\sA-Za-z0-9_]", text.lower())


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 over lower-cased words and punctuation marks."""
    cand, ref = _words(candidate), _words(reference)
    if not cand or not ref:
        return 0.0
    previous = [0] * (len(ref) + 1)
    for word in cand:  # longest common subsequence, one row at a time
        current = [0]
        for j, other in enumerate(ref):
            current.append(previous[j] + 1 if word == other else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(cand), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def _contains(output: str, needle: str, *, after_dot: bool = False) -> bool:
    before = r"(?<!\w)" if after_dot else r"(?<![\w.])"
    return re.search(rf"{before}{re.escape(needle)}(?!\w)", output) is not None


def code_of(output: str) -> str:
    """The code in a model's answer: its first fenced block, else the whole text."""
    match = re.search(r"```(?:python|py)?[^\n]*\n(.*?)(?:```|$)", output, re.S)
    return match.group(1) if match else output


def passes(program: str, timeout: float = CODE_TIMEOUT_S) -> bool:
    """Does `program` exit 0 in the sandbox (`tandem.sandbox`) within `timeout` seconds?"""
    from tandem.sandbox import execute

    return execute(program, timeout_s=timeout).passed


def score_answer(kind: str, answer: str, needle: str, output: str) -> float:
    if kind == "code":
        return float(passes(f"{code_of(output)}\n\nassert answer() == {answer}\n"))
    if kind == "quote":
        return rouge_l(output, answer)
    if kind == "name":  # owner + name ("Stats.sort"), or a distinctive name alone
        owner_and_name = ".".join(needle.split(".")[-2:])
        name = needle.rsplit(".", 1)[-1]
        if _contains(output, owner_and_name, after_dot=True):
            return 1.0
        return float(len(name) >= 8 and _contains(output, name, after_dot=True))
    bare = answer.strip("'\"")
    return float(_contains(output, answer) or (bool(bare) and _contains(output, bare)))


# -- needles -----------------------------------------------------------------------------------


def _split(doc: Document) -> tuple[str, str]:
    heading, _, body = doc.text.partition("\n\n")
    return heading, body.strip()


def _distinctive_defaults(heading: str) -> list[tuple[str, str]]:
    """(parameter, literal) pairs of a `qual(args)` heading with a distinctive default."""
    signature = heading[heading.find("(") :]
    try:
        args = ast.parse(f"def f{signature}: pass").body[0].args  # type: ignore[attr-defined]
    except SyntaxError:
        return []
    positional = [*args.posonlyargs, *args.args]
    pairs = list(
        zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
    )
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d]
    found = []
    for arg, default in pairs:
        if not isinstance(default, ast.Constant) or isinstance(default.value, bool):
            continue
        value = default.value
        if isinstance(value, int) and value in (-1, 0, 1):
            continue
        if isinstance(value, str) and not 0 < len(value) <= 20:
            continue
        if isinstance(value, int | float | str):
            found.append((arg.arg, ast.unparse(default)))
    return found


def _first_sentence(body: str) -> str:
    flat = " ".join(body.split())
    match = re.match(r"(.+?[.!?])(\s|$)", flat)
    return match.group(1) if match else ""


def needles(docs: Sequence[Document], kind: str, *, quote_words: int = 40) -> list[dict]:
    """Candidate (question, answer, needle) records of one kind, in their deterministic order."""
    functions = [d for d in docs if d.meta.get("kind") in ("function", "method")]
    sentences: dict[str, int] = {}
    for doc in functions:
        sentence = _first_sentence(_split(doc)[1])
        sentences[sentence] = sentences.get(sentence, 0) + 1
    records = []
    for doc in functions:
        heading, body = _split(doc)
        qual = heading[: heading.find("(")]
        module = str(doc.meta["module"])
        if kind in ("default", "code"):
            pairs = _distinctive_defaults(heading)
            if not pairs:
                continue
            param, literal = pairs[0]
            question = (
                f"What is the default value of the parameter `{param}` of `{qual}`? "
                "Answer with the value only."
                if kind == "default"
                else f"Write a Python function `answer()` that returns the default value of "
                f"the parameter `{param}` of `{qual}`, as documented. Reply with the code only."
            )
            answer = literal
        elif kind == "name":
            sentence = _first_sentence(body)
            if not 30 <= len(sentence) <= 200 or sentences[sentence] != 1:
                continue
            question = (
                f'Which function is documented as: "{sentence}"? '
                "Answer with its fully qualified name."
            )
            answer = qual
        elif kind == "quote":
            words = body.split()
            if len(words) < quote_words // 2:
                continue
            question = f"Quote the beginning of the documentation of `{qual}` word for word."
            answer = " ".join(words[:quote_words])
        else:
            raise ValueError(f"unknown task kind {kind!r}")
        records.append(
            {
                "question": question,
                "answer": answer,
                "needle": qual,
                "module": module,
                "text": doc.text,
                "rank": _rank(kind, doc.doc_id),
            }
        )
    return sorted(records, key=lambda r: r["rank"])


# -- contexts ----------------------------------------------------------------------------------


def module_texts(docs: Sequence[Document]) -> dict[str, str]:
    by_module: dict[str, list[str]] = {}
    for doc in docs:
        by_module.setdefault(str(doc.meta["module"]), []).append(doc.text)
    return {module: "\n\n".join(texts) for module, texts in by_module.items()}


class TokenCache:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: dict[str, list[int]] = {}

    def __call__(self, module: str, text: str) -> list[int]:
        if module not in self.ids:
            self.ids[module] = self.tokenizer.encode(text)
        return self.ids[module]


def build_context(
    task_id: str,
    needle_module: str,
    texts: dict[str, str],
    count: TokenCache,
    context_tokens: int,
) -> tuple[str, float]:
    """(context, depth): the needle module among hashed distractors, about `context_tokens` long."""
    needle_ids = count(needle_module, texts[needle_module])
    room = context_tokens - len(needle_ids)
    order = sorted(
        (m for m in texts if m != needle_module and m.split(".")[0] != needle_module.split(".")[0]),
        key=lambda m: _rank(task_id, m),
    )
    blocks: list[str] = []
    for module in order:
        if room <= 0:
            break
        ids = count(module, texts[module])
        if len(ids) > room:
            if room < 64:
                break
            blocks.append(count.tokenizer.decode(ids[:room]))
            room = 0
            break
        blocks.append(texts[module])
        room -= len(ids) + 2
    depth = int(_rank(task_id, "depth")[:8], 16) / 16**8
    at = round(depth * len(blocks))
    blocks.insert(at, texts[needle_module])
    return "\n\n".join(blocks), at / max(1, len(blocks) - 1)


def build_tasks(
    tokenizer: Tokenizer,
    *,
    context_tokens: int,
    num_tasks: int,
    kinds: Sequence[str] = KINDS,
    docs: Sequence[Document] | None = None,
    quote_words: int = 40,
) -> list[LongContextTask]:
    """`num_tasks` tasks per kind whose contexts hold about `context_tokens` tokens."""
    if docs is None:
        from tandem.retrieval.stdlib import stdlib_documents

        docs = stdlib_documents()
    texts = module_texts(docs)
    count = TokenCache(tokenizer)
    tasks = []
    for kind in kinds:
        made = 0
        for record in needles(docs, kind, quote_words=quote_words):
            if made >= num_tasks:
                break
            module = record["module"]
            if len(count(module, texts[module])) > context_tokens // 3:
                continue  # the needle's module must leave room for distractors
            task_id = f"{kind}-{context_tokens}-{made}"
            context, depth = build_context(task_id, module, texts, count, context_tokens)
            tasks.append(
                LongContextTask(
                    task_id=task_id,
                    kind=kind,
                    context=context,
                    question=record["question"],
                    answer=record["answer"],
                    needle=record["needle"],
                    needle_module=module,
                    depth=depth,
                    context_tokens=len(tokenizer.encode(context)),
                )
            )
            made += 1
    return tasks


def _top(module: str) -> str:
    return module.split(".")[0]


def build_shared_tasks(
    tokenizer: Tokenizer,
    *,
    context_tokens: int,
    num_tasks: int,
    kinds: Sequence[str] = SHARED_KINDS,
    docs: Sequence[Document] | None = None,
    quote_words: int = 40,
    max_needle_tokens: int = 256,
) -> list[LongContextTask]:
    """Up to `num_tasks` tasks per kind that share one context of about `context_tokens`
    tokens (module doc, point 4). Needles take at most half of the context: at a short
    context fewer tasks may fit (the count is in the result)."""
    if docs is None:
        from tandem.retrieval.stdlib import stdlib_documents

        docs = stdlib_documents()
    texts = module_texts(docs)
    count = TokenCache(tokenizer)
    chosen: list[tuple[str, dict]] = []
    used_tops: set[str] = set()
    room = context_tokens // 2
    pools = {kind: needles(docs, kind, quote_words=quote_words) for kind in kinds}
    for _ in range(num_tasks):  # one needle of each kind per pass, so every kind gets its share
        for kind in kinds:
            for record in pools[kind]:
                if _top(record["module"]) in used_tops:
                    continue
                size = len(count(f"doc:{record['needle']}", record["text"]))
                if size > min(max_needle_tokens, room):
                    continue
                chosen.append((kind, record))
                used_tops.add(_top(record["module"]))
                room -= size + 2
                break
    context_id = f"shared-{context_tokens}"
    distractors = sorted(
        (m for m in texts if _top(m) not in used_tops), key=lambda m: _rank(context_id, m)
    )
    left = context_tokens - sum(len(count(f"doc:{r['needle']}", r["text"])) + 2 for _, r in chosen)
    blocks: list[str] = []
    for module in distractors:
        if left < 64:
            break
        ids = count(module, texts[module])
        if len(ids) > left:
            blocks.append(tokenizer.decode(ids[:left]))
            break
        blocks.append(texts[module])
        left -= len(ids) + 2
    for _, record in sorted(chosen, key=lambda c: _rank(context_id, "depth", c[1]["needle"])):
        depth = int(_rank(context_id, "depth", record["needle"])[:8], 16) / 16**8
        blocks.insert(round(depth * len(blocks)), record["text"])
    context = "\n\n".join(blocks)
    total = len(tokenizer.encode(context))
    made: dict[str, int] = {}
    tasks = []
    for kind, record in chosen:
        made[kind] = made.get(kind, 0) + 1
        at = blocks.index(record["text"])
        tasks.append(
            LongContextTask(
                task_id=f"{kind}-{context_tokens}-{made[kind] - 1}",
                kind=kind,
                context=context,
                question=record["question"],
                answer=record["answer"],
                needle=record["needle"],
                needle_module=record["module"],
                depth=at / max(1, len(blocks) - 1),
                context_tokens=total,
            )
        )
    return tasks
