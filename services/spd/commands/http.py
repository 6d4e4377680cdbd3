"""`spd http`: the OpenAI-compatible HTTP API, a gateway in front of an orchestrator's gRPC API."""

from __future__ import annotations

from pathlib import Path
from spd import settings


def add_parser(sub) -> None:
    p = sub.add_parser("http", help="serve the OpenAI-compatible HTTP API in front of an orchestrator")
    p.add_argument("--grpc", default=settings.GRPC_ADDRESS, help="the orchestrator's gRPC address")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 in pods)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--model", help="model directory whose name /v1/models reports (default: the embedded default)")
    p.add_argument("--model-name", help="the model id clients use (default: the model directory's name)")
    p.set_defaults(run=run)


def run(args) -> int:
    import uvicorn

    from spd.commands import UsageError
    from spd.http_api.app import make_app

    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    name = args.model_name or (Path(args.model).name if args.model else "SmolLM2-135M-Instruct")
    uvicorn.run(make_app(args.grpc, name), host=args.host, port=args.port, log_level="warning")
    return 0
