"""The OpenAI-compatible HTTP API of SPD serve (a gateway in front of the gRPC orchestrator)."""
