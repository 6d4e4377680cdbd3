"""Teacher features computed from token ids: the anchors are the states the pipeline's stages send
the drafter (the raw residual stream, H[L] included), and the top-k is the target's distribution."""

from __future__ import annotations

import torch

from spd.core.stage import load_stage
from spd.models.loading import load_config
from spd.train.online import OnlineTeacher


def test_online_anchors_are_the_stage_states_including_the_last_layer(tiny_dir):
    model_dir = tiny_dir("llama")
    config = load_config(model_dir)
    L = config.num_hidden_layers
    layers = [0, 1, L - 1, L]
    tokens = [3, 17, 5, 42, 8, 9, 11, 2]
    [feat] = OnlineTeacher(model_dir, layers, dtype=torch.float32).features([(tokens, 3)])
    stage = load_stage(model_dir, config, range(0, L), tuple(layers))
    out = stage.forward(torch.tensor(tokens), 0)
    for i, b in enumerate(layers):
        want = out.anchors[b]  # [T, d]
        scale = want.abs().amax()
        assert (feat["anchors"][:, i].float() - want).abs().amax() <= 1e-3 * scale, f"H[{b}]"
    probs = torch.softmax(out.logits[3:].float(), -1)  # [T - 3, V]: the loss positions
    assert torch.equal(feat["top_ids"][3:, 0].long(), probs.argmax(-1))
    torch.testing.assert_close(feat["top_p"][3:, 0].float(), probs.amax(-1), atol=1e-3, rtol=1e-2)
    assert feat["loss"].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
