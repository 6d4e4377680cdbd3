"""spd_client: the Python SDK of the SPD generation service (see spd_client.client).

Names are imported lazily so that `python -m spd_client.gen_protos` works even when the
generated stubs in spd_client.v1 are missing or broken.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type checkers see the real names; at run time they load on first use
    from spd_client.client import Chunk, Params, Result, SPDClient, SPDError, StreamDivergedError

__all__ = ["Chunk", "Params", "Result", "SPDClient", "SPDError", "StreamDivergedError"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("spd_client.client"), name)
    raise AttributeError(f"module 'spd_client' has no attribute {name!r}")
