"""Prompts in, text out: chat templating, and incremental detokenisation for streams."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | None = None,
                  messages: list[dict] | None = None, raw: bool = False) -> list[int]:
    """Token ids of a prompt: through the model's chat template unless `raw`."""
    if raw:
        return tokenizer.encode(prompt or "", add_special_tokens=False)
    messages = messages or [{"role": "user", "content": prompt or ""}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


class TextStream:
    """Turns a growing list of token ids into text deltas whose concatenation is the full text.

    A delta is released only when the decoded text is stable (no dangling partial UTF-8 sequence),
    so the concatenated deltas always equal `decode(all tokens)`.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = True):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        if text.endswith("\ufffd") or not text.startswith(self.emitted):
            return ""
        delta, self.emitted = text[len(self.emitted):], text
        return delta

    def flush(self) -> str:
        """The rest of the text at the end of the stream."""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)
        delta = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return delta
