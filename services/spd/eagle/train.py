"""EAGLE-3-style draft training with training-time test (TTT) over the teacher cache.

Step 1 runs the draft over the target features of every position i (input (f_i, x_{i+1}),
predicting x_{i+2}). Step j >= 2 feeds each position the draft's own step-(j-1) hidden output at
position i-1, as inference does for the j-th draft of a chain starting at t = i-j+1; its query sees
the step-1 keys at positions <= t and the diagonal keys of steps 2..j of its own chain (exactly the
draft's KV cache at that point of inference); in training only over the positions a loss row
depends on (`ttt_hidden`'s window: not the prompt). Loss at every step: KL(teacher || draft) of the
token that step predicts, restricted to the draft vocabulary, on assistant positions whose teacher
argmax is in the draft vocabulary, through the PDM's chunked head + KL (spd.train.trainer.head_kl).
Budget = loss positions seen at step 1, like the PDM trainer; both are students of the one loop,
spd.train.loop.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from spd.eagle.model import EagleConfig, EagleDraft, default_feature_layers, random_eagle
from spd.config import EagleTrainConfig
from spd.train.loop import Plan, RunState, Setup, train_plans
from spd.train.trainer import head_kl, loss_rows as teacher_rows, target_to_draft, teacher_kl

log = logging.getLogger(__name__)


class _StepCache:
    """Keys/values of the TTT steps run so far, concatenated along the key axis (autograd-safe)."""

    def __init__(self):
        self.k = self.v = None  # [B, H_kv, j*T, D]

    def update(self, k, v, layer_idx, *args, **kwargs):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


def ttt_mask(q: torch.Tensor, T: int, j: int) -> torch.Tensor:
    """bool [B, 1, W, T + (j-1)*W]: the query of step j at position q[b, w] (q: [B, W], consecutive
    positions from the window's start on), chain start t = q-j+1, sees the step-1 keys (all T
    positions cached) at positions <= t, and of the keys of steps j' = 2..j (cached over the same
    window) the one at position t+j'-1, window index w-j+j' (its own key included, so no row is
    empty even where t < 0)."""
    B, W = q.shape
    w = torch.arange(W, device=q.device)
    blocks = [torch.arange(T, device=q.device) <= (q - j + 1)[..., None]]  # [B, W, T]
    blocks += [(w == (w - j + jj)[:, None]).expand(B, W, W) for jj in range(2, j + 1)]
    return torch.cat(blocks, dim=-1)[:, None]


def ttt_hidden(draft: EagleDraft, states: torch.Tensor, tokens: torch.Tensor, steps: int,
               window: tuple[torch.Tensor, int] | None = None) -> list[torch.Tensor]:
    """states: [..., T, 3, d] target features; tokens: [..., T] (one sequence, or a batch [B, T] of
    right-padded ones: a real position's keys are all at real positions, so padding needs no mask).
    Returns per step the own hidden [..., T-1, d] of draft positions 0..T-2 (position i predicts
    x_{i+2}; rows i < j-1 of step j are meaningless).

    window = (start [B], W): steps >= 2 run only over positions start[b] .. start[b]+W-1 and return
    [B, W, d] (row w = position start[b] + w; rows past a sequence's end are meaningless). Step 1
    runs over every position (its keys are every chain's context). The rows a window leaves out
    change no row it keeps, if no kept row of step j needs one: rows >= start+j-2 of step j need
    rows >= start+j'-2 of the steps j' < j, so start = (first row used) - (steps - 2) keeps all."""
    one = tokens.dim() == 1
    if one:
        states, tokens = states[None], tokens[None]
    B, T1 = tokens.shape[0], tokens.shape[1] - 1
    pos = torch.arange(T1, device=tokens.device).expand(B, T1)  # [B, T1]
    nxt = tokens[:, 1:]  # [B, T1] x_{i+1}
    cache = _StepCache()
    h = draft.hidden(draft.fuse_states(states[:, :T1]), nxt, pos, ttt_mask(pos, T1, 1), cache)  # [B, T1, d]
    out = [h]
    if window is not None:
        start, W = window
        pos = (start.to(tokens.device)[:, None] + torch.arange(W, device=tokens.device)).clamp(max=T1 - 1)  # [B, W]
    feature = h.gather(1, (pos - 1).clamp(min=0)[..., None].expand(-1, -1, h.shape[-1]))  # h_1 at i-1 (i = 0: filler)
    nxt = nxt.gather(1, pos)
    for j in range(2, steps + 1):
        h = draft.hidden(feature, nxt, pos, ttt_mask(pos, T1, j), cache)  # [B, W, d]
        out.append(h)
        feature = torch.cat([h[:, :1], h[:, :-1]], dim=1)  # step j+1 at i takes h_j[i-1] (the window's row 0: filler)
    return [o[0] for o in out] if one else out


def _prepare(seq: dict, cols: list[int], t2d: torch.Tensor, dev) -> tuple:
    states = seq["anchors"][:, cols].to(dev).float()  # [T, 3, d]
    tokens = seq["tokens"].to(dev).long()  # [T]
    ids = t2d.to(dev)[seq["top_ids"].to(dev).long()]  # [T, k] draft ids, -1 outside
    return states, tokens, ids


def loss_rows(seq: dict, t2d: torch.Tensor) -> torch.Tensor:
    """Draft positions i [R] whose teacher row i+1 is a loss row (spd.train.trainer.loss_rows)."""
    t = teacher_rows(seq, t2d)
    return t[t >= 1] - 1


def batch_ttt_loss(draft: EagleDraft, seqs: list[dict], cols: list[int], t2d: torch.Tensor, steps: int):
    """(kl summed over steps, sequences and rows, step-1 rows, step-1 hits) of the sequences
    right-padded into one batch and unrolled together; (None, 0, 0) if none has a loss row."""
    dev = draft.d2t.device
    t2d = t2d.to(dev)
    picked = [(seq, rows) for seq in seqs if len(rows := loss_rows(seq, t2d))]
    if not picked:
        return None, 0, 0
    parts = [_prepare(seq, cols, t2d, dev) + (seq["top_p"].to(dev),) for seq, _ in picked]
    pad = torch.nn.utils.rnn.pad_sequence
    states = pad([p[0] for p in parts], batch_first=True)  # [B, T, 3, d]
    tokens = pad([p[1] for p in parts], batch_first=True)  # [B, T]
    ids = pad([p[2] for p in parts], batch_first=True, padding_value=-1)  # [B, T, k]
    top_p = pad([p[3] for p in parts], batch_first=True)  # [B, T, k]
    b = torch.cat([torch.full_like(rows, n) for n, (_, rows) in enumerate(picked)])  # [R] sequence of each row
    i = torch.cat([rows for _, rows in picked])  # [R] its draft position
    # steps >= 2 over each sequence's window from its first loss row - (steps - 2) on (not its prompt)
    start = torch.stack([(rows[0] - (steps - 2)).clamp(min=0) for _, rows in picked])  # [B]
    W = int(max(len(p[1]) - 1 - s for p, s in zip(parts, start.tolist())))
    kls, hits = [], 0
    for j, h in enumerate(ttt_hidden(draft, states, tokens, steps, (start, W)), start=1):  # h: [B, T-1 or W, d]
        keep = i >= j - 1
        bj, ij = b[keep], i[keep]
        if len(ij) == 0:
            continue
        row = ij if j == 1 else ij - start[bj]  # its row of h
        kl, step_hits = head_kl(draft, h[bj, row], ids[bj, ij + 1], top_p[bj, ij + 1])  # the PDM's fused head + KL
        kls.append(kl)
        if j == 1:
            hits = step_hits
    return torch.stack(kls).sum(), len(i), hits


@torch.no_grad()
def evaluate(draft: EagleDraft, seqs: list[dict], cols: list[int], t2d: torch.Tensor, steps: int) -> dict:
    """Held-out top-1 agreement with the teacher per TTT step over ALL assistant positions (teacher
    argmax outside the draft vocabulary = miss), and the KL over the in-vocabulary ones."""
    was = draft.training
    draft.eval()
    hits, total, kl, kl_rows = [0] * steps, [0] * steps, [0.0] * steps, [0] * steps
    dev = draft.d2t.device
    for seq in seqs:
        states, tokens, ids = _prepare(seq, cols, t2d, dev)
        lrows = seq["loss"].to(dev).bool()[1:].nonzero()[:, 0]
        if len(lrows) == 0:
            continue
        for j, h in enumerate(ttt_hidden(draft, states, tokens, steps)):
            i = lrows[lrows >= j]
            logits = draft.logits(h[i])
            top = seq["top_ids"].to(dev)[i + 1, 0].long()
            hits[j] += int((draft.d2t[logits.argmax(-1)] == top).sum())
            total[j] += len(i)
            ok = ids[i + 1, 0] >= 0
            if ok.any():
                kl[j] += float(teacher_kl(logits[ok], ids[i + 1][ok], seq["top_p"].to(dev)[i + 1][ok]))
                kl_rows[j] += int(ok.sum())
    draft.train(was)
    return {"p": [h / max(t, 1) for h, t in zip(hits, total)],
            "loss": [k / max(r, 1) for k, r in zip(kl, kl_rows)], "tokens": total[0]}


def feature_layers(cfg: EagleTrainConfig, num_layers: int) -> list[int]:
    """The teacher layers the draft reads: --feature-layers, else low / mid / high."""
    return list(cfg.feature_layers or default_feature_layers(num_layers))


def make_draft(cfg: EagleTrainConfig, model_dir: Path, config, d2t: torch.Tensor) -> EagleDraft:
    from spd.core.stage import load_embedding, load_stage

    L = config.num_hidden_layers
    lm_head = load_stage(model_dir, config, range(L - 1, L), ()).lm_head.weight.detach() if cfg.init_head else None
    embed = load_embedding(model_dir, config).weight.detach()
    return random_eagle(config, feature_layers(cfg, L), draft_ids=d2t,
                        lm_head_weight=lm_head, embed_weight=embed, seed=cfg.seed)


class EagleStudent:
    """The EAGLE-3-style draft, trained with `ttt` unrolled steps over each optimizer step's sequences."""

    name = "draft"

    def __init__(self, cfg: EagleTrainConfig, draft: EagleDraft, s: Setup):
        self.cfg, self.module, self.setup = cfg, draft, s
        self.cols = [s.cache.layers.index(b) for b in draft.config.feature_layers]
        self.t2d = target_to_draft(s.d2t, s.config.vocab_size)

    def rows(self, seq: dict) -> int:
        return len(loss_rows(seq, self.t2d.to(self.module.d2t.device)))

    def loss(self, seqs: list[dict]):
        return batch_ttt_loss(self.module, seqs, self.cols, self.t2d, self.cfg.ttt)

    def evaluate(self, seqs: list[dict]) -> dict:
        r = evaluate(self.module, seqs, self.cols, self.t2d, self.cfg.ttt)
        return {"heldout_p": r["p"], "heldout_loss": r["loss"]}  # per TTT step

    def export(self, path: Path, run: RunState) -> None:
        export(self.module, path, self.cfg, self.setup.vocab_info, run, self.setup.cache)

    def extra_state(self) -> dict:
        return {"init_from": self.cfg.notes.get("init_from")}

    def load_extra_state(self, state: dict) -> None:
        if state.get("init_from"):  # the base it started from, even if --init-from's folder has changed since
            self.cfg.notes["init_from"] = state["init_from"]


def tokens_in_all(config: EagleConfig) -> int:
    """The tokens an exported draft has seen in all: its own run's plus, after a warm start, its
    base's in all (which its notes' init_from holds)."""
    return config.trained_tokens + int(config.notes.get("init_from", {}).get("tokens_seen") or 0)


def plan(cfg: EagleTrainConfig) -> Plan:
    """The draft of `cfg` as a student of a run (spd.train.loop.train_plans): with --init-from, built
    from an exported draft's weights, feature layers and vocabulary (a warm start)."""
    init = EagleDraft.load(Path(cfg.init_from)) if cfg.init_from else None
    if init is not None:
        if cfg.feature_layers and list(cfg.feature_layers) != init.config.feature_layers:
            raise ValueError(f"--feature-layers {cfg.feature_layers} differ from {cfg.init_from}'s "
                             f"{init.config.feature_layers}")
        cfg = dataclasses.replace(cfg, feature_layers=init.config.feature_layers, init_head=False)

    def build(s: Setup) -> EagleStudent:
        draft = make_draft(cfg, s.model_dir, s.config, s.d2t)
        if init is not None:  # a warm start (a resume restores the checkpoint's provenance)
            cfg.notes["init_from"] = {"path": cfg.init_from, "tokens_seen": tokens_in_all(init.config)}
            if s.state is None:  # the exported weights, a fresh optimizer
                draft.load_state_dict(init.state_dict())
        return EagleStudent(cfg, draft.to(cfg.device), s)

    return Plan(cfg, ("feature_layers", "ttt", "vocab", "data"),
                lambda config: feature_layers(cfg, config.num_hidden_layers), build,
                init.d2t if init else None, init.config.notes.get("vocab", {}) if init else {})


def train(cfg: EagleTrainConfig) -> EagleDraft:
    """Train (or resume) the draft under `cfg`; returns it in eval mode (also exported to OUT/draft/)."""
    [student] = train_plans([plan(cfg)])
    assert isinstance(student, EagleStudent)
    return student.module


def export(draft: EagleDraft, path: Path, cfg: EagleTrainConfig, vocab_info: dict, run: RunState, cache) -> None:
    """Write the inference draft (EagleDraft.save: fp16 safetensors + config.json with provenance)."""
    last = run.history[-1] if run.history else {}
    draft.config.ttt_steps, draft.config.trained_tokens = cfg.ttt, run.seen
    draft.config.notes = {
        **cfg.notes, "data": {"cache": str(cache.root), **{k: v for k, v in cache.meta.items() if k != "layers"}},
        "vocab": vocab_info, "lr": cfg.lr, "batch_tokens": cfg.batch_tokens, "steps": run.step,
        "heldout_p_per_step": last.get("heldout_p"), "heldout_loss_per_step": last.get("heldout_loss"),
        "curve": [(h["seen"], h["heldout_p"]) for h in run.history],
    }
    draft.save(Path(path))
