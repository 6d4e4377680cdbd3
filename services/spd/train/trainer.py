"""The PDM as a student of the training loop (spd.train.loop; design in docs/design.md): aligned
forward, KL to the teacher restricted to the draft vocabulary, held-out top-1 agreement.

Public API (reused by `spd train`, the benchmarks and the eval harness):
  train(cfg: spd.config.TrainConfig) -> PDM
  plan(cfg) -> spd.train.loop.Plan (one student of a run that trains several)
  batch_loss(pdm, seqs, split, fills, s0, t2d, cols) -> (kl_sum, rows, hits)
  loss_rows(seq, t2d) -> the loss positions of a sequence
  evaluate(pdm, seqs, split, s0, t2d, cols, fill=None) -> {"loss", "p", "p_in_vocab", "tokens"}
  sample_fill(n, rng, p_full)
"""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from spd.core.pdm import PDM, random_pdm
from spd.core.schedule import judged_fills, staircase_offset
from spd.core.split import PipelineSplit, default_anchors, uniform_split
from spd.train.aligned import aligned_batch_hidden, aligned_logits
from spd.config import TrainConfig
from spd.train.loop import Plan, RunState, Setup, train_plans

log = logging.getLogger(__name__)


def sample_fill(n: int, rng: random.Random, p_full: float = 0.5, fill: str = "design") -> int:
    """Simulated fill level. "design": a = n with probability p_full, else uniform in 1..n-1 (design §7).

    "judged:P": the fill levels of the drafts the engine actually judges when each judgement accepts
    with probability P (schedule.judged_fills): P(a = k) = (1-P) P^(k-1) for k < n, P^(n-1) for a = n.
    At low P most judged drafts are a = 1 drafts (P = 0.35: 65 %), which the design mix sees only 1/8
    of the time.
    """
    if n == 1:
        return n
    if fill.startswith("judged:"):
        w = judged_fills([float(fill.split(":", 1)[1])] * n)
        return rng.choices(range(1, n + 1), weights=w)[0]
    if rng.random() < p_full:
        return n
    return rng.randint(1, n - 1)


def target_to_draft(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    t2d = torch.full((vocab_size,), -1, dtype=torch.long)
    t2d[d2t] = torch.arange(len(d2t))
    return t2d


def teacher_probs(d: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The teacher's top-k restricted to the draft vocabulary and renormalised: d [R, k] its top ids as
    draft ids (-1 outside), top_p [R, k] -> [R, k] fp32."""
    p = top_p.float() * (d >= 0)
    return p / p.sum(-1, keepdim=True)


def teacher_kl(logits: torch.Tensor, d: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Sum over rows of KL(teacher || draft): logits [R, V_s]; d [R, k] the teacher's top ids as draft
    ids (-1 outside the draft vocabulary); top_p [R, k] (`teacher_probs`)."""
    p = teacher_probs(d, top_p)
    lq = F.log_softmax(logits.float(), dim=-1).gather(1, d.clamp(min=0))
    return (p * (torch.log(p.clamp_min(1e-20)) - lq)).sum()


class _HeadKL(torch.autograd.Function):
    """`teacher_kl` of the logits x Wᵀ, with the top-1 hits, a chunk of rows at a time: the [R, V_s]
    logits never exist in full (nor in fp32), and the forward already forms their gradient
    softmax · Σp - p (per row, in the compute dtype) so that the backward is two matmuls."""

    @staticmethod
    def forward(ctx, x, weight, d, p, chunk: int):  # x: [R, w]; weight: [V_s, w]; d: [R, k] (>= 0); p: [R, k]
        w = weight.to(x.dtype)  # [V_s, w] in the compute dtype
        grad = torch.empty(len(x), len(w), dtype=x.dtype, device=x.device)  # [R, V_s] d kl / d logits
        kl = torch.zeros((), device=x.device)
        hits = torch.zeros((), dtype=torch.long, device=x.device)
        zc = x.new_empty(min(chunk, len(x)), len(w))  # [c, V_s] a chunk's logits, in the compute dtype
        z = torch.empty(zc.shape, device=x.device)  # and in fp32 (buffers reused: no fresh pages per chunk)
        for r in range(0, len(x), chunk):
            c = min(chunk, len(x) - r)
            torch.mm(x[r:r + c], w.T, out=zc[:c])
            zf = z[:c].copy_(zc[:c])
            dc, pc = d[r:r + c], p[r:r + c]
            m, top = zf.max(-1, keepdim=True)  # [c, 1]: the max and its first index (one pass, ~4x argmax's speed)
            hits += (top[:, 0] == dc[:, 0]).sum()
            zd = zf.gather(1, dc)  # [c, k]
            e = zf.sub_(m).exp_()  # [c, V_s] exp(z - m), in place
            s = e.sum(-1, keepdim=True)
            kl += (pc * (torch.log(pc.clamp_min(1e-20)) - (zd - m - s.log()))).sum()
            grad[r:r + c] = e.mul_(pc.sum(-1, keepdim=True) / s).scatter_add_(1, dc, -pc)  # softmax · Σp - p
        ctx.save_for_backward(x, w, grad)
        ctx.weight_dtype = weight.dtype
        return kl, hits

    @staticmethod
    def backward(ctx, g_kl, _):
        x, w, grad = ctx.saved_tensors
        g = float(g_kl)  # a Python scalar: applied in fp32 (as a bf16 tensor it would round, e.g. 1/1000)
        return (grad @ w) * g, (grad.T @ (x * g)).to(ctx.weight_dtype), None, None, None


def head_kl(draft, h: torch.Tensor, d: torch.Tensor, top_p: torch.Tensor, chunk: int = 256):
    """`teacher_kl(draft.logits(h), d, top_p)` and the top-1 hits (draft argmax = d[:, 0]) for hidden
    states h [R, w], through `_HeadKL` (the head in the autocast dtype where autocast is on). `draft`:
    the PDM or the EAGLE-3 draft (both have logits = head(norm(h)))."""
    x = draft.norm(h)  # [R, w]
    dev = x.device.type
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    kl, hits = _HeadKL.apply(x.to(dt), draft.head.weight, d.clamp(min=0), teacher_probs(d, top_p), chunk)
    return kl, int(hits)


def loss_rows(seq: dict, t2d: torch.Tensor) -> torch.Tensor:
    """A sequence's loss positions [L] (ascending): assistant tokens whose teacher argmax is inside
    the draft vocabulary (t2d: target id -> draft id, -1 outside)."""
    top = seq["top_ids"][:, 0].to(t2d.device).long()  # [T]
    return (seq["loss"].to(t2d.device).bool() & (t2d[top] >= 0)).nonzero()[:, 0]


def batch_loss(pdm: PDM, seqs: list[dict], split: PipelineSplit, fills: list[int], s0: int, t2d: torch.Tensor,
               cols: list[int], dense: bool = False):
    """KL(teacher || PDM) summed over the loss rows (`loss_rows`) of the sequences `seqs`, seqs[b] at
    fill level fills[b]: the newest staircase position (the depth-s0 copy), the teacher's top-k
    restricted to the draft vocabulary and renormalised. One packed forward for all of them
    (`dense`: the masked reference, one sequence at a time). Returns (kl_sum, rows, hits); (None, 0, 0)
    if none has a loss row."""
    dev = pdm.d2t.device
    t2d = t2d.to(dev)
    items, ids, probs = [], [], []
    for seq, a in zip(seqs, fills):
        rows = loss_rows(seq, t2d)  # [L]
        if len(rows):
            items.append((seq["anchors"][:, cols].to(dev), a, rows))  # the cache's dtype
            ids.append(t2d[seq["top_ids"].to(dev)[rows].long()])  # [L, k] draft ids, -1 outside
            probs.append(seq["top_p"].to(dev)[rows].float())  # [L, k]
    if not items:
        return None, 0, 0
    d, top_p = torch.cat(ids), torch.cat(probs)
    if not dense:
        kl, hits = head_kl(pdm, aligned_batch_hidden(pdm, items, split, s0), d, top_p)
        return kl, len(d), hits
    logits = torch.cat([aligned_logits(pdm, x.float(), split, a, s0, rows, dense=True) for x, a, rows in items])
    hits = int((logits.argmax(-1) == d[:, 0]).sum())
    return teacher_kl(logits, d, top_p), len(d), hits


@torch.no_grad()
def evaluate(pdm: PDM, seqs: list[dict], split: PipelineSplit, s0: int, t2d: torch.Tensor, cols: list[int],
             fill: int | None = None) -> dict:
    """Held-out metrics at fill level `fill` (default n: the saturated pipeline).

    p = top-1 agreement with the teacher over ALL assistant positions (a teacher argmax outside the
    draft vocabulary counts as a miss): the acceptance probability of a greedy draft at that fill.
    """
    was = pdm.training
    pdm.eval()
    a = fill or split.n
    kl_sum, kl_rows, hits, total = 0.0, 0, 0, 0
    dev = pdm.d2t.device
    for seq in seqs:
        seq = {k: v.to(dev) for k, v in seq.items()}
        lrows = seq["loss"].bool().nonzero()[:, 0]
        if len(lrows) == 0:
            continue
        logits = aligned_logits(pdm, seq["anchors"][:, cols].float(), split, a, s0, lrows)
        hits += int((pdm.d2t[logits.argmax(-1)] == seq["top_ids"][lrows, 0].long()).sum())
        total += len(lrows)
        ids = t2d.to(dev)[seq["top_ids"][lrows].long()]
        ok = ids[:, 0] >= 0
        if ok.any():
            d = ids[ok]
            p = seq["top_p"][lrows][ok].float() * (d >= 0)
            p = p / p.sum(-1, keepdim=True)
            lq = F.log_softmax(logits[ok].float(), -1).gather(1, d.clamp(min=0))
            kl_sum += float((p * (torch.log(p.clamp_min(1e-20)) - lq)).sum())
            kl_rows += int(ok.sum())
    pdm.train(was)
    return {"loss": kl_sum / max(kl_rows, 1), "p": hits / max(total, 1), "p_in_vocab_rows": kl_rows / max(total, 1),
            "tokens": total, "fill": a}


def anchors_of(cfg: TrainConfig, split: PipelineSplit) -> list[int]:
    """The teacher layers the PDM reads: --anchors, else the split's default anchors."""
    return list(cfg.anchors) if cfg.anchors else list(default_anchors(split))


def make_pdm(cfg: TrainConfig, model_dir: Path, config, split: PipelineSplit, draft_ids: torch.Tensor) -> PDM:
    lm_head = None
    if cfg.init_head:
        from spd.core.stage import load_stage

        last = load_stage(model_dir, config, range(config.num_hidden_layers - 1, config.num_hidden_layers), ())
        lm_head = last.lm_head.weight.detach()
    pdm = random_pdm(config, anchors_of(cfg, split), cfg.ls, draft_ids=draft_ids, lm_head_weight=lm_head,
                     seed=cfg.seed, prev=cfg.prev)
    # (copying the target's final-norm weights too made the initial logits huge: KL ~16 at step 0)
    pdm.config.schedule, pdm.config.trained_n = cfg.schedule, cfg.n
    return pdm


class PdmStudent:
    """The PDM trained for one (split, schedule): a simulated fill level per sequence (its own RNG,
    saved with the checkpoint), the loss at the newest staircase position."""

    name = "pdm"

    def __init__(self, cfg: TrainConfig, pdm: PDM, split: PipelineSplit, s: Setup):
        self.cfg, self.module, self.split, self.setup = cfg, pdm, split, s
        self.s0 = staircase_offset(cfg.schedule)
        self.t2d = target_to_draft(s.d2t, s.config.vocab_size)
        self.cols = [s.cache.layers.index(b) for b in pdm.config.anchors]
        self.rng = random.Random(cfg.seed)

    def rows(self, seq: dict) -> int:
        return len(loss_rows(seq, self.t2d))

    def loss(self, seqs: list[dict]):
        fills = [sample_fill(self.cfg.n, self.rng, self.cfg.p_full, self.cfg.fill) for _ in seqs]
        return batch_loss(self.module, seqs, self.split, fills, self.s0, self.t2d, self.cols)

    def evaluate(self, seqs: list[dict]) -> dict:
        r = evaluate(self.module, seqs, self.split, self.s0, self.t2d, self.cols)
        r1 = evaluate(self.module, seqs, self.split, self.s0, self.t2d, self.cols, fill=1)  # the first draft after a reseed
        return {"heldout_loss": r["loss"], "heldout_p": r["p"], "heldout_p_a1": r1["p"], "heldout_loss_a1": r1["loss"]}

    def export(self, path: Path, run: RunState) -> None:
        export(self.module, path, self.cfg, self.setup.vocab_info, run.history, run.seen, self.setup.cache)

    def extra_state(self) -> dict:
        return {"rng": self.rng.getstate(), "init_from": self.cfg.notes.get("init_from")}

    def load_extra_state(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        if state.get("init_from"):  # the base it started from, even if --init-from's folder has changed since
            self.cfg.notes["init_from"] = state["init_from"]


def grow_from(pdm: PDM, init: PDM) -> None:
    """Load `init`'s weights into `pdm`. A draft without the predecessor input (`--prev`) grows one:
    its fusions start with zero projections, so the grown PDM drafts exactly as `init` does until
    training moves them. Any other difference is an error."""
    missing, unexpected = pdm.load_state_dict(init.state_dict(), strict=False)
    if unexpected or any(not k.startswith("prev_fusions.") for k in missing):
        raise ValueError(f"--init-from: the draft does not fit this PDM (missing {missing}, unexpected {unexpected})")
    for name, w in pdm.named_parameters():
        if name in missing and name.endswith(".proj.weight"):
            torch.nn.init.zeros_(w)


def tokens_in_all(notes: dict) -> int:
    """The tokens an exported draft has seen in all: its own run's plus, after a warm start, its
    base's in all (which its notes' init_from holds)."""
    return int(notes.get("tokens_seen") or 0) + int(notes.get("init_from", {}).get("tokens_seen") or 0)


def plan(cfg: TrainConfig) -> Plan:
    """The PDM of `cfg` as a student of a run (spd.train.loop.train_plans): built once the data is
    set up, from an exported draft's weights and vocabulary with --init-from (a warm start)."""
    init = PDM.load(Path(cfg.init_from)) if cfg.init_from else None

    def build(s: Setup) -> PdmStudent:
        split = uniform_split(s.config.num_hidden_layers, cfg.n)
        head = cfg.init_head and init is None  # a warm start overwrites the head: no need to load the target's
        pdm = make_pdm(dataclasses.replace(cfg, init_head=head), s.model_dir, s.config, split, s.d2t).to(cfg.device)
        if init is not None:  # a warm start (a resume restores the checkpoint's provenance)
            cfg.notes["init_from"] = {"path": cfg.init_from, "tokens_seen": tokens_in_all(init.config.notes)}
            if s.state is None:  # the exported weights, a fresh optimizer
                grow_from(pdm, init)
        return PdmStudent(cfg, pdm, split, s)

    return Plan(cfg, ("n", "ls", "anchors", "schedule", "vocab", "data"),
                lambda config: anchors_of(cfg, uniform_split(config.num_hidden_layers, cfg.n)), build,
                init.d2t if init else None, init.config.notes.get("vocab", {}) if init else {})


def train(cfg: TrainConfig) -> PDM:
    """Train (or resume) a PDM under `cfg`; returns it in eval mode (also exported to OUT/pdm/)."""
    [student] = train_plans([plan(cfg)])
    assert isinstance(student, PdmStudent)
    return student.module


def export(pdm: PDM, path: Path, cfg: TrainConfig, vocab_info: dict, history: list, seen: int, cache) -> None:
    """Write the inference checkpoint (PDM.save: fp16 safetensors + config.json with provenance)."""
    if pdm.d2t.device.type != "cpu":
        import copy

        pdm = copy.deepcopy(pdm).cpu()
    pdm.config.trained_n, pdm.config.schedule = cfg.n, cfg.schedule
    last = history[-1] if history else {}
    pdm.config.notes = {
        **cfg.notes,
        "data": {"cache": str(cache.root), **{k: v for k, v in cache.meta.items() if k != "layers"}},
        "tokens_seen": seen, "vocab": vocab_info, "lr": cfg.lr, "batch_tokens": cfg.batch_tokens, "fill": cfg.fill,
        "heldout_p": last.get("heldout_p"), "heldout_loss": last.get("heldout_loss"),
        "heldout_fill": cfg.n, "curve": [(h["seen"], round(h["heldout_p"], 4)) for h in history],
    }
    pdm.save(Path(path))
