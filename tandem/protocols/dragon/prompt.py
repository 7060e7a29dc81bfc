"""How one retrieved document and the question become one decoding row.

Words used here:
- *row*: `doc_prefix(doc) + question_suffix(question)` token ids; DRAGON decodes one row per
  retrieved document (output aggregation), never the documents concatenated.
- *doc prefix*: the document wrapped as a self-contained system turn. It does not depend on
  the question, so its KV cache can be stored once and reused (`DocKVStore`).
- *question suffix*: the user turn and the start of the assistant turn, the same for every
  row, decoded on top of the stacked document prefixes in one batched pass.
- *bare row*: a side without documents decodes one row of the plain prompt.

ChatML (`<|im_start|>` is one token: Qwen) gets a chat layout; any other tokenizer (the tiny
test models' bytes) gets a plain "Context / User / Assistant" layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.models.base import Tokenizer

SYSTEM = "You are a helpful coding assistant."


@dataclass(frozen=True, kw_only=True)
class RagPrompt:
    doc_template: str
    bare_template: str
    question_template: str

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> RagPrompt:
        if len(tokenizer.encode("<|im_start|>")) == 1:
            return cls(
                doc_template=(
                    f"<|im_start|>system\n{SYSTEM} Use this context if it is relevant:\n"
                    "{doc}<|im_end|>\n"
                ),
                bare_template=f"<|im_start|>system\n{SYSTEM}<|im_end|>\n",
                question_template="<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n",
            )
        return cls(
            doc_template="Context: {doc}\n",
            bare_template="",
            question_template="User: {question}\nAssistant:",
        )

    def doc_prefix(self, tokenizer: Tokenizer, doc: str | None) -> list[int]:
        text = self.bare_template if doc is None else self.doc_template.format(doc=doc)
        return tokenizer.encode(text) if text else []

    def question_suffix(self, tokenizer: Tokenizer, question: str) -> list[int]:
        return tokenizer.encode(self.question_template.format(question=question))
