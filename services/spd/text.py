"""Prompts in, text out: chat templating, and incremental detokenisation for streams."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str | None = None,
                  messages: list[dict] | None = None, raw: bool = False) -> list[int]:
    """Token ids of a prompt: through the model's chat template unless `raw`."""
    if raw:
        return tokenizer.encode(prompt or "", add_special_tokens=False)
    messages = messages or [{"role": "user", "content": prompt or ""}]
    ids: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


class TextStream:
    """Turns a growing list of token ids into text deltas whose concatenation is the final text.

    A delta is released only when it is stable: no dangling partial UTF-8 sequence, and (with stop
    strings) nothing that could still turn out to be the start of a stop string, so the
    concatenated deltas always equal the unary answer: `decode(all tokens)` cut before the first
    stop string.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...] = (), skip_special_tokens: bool = True):
        self.tokenizer, self.stop, self.skip = tokenizer, tuple(stop), skip_special_tokens
        self.ids: list[int] = []
        self.emitted = ""

    def text(self) -> str:
        """The full text so far, cut before the first stop string."""
        text: str = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip)  # type: ignore[assignment]
        cuts = [text.find(s) for s in self.stop if s in text]
        return text[: min(cuts)] if cuts else text

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.text()
        hold = max((len(s) - 1 for s in self.stop), default=0)  # a stop string may still complete
        stable = text[: len(text) - hold] if hold else text
        if stable.endswith("\ufffd") or not stable.startswith(self.emitted) or len(stable) <= len(self.emitted):
            return ""
        delta, self.emitted = stable[len(self.emitted):], stable
        return delta

    def flush(self) -> str:
        """The rest of the text at the end of the stream."""
        text = self.text()
        delta = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return delta
