"""The evaluation harness behind `spd eval`: acceptance of every method on the prompt sets, and costs.

Per prompt set and temperature, one AR pass of the target (token by token, every anchor layer any
method needs) serves all SPD / PPSD methods:
  T = 0  exact verdicts by the drafter replay (spd.eval.acceptance; equals the live engine, tested);
  T > 0  the Σ min(p, q) estimate along the target-sampled sequence (spd.eval.sampled).
EAGLE-3 runs live (single process, block verification), so its τ and its decode wall-clock are
measured; the AR pass's own decode time is the AR wall-clock reference of the same prompts.
"""

from __future__ import annotations

import statistics

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from spd.core.drafter import DrafterState
from spd.core.pdm import PDM
from spd.core.sampling import SamplingParams
from spd.core.split import uniform_split
from spd.core.stopping import StopRule, eos_ids_of
from spd.core.target import load_pipeline
from spd.core.ar import ar_generate
from spd.eval import costs as C
from spd.eval import prompts as prompt_sets
from spd.eval.acceptance import ar_trace, replay
from spd.eval.methods import Method
from spd.eval.sampled import estimate
from spd.pipeline import shipped_draft_for
from spd.models.loading import load_config, load_tokenizer, resolve_model
from spd.text import encode_prompt



@dataclass
class EvalConfig:
    sets: tuple[str, ...] = prompt_sets.SETS  # prompt sets to run
    prompts: int = 8  # first K prompts of each set (0 = all)
    max_tokens: int = 512  # generation cap per prompt
    temperatures: tuple[float, ...] = (0.0, 1.0)  # T = 0 greedy; T = 1 with top_k / top_p below
    top_k: int = 50
    top_p: float = 1.0
    sims: int = 200  # simulated verdict chains per prompt for the sampled estimate
    threads: int = 1  # torch threads (timings depend on it)
    model: str | None = None  # target model dir (None = the embedded default)
    progress: bool = True


@dataclass
class Tally:
    """Sums over the prompts of one (set, temperature, method)."""
    N: int = 0  # generated tokens
    K: float = 0.0  # cycles (SPD: pipeline cycles, E[K] when estimated; EAGLE: target forwards after prefill)
    accepts: int = 0
    judged: int = 0  # judgements (SPD / PPSD)
    decode_s: float = 0.0  # measured decode wall-clock (EAGLE, AR)
    mismatches: int = 0  # greedy outputs that differ from AR (must stay 0)
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"N": self.N, "K": self.K, "accepts": self.accepts, "judged": self.judged,
                "decode_s": self.decode_s, "mismatches": self.mismatches, **self.extra}


def _params(cfg: EvalConfig, T: float, seed: int) -> SamplingParams:
    return SamplingParams() if T == 0 else SamplingParams(temperature=T, top_k=cfg.top_k, top_p=cfg.top_p, seed=seed)


class Harness:
    def __init__(self, cfg: EvalConfig, methods: list[Method]):
        torch.set_num_threads(cfg.threads)
        self.cfg, self.methods = cfg, methods
        self.model_dir = resolve_model(cfg.model)
        self.config = load_config(self.model_dir)
        self.tokenizer = load_tokenizer(self.model_dir)
        L = self.config.num_hidden_layers
        self.drafters: dict[str, DrafterState] = {}
        pdms = {m.label: self._load_pdm(m) for m in methods if m.kind in ("spd", "ppsd")}
        layers = sorted({b for p in pdms.values() for b in p.config.anchors})
        self.stages = load_pipeline(self.model_dir, self.config, uniform_split(L, 1), tuple(layers))
        for m in methods:
            if m.label in pdms:
                self.drafters[m.label] = DrafterState(pdms[m.label], self.stages[0].embed, uniform_split(L, m.n))
        self.eagles = {m.label: self._load_eagle(m) for m in methods if m.kind == "eagle3"}
        self.stop = StopRule(cfg.max_tokens, eos_ids_of(self.tokenizer, self.config))

    def _load_pdm(self, m: Method) -> PDM:
        path = shipped_draft_for(self.model_dir) if m.draft == "shipped" else Path(m.draft)
        if path is None:
            raise ValueError(f"no shipped draft for {self.model_dir.name}")
        return PDM.load(path)

    def _load_eagle(self, m: Method):
        from spd.eagle.engine import EagleEngine

        return EagleEngine.from_dir(self.stages, Path(m.draft), m.k)

    def prompts(self, name: str) -> list[list[int]]:
        if name == "mtbench2":
            return self._second_turns()
        return [encode_prompt(self.tokenizer, messages=msgs) for msgs in prompt_sets.load(name, self.cfg.prompts or None)]

    def _second_turns(self) -> list[list[int]]:
        """MT-Bench second turns: [question 1, the target's own greedy answer, question 2]."""
        out = []
        for first, second in prompt_sets.mtbench_turns(self.cfg.prompts or None):
            msgs: list[dict] = [{"role": "user", "content": first}]
            answer = ar_generate(self.stages, encode_prompt(self.tokenizer, messages=msgs), SamplingParams(), self.stop)
            text = self.tokenizer.decode(answer.token_ids, skip_special_tokens=True)
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": second}]
            out.append(encode_prompt(self.tokenizer, messages=msgs))
        return out

    def run_set(self, name: str) -> dict:
        """{"prompts": P, "max_tokens": M, "results": {str(T): {"AR": tally, method label: tally}}} for one set."""
        prompts = self.prompts(name)
        out: dict[str, Any] = {"prompts": len(prompts), "max_tokens": self.cfg.max_tokens, "results": {}}
        for T in self.cfg.temperatures:
            tallies = {"AR": Tally(), **{m.label: Tally() for m in self.methods}}
            for i, prompt in enumerate(tqdm(prompts, desc=f"{name} T={T}", disable=not self.cfg.progress)):
                self._one_prompt(prompt, _params(self.cfg, T, seed=i), tallies)
            out["results"][str(T)] = {k: v.as_dict() for k, v in tallies.items()}
        return out

    def _one_prompt(self, prompt: list[int], params: SamplingParams, tallies: dict[str, Tally]) -> None:
        timing: dict = {}
        generated, anchors, dists = ar_trace(self.stages, prompt, self.stop, params, keep_dists=not params.greedy,
                                             timing=timing)
        ar = tallies["AR"]
        ar.N, ar.K, ar.decode_s = ar.N + len(generated), ar.K + len(generated) - 1, ar.decode_s + timing["decode_s"]
        for m in self.methods:
            t = tallies[m.label]
            if m.kind == "eagle3":
                self._eagle(m, prompt, params, generated, t)
                continue
            d = self.drafters[m.label]
            if params.greedy:
                r = replay(d, prompt, generated, anchors, m.schedule)
                t.N, t.K, t.accepts, t.judged = t.N + r.generated_tokens, t.K + r.cycles, t.accepts + r.accepts, t.judged + r.accepts + r.rejects
            else:
                e = estimate(d, prompt, generated, anchors, dists, params, m.schedule, self.cfg.sims, params.seed)
                t.N, t.K = t.N + e.generated_tokens, t.K + e.expected_cycles
                t.extra["beta_sum"] = t.extra.get("beta_sum", 0.0) + e.mean_beta * max(len(generated) - 1, 0)
                t.judged += max(len(generated) - 1, 0)

    def _eagle(self, m: Method, prompt, params, ar_tokens, t: Tally) -> None:
        g = self.eagles[m.label].generate(prompt, params, self.stop)
        s = g.stats
        t.N, t.K = t.N + s.generated_tokens, t.K + s.cycles
        t.accepts += s.accepts
        t.decode_s += s.decode_s
        t.extra["draft_s"] = t.extra.get("draft_s", 0.0) + s.draft_s
        t.mismatches += int(params.greedy and g.token_ids != ar_tokens)

    def costs(self, ns=(2, 3, 5, 6, 10), reps: int = 15, overhead: Path = C.OVERHEAD_FILE) -> dict:
        """Component times on this machine (see spd.eval.costs)."""
        prompt = self.prompts("mtbench")[0]
        generated, anchors, _ = ar_trace(self.stages, prompt, StopRule(64), SamplingParams())
        tokens = prompt + generated[:-1]
        ar_runs = [C.ar_token_ms(self.stages, prompt, 24)]
        out: dict[str, Any] = {"threads": self.cfg.threads, "context_tokens": len(tokens),
                               "overhead_file": str(overhead), "stage_ms": {}, "overhead_ms": {}, "draft_ms": {}}
        for n in ns:  # AR timed between the stage timings: one load spike cannot set the reference
            out["stage_ms"][n] = C.stage_ms(self.model_dir, self.config, n, tokens, reps)
            out["overhead_ms"][n] = C.overhead_ms(n, overhead)
            ar_runs.append(C.ar_token_ms(self.stages, prompt, 24))
        ar_runs.append(C.ar_token_ms(self.stages, prompt, 24))
        out["ar_token_ms"], out["ar_token_ms_runs"] = statistics.median(ar_runs), ar_runs
        for m in self.methods:
            if m.label in self.drafters:
                out["draft_ms"][m.label] = C.draft_ms(self.drafters[m.label], tokens, anchors[:len(tokens)], m.schedule, reps)
        return out


def check_sampled(h: Harness, method: Method, set_name: str = "mtbench", prompts: int = 4, seeds: int = 4,
                  max_tokens: int = 64, temperature: float = 1.0) -> dict:
    """Live SPD engine (rejection sampling) vs the Σ min(p, q) estimate on the same prompts."""
    from spd.core.engine import SPDEngine

    d = h.drafters[method.label]
    stages = load_pipeline(h.model_dir, h.config, d.split, tuple(d.pdm.config.anchors))
    live_drafter = DrafterState(d.pdm, stages[0].embed, d.split)
    engine = SPDEngine(stages, live_drafter, method.schedule)
    stop = StopRule(max_tokens, h.stop.eos_ids)
    live, est = Tally(), Tally()
    for i, prompt in enumerate(tqdm(h.prompts(set_name)[:prompts], desc="live vs estimate", disable=not h.cfg.progress)):
        for s in range(seeds):
            params = SamplingParams(temperature=temperature, top_k=h.cfg.top_k, top_p=h.cfg.top_p, seed=1000 * i + s)
            g = engine.generate(prompt, params, stop)
            live.N, live.K = live.N + g.stats.generated_tokens, live.K + g.stats.cycles
            other = SamplingParams(temperature=temperature, top_k=h.cfg.top_k, top_p=h.cfg.top_p, seed=10**6 + 1000 * i + s)
            generated, anchors, dists = ar_trace(h.stages, prompt, stop, other, keep_dists=True)
            e = estimate(d, prompt, generated, anchors, dists, params, method.schedule, h.cfg.sims, s)
            est.N, est.K = est.N + e.generated_tokens, est.K + e.expected_cycles
    return {"method": method.label, "set": set_name, "prompts": prompts, "seeds": seeds, "max_tokens": max_tokens,
            "temperature": temperature, "top_k": h.cfg.top_k,
            "live": {"N": live.N, "K": live.K, "alpha": live.N / live.K},
            "estimate": {"N": est.N, "K": est.K, "alpha": est.N / est.K}}
