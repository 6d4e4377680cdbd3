"""When generation ends: EOS, max tokens, stop strings. Shared by every decoder."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase


@dataclass
class StopRule:
    max_tokens: int  # generated tokens, the prefill's first token included
    eos_ids: frozenset[int] = frozenset()  # any of these ends generation (it is kept in token_ids)
    stop: tuple[str, ...] = ()  # stop strings; the text is cut before the first occurrence
    tokenizer: PreTrainedTokenizerBase | None = None  # needed only for stop strings

    def finish_reason(self, generated: list[int]) -> str | None:
        """'stop' (EOS or stop string), 'length', or None to go on."""
        if generated and generated[-1] in self.eos_ids:
            return "stop"
        if self.stop and self.tokenizer is not None:
            tail = self.tokenizer.decode(generated[-32:], skip_special_tokens=False)
            if any(s in tail for s in self.stop):
                return "stop"
        if len(generated) >= self.max_tokens:
            return "length"
        return None

    def cut_text(self, text: str) -> str:
        cuts = [text.find(s) for s in self.stop if s in text]
        return text[: min(cuts)] if cuts else text


def eos_ids_of(tokenizer: PreTrainedTokenizerBase | None, config) -> frozenset[int]:
    ids = set()
    eos = getattr(config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
