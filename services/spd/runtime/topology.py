"""Where every process listens: one ZeroMQ PULL endpoint per worker and one for the orchestrator.

The same JSON serves `spd up` (loopback ports) and Kubernetes (stable DNS names), passed with
`--topology` or the SPD_TOPOLOGY environment variable. It is where the pipeline starts: when a
warm spare takes over a dead worker's role, the orchestrator moves that role to the spare's own
endpoint and sends the new routes with the next PREFILL (`runtime/spares.py`).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from spd import settings


@dataclass(frozen=True)
class Topology:
    stages: tuple[str, ...]  # ZMQ endpoint of stage j+1's inbox, e.g. tcp://127.0.0.1:5601
    drafter: str  # the drafter's inbox
    orchestrator: str  # the orchestrator's inbox (exits, drafts, heartbeats)

    @property
    def n(self) -> int:
        return len(self.stages)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Topology":
        return cls(tuple(d["stages"]), d["drafter"], d["orchestrator"])

    @classmethod
    def from_json(cls, text: str) -> "Topology":
        return cls.from_dict(json.loads(text))

    def endpoint(self, role: str, index: int = 0) -> str:
        """The inbox of ("stage", j) or ("drafter", 0)."""
        return self.stages[index - 1] if role == "stage" else self.drafter

    def moved(self, role: str, index: int, endpoint: str) -> "Topology":
        """The same routes with one worker at a new endpoint (a spare took its place)."""
        if role == "stage":
            stages = list(self.stages)
            stages[index - 1] = endpoint
            return Topology(tuple(stages), self.drafter, self.orchestrator)
        return Topology(self.stages, endpoint, self.orchestrator)

    @classmethod
    def from_arg(cls, arg: str | None) -> "Topology":
        text = arg or os.environ.get(settings.ENV_TOPOLOGY)
        if not text:
            raise SystemExit("no topology: pass --topology JSON or set SPD_TOPOLOGY")
        return cls.from_json(Path(text[1:]).read_text() if text.startswith("@") else text)


def bind_endpoint(endpoint: str) -> str:
    """What a process binds for its own advertised endpoint: loopback stays loopback, names -> all."""
    proto, _, rest = endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    if host in ("127.0.0.1", "localhost", "[::1]"):
        return endpoint
    return f"{proto}://*:{port}"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports free right now on `host` (for the local launcher)."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def local_topology(n: int, host: str = "127.0.0.1", ports: list[int] | None = None) -> Topology:
    ports = ports or free_ports(n + 2, host)
    return Topology(tuple(f"tcp://{host}:{p}" for p in ports[:n]), f"tcp://{host}:{ports[n]}",
                    f"tcp://{host}:{ports[n + 1]}")
