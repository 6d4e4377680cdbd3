"""`spd generate --address HOST:PORT`: one generation through a running SPD service, via the SDK."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import grpc

from spd_client import SPDClient, SPDError
from spd import settings

DEFAULT_TIMEOUT_S = 600.0  # deadline of the call when args has no --timeout


def run_remote(args: argparse.Namespace) -> int:
    """Stream the completion to stdout (summary on stderr), or print one JSON object with --json."""
    params = dict(raw=args.raw, max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                  top_p=args.top_p, seed=args.seed, stop=args.stop, coupling=getattr(args, "coupling", ""))
    timeout = getattr(args, "timeout", None) or DEFAULT_TIMEOUT_S
    token = getattr(args, "token", None) or settings.token()
    ca = getattr(args, "ca", None)
    credentials = grpc.ssl_channel_credentials(Path(ca).read_bytes()) if ca else None
    try:
        with SPDClient(args.address, timeout=timeout, token=token, tls=getattr(args, "tls", False),
                       credentials=credentials) as client:
            return _json(client, args.prompt, params) if args.json else _stream(client, args.prompt, params)
    except SPDError as e:
        print(f"spd generate: {args.address}: {e.code.name}: {e.details}", file=sys.stderr)
        return 1


def _json(client: SPDClient, prompt: str, params: dict) -> int:
    r = client.generate(prompt, **params)
    print(json.dumps({"text": r.text, "token_ids": r.token_ids, "finish_reason": r.finish_reason,
                      "engine": "remote", "stats": r.stats}))
    return 0


def _stream(client: SPDClient, prompt: str, params: dict) -> int:
    finish, stats = "length", {}
    for chunk in client.stream(prompt, **params):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        if chunk.finish_reason:
            finish, stats = chunk.finish_reason, chunk.stats or {}
    sys.stdout.write("\n")
    print(_summary(finish, stats), file=sys.stderr)
    return 0


def _summary(finish: str, s: dict) -> str:
    """One line for someone who has not read the paper: what SPD did, in words, with its symbols."""
    n, alpha = s.get("n", 0), s.get("alpha", 0.0)
    return (f"[{finish}] {s.get('generated_tokens', 0)} tokens in {s.get('cycles', 0)} pipeline cycles: "
            f"a token in {alpha:.0%} of cycles (alpha), so at most {n * alpha:.1f}x plain decoding with "
            f"n={n} stages (S0 = n*alpha) | drafter right {s.get('accepts', 0)}, wrong {s.get('rejects', 0)} "
            f"(each miss flushes the pipeline: {s.get('flushes', 0)}) | first token {s.get('ttft_ms', 0.0):.0f} ms, "
            f"then {s.get('tokens_per_s', 0.0):.1f} tok/s")
