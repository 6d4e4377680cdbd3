"""Build the teacher caches (resumable): `python -m spd.train.prepare selfgen|text [options]`.

selfgen: the target's own greedy responses to ShareGPT first-turn prompts (train split, or the
held-out split with --split heldout). text: a teacher forward over ShareGPT conversations.
Both write shards under $SPD_CACHE/teacher/<model>/<name>/ (see spd.train.teacher).
"""

from __future__ import annotations

import argparse
import logging
import random

import torch

from spd.models.loading import load_tokenizer, resolve_model
from spd.train.data import encode_chat, load_sharegpt, prompt_ids, split_conversations
from spd.train.teacher import forward_teacher, record_teacher, teacher_dir
from spd.train.memory import keep_freed_memory
from spd.train.precision import resolve_dtype


def selfgen_prompts(tokenizer, split: str, max_prompt: int, seed: int = 0, block: int = 256) -> list[list[int]]:
    """Templated first-turn prompts in a fixed order: shuffled, then sorted by length within blocks
    of `block` (prefills of similar lengths; the same order on every run, so resuming is exact)."""
    train, held = split_conversations(load_sharegpt())
    convs = train if split == "train" else held
    rng = random.Random(seed)
    convs = list(convs)
    rng.shuffle(convs)
    prompts = [p for p in (prompt_ids(tokenizer, c.first_prompt) for c in convs) if len(p) <= max_prompt]
    out = []
    for i in range(0, len(prompts), block):
        out.extend(sorted(prompts[i:i + block], key=len))
    return out


def text_sequences(tokenizer, split: str, max_len: int, seed: int = 0):
    train, held = split_conversations(load_sharegpt())
    convs = list(train if split == "train" else held)
    random.Random(seed).shuffle(convs)
    for c in convs:
        enc = encode_chat(tokenizer, c.messages, max_len)
        if enc is not None:
            yield enc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m spd.train.prepare")
    p.add_argument("kind", choices=["selfgen", "text"])
    p.add_argument("--model", default=None)
    p.add_argument("--split", choices=["train", "heldout"], default="train")
    p.add_argument("--name", default=None, help="cache name (default: <kind>-<split>)")
    p.add_argument("--batch", type=int, default=128, help="selfgen: rows decoding together; text: sequences per forward")
    p.add_argument("--max-prompt", type=int, default=256)
    p.add_argument("--max-new", type=int, default=256)
    p.add_argument("--max-len", type=int, default=768, help="text: sequence cap")
    p.add_argument("--max-items", type=int, default=0, help="use at most this many prompts/sequences")
    p.add_argument("--tokens", type=int, default=0, help="stop after this many cached positions")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="teacher dtype (auto: bf16 where the hardware has bf16 units, spd.train.precision)")
    p.add_argument("--device", default="cpu", help="torch device of the teacher (cuda for the GPU recipe)")
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    model_dir = resolve_model(args.model)
    tok = load_tokenizer(model_dir)
    out = teacher_dir(model_dir, args.name or f"{args.kind}-{args.split}")
    dtype = resolve_dtype(args.dtype, args.device)
    if args.kind == "selfgen":
        prompts = selfgen_prompts(tok, args.split, args.max_prompt)
        if args.max_items:
            prompts = prompts[:args.max_items]
        record_teacher(model_dir, prompts, out, args.batch, args.max_new, eos_id=tok.eos_token_id,
                       limit_tokens=args.tokens or None, meta={"split": args.split}, dtype=dtype, device=args.device)
    else:
        seqs = list(text_sequences(tok, args.split, args.max_len))
        if args.max_items:
            seqs = seqs[:args.max_items]
        forward_teacher(model_dir, seqs, out, args.batch, limit_tokens=args.tokens or None,
                        meta={"split": args.split, "max_len": args.max_len}, dtype=dtype, device=args.device)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
