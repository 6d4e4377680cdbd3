"""Weight averaging of exported drafts of one lineage (a "model soup").

A warm start re-warms the learning rate, which knocks a converged PDM off its optimum before the
decay brings it back; on a small increment of data it can end worse than where it started (300k
tokens after 10M did, at lr 3e-4). The average of the drafts before and after such a warm start
keeps what the new data taught and undoes most of the knock. The drafts must share shape and draft
vocabulary (one lineage), otherwise the average is meaningless and is refused.

  python -m spd.train.average --out runs/avg/pdm OLD_DRAFT NEW_DRAFT [--weights 0.5 0.5]

The output is an ordinary export (PDM.save): the last draft's config, whose notes gain `averaged`
(each ingredient's path, weight and tokens seen in all) and lose the held-out figures of a run
that no longer describes these weights (measure them again: benchmarks/train_eval.py, whose
`--extend-history` gives the average a history.jsonl: the run's lines, then `history_line`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from spd.core.pdm import PDM
from spd.train.trainer import tokens_in_all


def average_states(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Σ_i w_i·state_i for floating tensors (computed in fp32, returned in each tensor's dtype); other
    tensors (the draft vocabulary d2t) must be identical in every state."""
    first = states[0]
    for s in states[1:]:
        if s.keys() != first.keys() or any(s[k].shape != first[k].shape for k in first):
            raise ValueError("drafts differ in shape: only drafts of one lineage can be averaged")
    out = {}
    for k, t in first.items():
        if t.is_floating_point():
            acc = torch.zeros_like(t, dtype=torch.float32)
            for w, s in zip(weights, states):
                acc += w * s[k].float()
            out[k] = acc.to(t.dtype)
        elif all(torch.equal(s[k], t) for s in states):
            out[k] = t
        else:
            raise ValueError(f"drafts differ in {k}: only drafts of one lineage can be averaged")
    return out


def average(drafts: list[Path], weights: list[float], out: Path) -> Path:
    """Write the weighted average of the exports `drafts` to `out` (an export directory)."""
    if len(drafts) != len(weights) or len(drafts) < 2:
        raise ValueError("give two or more drafts and one weight for each")
    if abs(sum(weights) - 1) > 1e-6 or min(weights) < 0:
        raise ValueError(f"weights must be non-negative and sum to 1, got {weights}")
    pdms = [PDM.load(d) for d in drafts]  # fp32 copies of the fp16 exports
    last = pdms[-1]
    last.load_state_dict(average_states([p.state_dict() for p in pdms], weights))
    notes = {k: v for k, v in last.config.notes.items() if k not in ("heldout_p", "heldout_loss", "curve")}
    notes["averaged"] = [{"path": str(d), "weight": w, "tokens_in_all": tokens_in_all(p.config.notes)}
                         for d, w, p in zip(drafts, weights, pdms)]
    last.config.notes = notes
    last.save(out)  # the export format: fp16 safetensors + config.json
    return out


def history_line(run_last: dict, fills: dict, notes: dict) -> dict:
    """The history.jsonl line of an averaged export: the last run's step, tokens and hours (averaging
    trains nothing) with the held-out KL and p measured on the average at a = n and a = 1 (`fills`:
    benchmarks/train_eval.py's summary), and its ingredients (`notes`: the export's config notes)."""
    last, first = fills[f"a{fills['n']}"], fills["a1"]
    ingredients = " + ".join(f"{a['weight']:g} x {a['path']} ({a['tokens_in_all']:,} tokens in all)" for a in notes["averaged"])
    return {"step": run_last["step"], "seen": run_last["seen"], "heldout_loss": last["kl"], "heldout_p": last["p"],
            "heldout_p_a1": first["p"], "heldout_loss_a1": first["kl"], "elapsed_s": run_last["elapsed_s"],
            "averaged": f"{ingredients} (spd.train.average)"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("drafts", nargs="+", type=Path, help="export directories (config.json, pdm.safetensors)")
    ap.add_argument("--weights", nargs="+", type=float, help="one per draft, summing to 1 (default: equal)")
    ap.add_argument("--out", required=True, type=Path, help="the averaged export's directory")
    args = ap.parse_args(argv)
    weights = args.weights or [1 / len(args.drafts)] * len(args.drafts)
    print(average(args.drafts, weights, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
