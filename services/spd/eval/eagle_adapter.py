"""Placeholder until spd.eagle lands."""
def load_eagle(stages, model_dir, config, draft, k):
    raise NotImplementedError
