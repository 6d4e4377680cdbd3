"""`spd generate`: one generation with the AR reference, the in-process SPD engine, or a server."""

from __future__ import annotations

import argparse
import json
import sys

from typing import TYPE_CHECKING

from spd.commands import UsageError
from spd.core.schedule import SCHEDULES

if TYPE_CHECKING:
    from spd.core.results import Generation


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt")
    p.add_argument("--prompt", required=True, help="user message (chat template applied unless --raw)")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    p.add_argument("--engine", choices=["ar", "local"], default="local",
                   help="ar: plain autoregressive reference; local: SPD engine in this process")
    p.add_argument("--address", help="HOST:PORT of an SPD orchestrator (ignores --engine)")
    p.add_argument("--token", help="with --address: bearer token the server requires (default $SPD_TOKEN)")
    p.add_argument("--tls", action="store_true", help="with --address: connect over TLS (system roots, or --ca)")
    p.add_argument("--ca", help="with --address: PEM file of the CA that signed the server's certificate (implies --tls)")
    p.add_argument("--timeout", type=float, default=600.0, help="with --address: deadline of the call in seconds "
                   "(default 600)")
    p.add_argument("--model", help="model directory (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--n", type=int, default=5, help="pipeline stages (default 5)")
    p.add_argument("--split", default="uniform", help="uniform | balanced | boundaries '0,6,...,L' (default uniform)")
    p.add_argument("--ls", type=int, default=1, help="layers of a random PDM when no trained one exists (default 1)")
    p.add_argument("--draft", help="PDM directory ('random' forces an untrained one; default: the shipped one)")
    p.add_argument("--schedule", choices=SCHEDULES, default="pre",
                   help="draft before (pre) or after (post) each cycle's verification (default pre)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default 0)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens; 0 = off (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass; 1 = off (default)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--coupling", choices=["rejection", "gumbel"], default="rejection",
                   help="sampled verification: rejection sampling, or shared Gumbel noise (identical to AR sampling)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--device", default="cpu", help="torch device of the in-process engine (default cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights and activations of the in-process engine (default float32)")
    p.add_argument("--trace", action="store_true", help="include the per-cycle trace in --json output")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.address:
        from spd.commands.remote import run_remote  # needs the gRPC stubs only when used

        return run_remote(args)
    from spd.core.engine import SPDEngine  # torch and the model code: only when generating here
    from spd.core.results import Generation, Stats
    from spd.core.sampling import SamplingParams
    from spd.core.stopping import StopRule, eos_ids_of
    from spd.core.ar import ar_stream
    from spd.pipeline import PipelineConfig, build_local
    from spd.text import TextStream, encode_prompt

    req = _validated(args)
    cfg = PipelineConfig(model=args.model, n=1 if args.engine == "ar" else args.n, split=args.split,
                         draft=args.draft, ls=args.ls, device=args.device, dtype=args.dtype)
    try:
        local = build_local(cfg, with_drafter=args.engine != "ar")
    except ValueError as e:  # e.g. n greater than the model's layers, a bad --split
        raise UsageError(str(e)) from None
    tok = local.tokenizer
    assert tok is not None  # build_local loads it unless told not to
    params = SamplingParams(req.temperature, req.top_k, req.top_p, req.seed, req.coupling)
    stop = StopRule(req.max_tokens, eos_ids_of(tok, local.config), req.stop, tok)
    prompt_ids = encode_prompt(tok, args.prompt, raw=args.raw)
    stats = Stats(n=len(local.stages))
    trace: list[dict] = []
    if args.engine == "ar":
        tokens = ar_stream(local.stages, prompt_ids, params, stop, stats)
    else:
        tokens = SPDEngine(local.stages, local.drafter(), args.schedule, trace=args.trace).stream(
            prompt_ids, params, stop, stats, trace)
    text = TextStream(tok, tuple(args.stop))
    ids = []
    for token in tokens:
        ids.append(token)
        if not args.json:
            sys.stdout.write(text.push(token))
            sys.stdout.flush()
    result = Generation(ids, stop.finish_reason(ids) or "length", stats, trace)
    full = stop.cut_text(str(tok.decode(ids, skip_special_tokens=True)))
    if args.json:
        out = {"text": full, "token_ids": ids, "finish_reason": result.finish_reason,
               "engine": args.engine, "stats": stats.as_dict()}
        if args.trace:
            out["trace"] = trace
        print(json.dumps(out))
    else:
        sys.stdout.write(text.flush() + "\n")
        print(_summary(result), file=sys.stderr)
    return 0


def _validated(args):
    """The same request rules as the server's (spd.api.validation), so both paths agree."""
    from spd.api.validation import InvalidRequest, validate
    from spd_client.client import build_request

    try:
        return validate(build_request(args.prompt, raw=args.raw, max_tokens=args.max_tokens,
                                      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                      seed=args.seed, stop=args.stop, coupling=args.coupling))
    except InvalidRequest as e:
        raise UsageError(e.message) from None


def _summary(g: Generation) -> str:
    s = g.stats
    rate = (s.generated_tokens - 1) / s.decode_s if s.decode_s else float("nan")
    alpha = f"{s.alpha:.3f}" if s.alpha is not None else "-"
    return (f"[{g.finish_reason}] N={s.generated_tokens} K={s.cycles} alpha={alpha} n={s.n} "
            f"accepts={s.accepts} rejects={s.rejects} prefill={s.prefill_s:.2f}s decode={rate:.1f} tok/s")
