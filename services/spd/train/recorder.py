"""Teacher features recorded while `BatchDecoder` generates: no second pass over the generated text.

A decode step already computes every hidden state and the next-token logits of each row, so the
anchor states H[b] and the teacher's top-k can be kept as they go by. The result per finished row is
the cache-style sequence dict (`spd.train.teacher`: tokens, loss, anchors, top_ids, top_p), laid out
as a prefill of the finished sequence would give it:

  sequence  prompt (P tokens) + response[:-1]          (the last response token is never fed)
  anchors   prompt positions from the prefill, position P+j from the step that fed response[j]
  top-k     position P-1+s predicts response[s]: from the prefill's logits for s = 0, else from the
            step that fed response[s-1]; only these R positions have loss 1

Per slot the decoder's rows reuse fixed buffers, so a step costs one scatter, not B appends:
  resp_anchors [B, max_new, m, d] fp16   anchors of response positions, by response index j
  top_ids / top_p [B, max_new, k]        top-k of the distribution that chose response[s]
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from spd.train.teacher import TOP_K, sequence_dict, top_k_probs


class FeatureRecorder:
    """Collects each row's features and hands them to `on_features(job, seq)` when the row ends."""

    def __init__(self, layers: list[int], on_features: Callable[[int, dict], None]):
        self.layers = layers  # H[b] recorded: b = 0 the embedding output, b the output of layer b-1
        self.on_features = on_features
        self.prompt_anchors: dict[int, torch.Tensor] = {}  # slot -> [P, m, d] fp16
        self.resp_anchors = self.top_ids = self.top_p = torch.empty(0)

    def allocate(self, batch: int, max_new: int, d: int, device) -> None:
        m = len(self.layers)
        self.resp_anchors = torch.zeros(batch, max_new, m, d, dtype=torch.float16, device=device)
        self.top_ids = torch.zeros(batch, max_new, TOP_K, dtype=torch.int32, device=device)
        self.top_p = torch.zeros(batch, max_new, TOP_K, dtype=torch.float16, device=device)

    def prefill(self, slots: torch.Tensor, lens: list[int], states: list[torch.Tensor], logits: torch.Tensor) -> None:
        """slots [b]; states: H[b] per recorded layer, each [b, P, d] right-padded; logits [b, V] of the
        last prompt position (they chose response[0])."""
        h = torch.stack(states, 2).half()  # [b, P, m, d]
        for i, (s, n) in enumerate(zip(slots.tolist(), lens)):
            self.prompt_anchors[s] = h[i, :n].clone()
        self.top_ids[slots, 0], self.top_p[slots, 0] = top_k_probs(logits)

    def step(self, slots: torch.Tensor, j: torch.Tensor, states: torch.Tensor, logits: torch.Tensor) -> None:
        """slots [b] whose rows fed response[j] this step, j [b]; states [b, m, d]: their H[b] at the
        recorded layers; logits [b, V] (they chose response[j + 1])."""
        self.resp_anchors[slots, j] = states.half()
        self.top_ids[slots, j + 1], self.top_p[slots, j + 1] = top_k_probs(logits)

    def finish(self, slot: int, job: int, prompt: list[int], response: list[int]) -> None:
        """The row in `slot` ended with `response` (R tokens): its sequence dict, to on_features."""
        P, R = len(prompt), len(response)
        anchors = torch.cat([self.prompt_anchors.pop(slot), self.resp_anchors[slot, :R - 1]])  # [P+R-1, m, d]
        self.on_features(job, sequence_dict(prompt + response[:-1], P - 1, anchors, self.top_ids[slot, :R], self.top_p[slot, :R]))
