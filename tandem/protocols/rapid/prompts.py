"""The two prompts of a RAPID run, worded as in the authors' code (src/rag.py).

- *target prompt*: the long context C, the question, "answer based on the <Context>".
- *drafter prompt*: the retrieval context C^S, the question, "answer based on the
  <Retrieved Context> ... make reasonable inferences".
Both go through the model's chat template when its tokenizer has one (`chat_prompt`).
The generated continuation is shared: both models append the same tokens.
"""

from __future__ import annotations

from tandem.models.base import Tokenizer

TARGET_TEMPLATE = (
    "<Context>\n{context}\n</Context>\n\n{question}\n"
    "Please answer the question based on the <Context> provided above."
)
DRAFTER_TEMPLATE = (
    "<Retrieved Context>\n{context}\n</Retrieved Context>\n\n{question}\n"
    "Please answer the question based on the <Retrieved Context> provided above. "
    "If the context doesn't contain all necessary information, please make reasonable "
    "inferences based on the available information."
)


def render(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of a one-turn chat prompt (plain text + "Answer:" without a chat template)."""
    chat = getattr(tokenizer, "chat_prompt", None)
    return list(chat(text)) if chat is not None else tokenizer.encode(f"{text}\nAnswer:")


def target_prompt(tokenizer: Tokenizer, context: str, question: str) -> list[int]:
    return render(tokenizer, TARGET_TEMPLATE.format(context=context, question=question))


def drafter_prompt(tokenizer: Tokenizer, retrieved: str, question: str) -> list[int]:
    return render(tokenizer, DRAFTER_TEMPLATE.format(context=retrieved, question=question))
