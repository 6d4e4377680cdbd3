"""Self-generated training text as token ids: the target's own answers to every ShareGPT user turn.

The expensive part of drafter data is the target's generation; its features (anchor states, top-k)
are cheap to recompute by one batched prefill. So this module produces only token ids, compactly
(2 bytes a token), in parts that can be committed and resumed on another machine:

  <root>/meta.json         prompt-list fingerprint, settings
  <root>/part_00000.npz    resp uint16|int32 [N] (flat responses, eos included when reached),
                           offsets int64 [S+1], job int32 [S] (index into `selfgen_jobs`)

Jobs: every user turn of every training conversation (earlier turns, as ShareGPT has them, are the
context; the oldest turns are dropped until the prompt fits), answered greedily, plus a sampled
answer (T = `SAMPLE_TEMP`) for a deterministic `SAMPLE_FRAC` of them: round 0, ~8.2M tokens for
SmolLM2. Each further round (`--rounds`, meta.json "rounds") appends one more sampled answer to
every prompt (31,673 for SmolLM2, ~5.9M tokens); a list with more rounds extends one with fewer,
so ids already generated keep their job numbers. Evaluation sets never enter: ShareGPT only, train
split only (`spd.train.data.is_heldout`).

Generation is continuous batching in the device's batched dtype (`spd.train.batch_decode`,
`spd.train.precision`: bf16 where the hardware has it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from spd.train.memory import keep_freed_memory
from spd.train.precision import resolve_dtype

log = logging.getLogger(__name__)

SAMPLE_FRAC = 0.25  # round 0: the share of prompts that also get a sampled answer
SAMPLE_TEMP = 0.7  # the temperature of every sampled answer


@dataclass(frozen=True)
class Job:
    prompt: tuple[int, ...]  # templated prompt ids (generation prompt included)
    temperature: float  # 0 = greedy


def turn_prompts(tokenizer, conv, max_prompt: int) -> list[list[int]]:
    """One prompt per user turn of `conv`: the turns before it as context, oldest dropped to fit."""
    from spd.text import encode_prompt

    out = []
    for k, msg in enumerate(conv.messages):
        if msg["role"] != "user":
            continue
        start = 0
        while start <= k:
            ids = encode_prompt(tokenizer, messages=conv.messages[start:k + 1])
            if len(ids) <= max_prompt:
                out.append(ids)
                break
            start += 2  # drop the oldest user/assistant pair
    return out


def selfgen_jobs(tokenizer, split: str = "train", max_prompt: int = 384, sample_frac: float = SAMPLE_FRAC,
                 sample_temp: float = SAMPLE_TEMP, seed: int = 0, block: int = 1024) -> list[Job]:
    """The fixed job list of round 0 (same on every machine for the same tokenizer and settings): shuffled,
    then sorted by prompt length within blocks. Templating ~40k prompts takes a minute or two, so
    the list is cached under $SPD_CACHE/selfgen/ (`rebuild_jobs` checks it against the data)."""
    from spd.models.loading import cache_dir

    model = Path(getattr(tokenizer, "name_or_path", "")).name  # the model's name, not where this machine keeps it
    key = hashlib.sha256(json.dumps([model, len(tokenizer), split, max_prompt,
                                     sample_frac, sample_temp, seed, block]).encode()).hexdigest()[:16]
    path = cache_dir() / "selfgen" / f"jobs-{key}.npz"
    if path.exists():
        z = np.load(path)
        ids, off = z["ids"].tolist(), z["offsets"].tolist()  # (each z[...] reads the whole member again)
        return [Job(tuple(ids[a:b]), float(t)) for a, b, t in zip(off[:-1], off[1:], z["temps"].tolist())]
    jobs = _build_jobs(tokenizer, split, max_prompt, sample_frac, sample_temp, seed, block)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    ids_dtype = np.uint16 if len(tokenizer) <= 65536 else np.int32
    np.savez_compressed(tmp, ids=np.concatenate([np.asarray(j.prompt, ids_dtype) for j in jobs]),
             offsets=np.concatenate([[0], np.cumsum([len(j.prompt) for j in jobs])]).astype(np.int64),
             temps=np.asarray([j.temperature for j in jobs], np.float64))
    os.replace(tmp, path)
    return jobs


def _build_jobs(tokenizer, split, max_prompt, sample_frac, sample_temp, seed, block) -> list[Job]:
    from spd.train.data import load_sharegpt, split_conversations

    train, held = split_conversations(load_sharegpt())
    jobs = []
    for conv in (train if split == "train" else held):
        for ids in turn_prompts(tokenizer, conv, max_prompt):
            jobs.append(Job(tuple(ids), 0.0))
            h = int.from_bytes(hashlib.sha256(str(ids).encode()).digest()[:4], "big")
            if h % 1000 < sample_frac * 1000:
                jobs.append(Job(tuple(ids), sample_temp))
    return _shuffled_blocks(jobs, seed, block)


def _shuffled_blocks(jobs: list[Job], seed: int, block: int) -> list[Job]:
    """Shuffled, then sorted by prompt length within blocks: similar lengths side by side mean less
    padding in each prefill and narrower decode windows."""
    jobs = list(jobs)
    random.Random(seed).shuffle(jobs)
    return [j for i in range(0, len(jobs), block) for j in sorted(jobs[i:i + block], key=lambda j: len(j.prompt))]


def with_rounds(base: list[Job], rounds: int, sample_temp: float = SAMPLE_TEMP, seed: int = 0,
                block: int = 1024) -> list[Job]:
    """`base` (round 0), then for each round r = 1 .. rounds-1 one more sampled answer to every
    prompt of it, in round r's own shuffled order. It only ever appends: job i is the same job
    whatever `rounds` is, so ids generated with fewer rounds stay valid."""
    prompts = list(dict.fromkeys(j.prompt for j in base))  # each prompt once, in list order
    extra = [_shuffled_blocks([Job(p, sample_temp) for p in prompts], seed + r, block) for r in range(1, rounds)]
    return base + [j for jobs in extra for j in jobs]


def rebuild_jobs(tokenizer, meta: dict, where: Path) -> list[Job]:
    """The job list the ids in `where` were generated from (its meta.json: `meta`), checked."""
    base = selfgen_jobs(tokenizer, meta["split"], meta["max_prompt"], seed=meta["seed"])
    if fingerprint(base) != meta["fingerprint"]:
        raise ValueError(f"{where}: the job list rebuilt here differs from the one it was generated from")
    return with_rounds(base, rounds_of(meta), seed=meta["seed"])


def rounds_of(meta: dict) -> int:
    """A store's job rounds (meta.json "rounds"; a store written before rounds existed has round 0 only)."""
    return meta.get("rounds", 1)


def fingerprint(jobs: list[Job]) -> str:
    h = hashlib.sha256()
    for j in jobs:
        h.update(np.asarray(j.prompt, dtype=np.int32).tobytes() + str(j.temperature).encode())
    return h.hexdigest()[:16]


class IdStore:
    """Parts of finished responses on disk (atomic writes); which jobs are done, for resuming.

    Under torchrun (world > 1) rank r writes its own parts, part_KKKKK-rR.npz, next to the others'."""

    def __init__(self, root: Path, meta: dict, vocab_size: int, rank: int = 0, world: int = 1):
        self.root = Path(root)
        self.suffix = f"-r{rank}" if world > 1 else ""  # this rank's part names end with it
        self.root.mkdir(parents=True, exist_ok=True)
        self.dtype = np.uint16 if vocab_size <= 65536 else np.int32
        mpath = self.root / "meta.json"
        if mpath.exists():
            old = json.loads(mpath.read_text())
            if old["fingerprint"] != meta["fingerprint"]:
                raise ValueError(f"{self.root} was generated for another job list ({old['fingerprint']})")
            if rounds_of(meta) > rounds_of(old):  # more rounds: the job list grows at its end
                mpath.write_text(json.dumps({**old, "rounds": meta["rounds"]}, indent=2))
        else:
            mpath.write_text(json.dumps(meta, indent=2))
        self.meta = json.loads(mpath.read_text())
        self.compute = meta.get("dtype", "")  # this run's compute dtype, written into each part it writes
        self._buf: list[tuple[int, list[int]]] = []

    def parts(self) -> list[Path]:
        return sorted(self.root.glob("part_*.npz"))

    def done(self) -> set[int]:
        return {int(j) for p in self.parts() for j in np.load(p)["job"]}

    def mine(self) -> list[Path]:
        """The parts this rank wrote (every part without torchrun)."""
        return sorted(self.root.glob(f"part_*{self.suffix}.npz"))

    def tokens(self, mine: bool = False) -> int:
        return sum(int(np.load(p)["offsets"][-1]) for p in (self.mine() if mine else self.parts()))

    def add(self, job: int, resp: list[int]) -> None:
        self._buf.append((job, resp))

    def buffered_tokens(self) -> int:
        return sum(len(r) for _, r in self._buf)

    def flush(self) -> None:
        if not self._buf:
            return
        lens = [len(r) for _, r in self._buf]
        idx = len(self.mine())
        name = f"part_{idx:05d}{self.suffix}"
        tmp = self.root / f".{name}.tmp.npz"
        np.savez_compressed(tmp, resp=np.concatenate([np.asarray(r, self.dtype) for _, r in self._buf]),
                            offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
                            job=np.asarray([j for j, _ in self._buf], np.int32), dtype=np.asarray(self.compute))
        os.replace(tmp, self.root / f"{name}.npz")
        self._buf = []

    @staticmethod
    def read(path: Path) -> list[tuple[int, np.ndarray]]:
        z = np.load(path)
        off, resp = z["offsets"], z["resp"]  # (each z[...] decompresses its whole member again)
        return [(int(j), resp[a:b]) for j, a, b in zip(z["job"], off[:-1], off[1:])]


def stored_rounds(out: Path) -> int:
    """The rounds the store at `out` was last grown to (1 for a new store): what a resume
    generates unless told otherwise."""
    mpath = Path(out) / "meta.json"
    return rounds_of(json.loads(mpath.read_text())) if mpath.exists() else 1


def generate_ids(model_dir: Path, out: Path, split: str = "train", batch: int = 128, max_new: int = 256,
                 max_prompt: int = 384, limit_tokens: int = 0, part_tokens: int = 200_000, seed: int = 0,
                 dtype: torch.dtype | None = None, device: str = "cpu", progress: bool = True, rank: int = 0,
                 world: int = 1, stop: threading.Event | None = None, rounds: int | None = None) -> IdStore:
    """The responses to the first `rounds` rounds of jobs (see the module docstring; None: the
    store's own, `stored_rounds`).
    Resumable: skips jobs already in `out`; writes a part every `part_tokens` response tokens, and
    what it has when `stop` is set (at the next finished response).
    Rank r of `world` generates the jobs i with i % world == r (each rank its own shard)."""
    from tqdm import tqdm

    from spd.models.loading import load_tokenizer
    from spd.train.batch_decode import BatchDecoder
    from spd.train.teacher import load_hf

    tok = load_tokenizer(model_dir)
    base = selfgen_jobs(tok, split, max_prompt, seed=seed)
    rounds = stored_rounds(out) if rounds is None else rounds
    jobs = with_rounds(base, rounds, seed=seed)
    model = load_hf(model_dir, dtype, device)
    meta = {"model": Path(model_dir).name, "split": split, "jobs": len(base), "fingerprint": fingerprint(base),
            "rounds": rounds, "max_new": max_new, "max_prompt": max_prompt, "seed": seed, "dtype": str(model.dtype),
            "sample_frac": SAMPLE_FRAC, "sample_temp": SAMPLE_TEMP}
    store = IdStore(out, meta, model.config.vocab_size, rank, world)
    done = store.done()
    todo = [(i, j) for i, j in enumerate(jobs) if i not in done and i % world == rank]
    have = store.tokens(mine=True)
    log.info("[selfgen] %d jobs (%d rounds), %d done (%d tokens), %d to go", len(jobs), rounds, len(done), have, len(todo))
    bar = tqdm(total=limit_tokens or None, initial=have, unit="tok", disable=not progress, mininterval=10)
    t0 = time.perf_counter()
    state = {"tokens": have}

    def on_done(i, resp) -> bool:
        store.add(i, resp)
        state["tokens"] += len(resp)
        bar.update(len(resp))
        if store.buffered_tokens() >= part_tokens:
            store.flush()
            rate = (state["tokens"] - have) / (time.perf_counter() - t0)
            log.info("[selfgen] %d tokens, %.0f tok/s", state["tokens"], rate)
        return bool(limit_tokens and state["tokens"] >= limit_tokens) or (stop is not None and stop.is_set())

    decoder = BatchDecoder(model, batch, max_new, tok.eos_token_id, seed=seed + len(done))
    try:
        decoder.run([(i, j.prompt, j.temperature) for i, j in todo], on_done)
    finally:
        store.flush()
        bar.close()
    return store


def main(argv=None) -> int:
    import argparse

    from spd.models.loading import resolve_model

    p = argparse.ArgumentParser(prog="python -m spd.train.selfgen", description="self-generated token ids (resumable)")
    p.add_argument("--model", default=None, help="target model dir (default: the embedded SmolLM2)")
    p.add_argument("--out", required=True, help="directory of parts (resumes what is there)")
    p.add_argument("--split", choices=["train", "heldout"], default="train", help="ShareGPT split (default train)")
    p.add_argument("--batch", type=int, default=128, help="rows decoding together (default 128)")
    p.add_argument("--max-new", type=int, default=256, help="response cap in tokens (default 256)")
    p.add_argument("--max-prompt", type=int, default=384, help="prompt cap; older turns dropped to fit (default 384)")
    p.add_argument("--rounds", type=int, default=None, help="job rounds: round 0 is every prompt's greedy answer (and a "
                   "sampled one for a quarter), each further round one more sampled answer to every prompt "
                   "(default: as many as --out's meta.json says, 1 for a new directory)")
    p.add_argument("--tokens", type=int, default=0, help="stop after this many response tokens in all (0: every job; "
                   "under torchrun each rank generates its share)")
    p.add_argument("--part-tokens", type=int, default=200_000, help="response tokens per part file (default 200k)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="generation dtype (auto: bf16 where the hardware has bf16 units, spd.train.precision)")
    args = p.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    keep_freed_memory()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's
    device = args.device
    if world > 1 and device == "cuda":
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    stop = threading.Event()  # SIGTERM / SIGINT: write what is done, then exit
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    store = generate_ids(resolve_model(args.model), Path(args.out), args.split, args.batch, args.max_new,
                         args.max_prompt, args.tokens // world if args.tokens else 0, args.part_tokens,
                         dtype=resolve_dtype(args.dtype, device), device=device,
                         rank=rank, world=world, stop=stop, rounds=args.rounds)
    print(f"{store.root}: {store.tokens()} tokens in {len(store.parts())} parts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
