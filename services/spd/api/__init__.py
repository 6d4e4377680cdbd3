"""The public gRPC API on the server side: request validation (the servicer builds on it)."""

from spd.api.validation import InvalidRequest, Limits, ValidRequest, validate

__all__ = ["InvalidRequest", "Limits", "ValidRequest", "validate"]
