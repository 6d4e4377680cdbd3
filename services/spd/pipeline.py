"""Build an in-process target + drafter from a model argument: the shared set-up of the CLI,
the benchmarks and the tests (the services build their own parts from the same functions)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from spd.core.drafter import DrafterState
from spd.core.pdm import PDM, random_pdm
from spd.core.split import PipelineSplit, balanced_split, default_anchors, explicit_split, uniform_split
from spd.core.stage import Stage
from spd.core.target import load_pipeline
from spd.models.loading import load_config, load_tokenizer, resolve_model

log = logging.getLogger(__name__)

SHIPPED_DRAFTS = Path(__file__).parent / "assets" / "drafts"  # trained PDMs, one folder each


@dataclass
class PipelineConfig:
    model: str | None = None  # model directory, or None / "smollm2" for the embedded default
    n: int = 5  # pipeline stages
    split: str = "uniform"  # uniform | balanced | comma-separated boundaries "0,6,12,...,L"
    draft: str | None = None  # PDM directory; None = the shipped one for this model, else random
    ls: int = 1  # layers of a random PDM (ignored when a trained one is loaded)
    device: str = "cpu"  # torch device for every part (the services pin one device each)
    dtype: str = "float32"  # AR and SPD must compare at the same dtype


def make_split(spec: str, num_layers: int, n: int) -> PipelineSplit:
    if spec == "uniform":
        return uniform_split(num_layers, n)
    if spec == "balanced":  # CPU costs measured on SmolLM2: a layer ~2.5 ms, the LM head ~14 ms
        return balanced_split(num_layers, n, layer_cost=2.5, head_cost=14.0)
    return explicit_split([int(x) for x in spec.split(",")], num_layers)


def shipped_draft_for(model_dir: Path) -> Path | None:
    """The shipped PDM trained for this model (matched by folder name), if any."""
    candidate = SHIPPED_DRAFTS / model_dir.name
    return candidate if (candidate / "config.json").exists() else None


@dataclass
class LocalPipeline:
    model_dir: Path
    config: object
    tokenizer: PreTrainedTokenizerBase | None  # None when built without one
    split: PipelineSplit
    stages: list[Stage]
    pdm: PDM | None  # None when built for AR only

    def drafter(self) -> DrafterState:
        if self.pdm is None:
            raise ValueError("this pipeline was built without a drafter (with_drafter=False)")
        return DrafterState(self.pdm, self.stages[0].embed, self.split)


def build_local(cfg: PipelineConfig, with_tokenizer: bool = True, with_drafter: bool = True) -> LocalPipeline:
    model_dir = resolve_model(cfg.model)
    config = load_config(model_dir)
    split = make_split(cfg.split, config.num_hidden_layers, cfg.n)
    dtype = getattr(torch, cfg.dtype)
    pdm = load_pdm(cfg.draft, model_dir, config, split, cfg.ls, cfg.device, dtype) if with_drafter else None
    anchors = tuple(pdm.config.anchors) if pdm else default_anchors(split)
    stages = load_pipeline(model_dir, config, split, anchors, cfg.device, dtype)
    tokenizer = load_tokenizer(model_dir) if with_tokenizer else None
    return LocalPipeline(model_dir, config, tokenizer, split, stages, pdm)


def resolve_draft(draft: str | None, model_dir: Path) -> Path | None:
    """A PDM directory: the given one, the shipped one for this model, or None (random)."""
    if draft == "random":
        return None
    return Path(draft) if draft else shipped_draft_for(model_dir)


def load_pdm(draft: str | None, model_dir: Path, config, split: PipelineSplit, ls: int, device, dtype) -> PDM:
    path = resolve_draft(draft, model_dir)
    if path is not None:
        log.info("drafter: trained PDM from %s", path)
        return PDM.load(path, device, dtype)
    log.warning("drafter: no trained PDM for %s; using a RANDOM one (correct output, low acceptance)", model_dir.name)
    return random_pdm(config, list(default_anchors(split)), ls).to(device=device, dtype=dtype)


def anchors_for(draft: str | None, model_dir: Path, split: PipelineSplit) -> tuple[int, ...]:
    """The anchors the stages must report: the PDM's own, or the default for a random PDM."""
    path = resolve_draft(draft, model_dir)
    if path is not None:
        return tuple(json.loads((path / "config.json").read_text())["anchors"])
    return default_anchors(split)
