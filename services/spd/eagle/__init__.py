"""EAGLE-3-style baseline (design §9): a one-layer draft over fused low/mid/high target features,
chain drafting of k tokens, block verification in one target forward, TTT training."""
