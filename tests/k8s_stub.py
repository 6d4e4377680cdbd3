"""A loopback stand-in for the Kubernetes API server: an in-memory object store over real HTTP.

It records every request (method, path, query, content type, body) so tests can check exactly what
the `kubernetes` client sent, and answers like the API server does for the few verbs the deploy
tool uses: server-side apply (PATCH application/apply-patch+yaml) stores the object, GET reads one
or lists with a label selector, DELETE removes (404 with a Status when absent). No controllers,
no admission, no schema validation, no field-ownership merge: it is not a cluster.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

# /api/v1/namespaces/NS/pods/NAME, /apis/apps/v1/namespaces/NS/statefulsets/NAME, /api/v1/namespaces/NAME
_PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                   r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?$")
_NS_PATH = re.compile(r"^/api/v1/namespaces/(?P<name>[^/]+)$")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str | None
    authorization: str | None
    body: object | None


@dataclass
class StubAPIServer:
    requests: list[Request] = field(default_factory=list)
    objects: dict[tuple, dict] = field(default_factory=dict)  # (plural, namespace, name) -> object
    on_delete: object = None  # callback(plural, namespace, name) before an object is removed

    def __post_init__(self):
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _handle(self):
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                req = Request(self.command, url.path, parse_qs(url.query), self.headers.get("Content-Type"),
                              self.headers.get("Authorization"), body)
                with stub.lock:
                    stub.requests.append(req)
                code, reply = stub.answer(req)
                data = json.dumps(reply).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "StubAPIServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path, namespace: str = "default", token: str = "stub-token") -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "stub",
            "clusters": [{"name": "stub", "cluster": {"server": self.url}}],
            "users": [{"name": "stub", "user": {"token": token}}],
            "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub", "namespace": namespace}}],
        }))
        return path

    # -- the store ------------------------------------------------------------------------------
    def put(self, plural: str, namespace: str | None, obj: dict) -> dict:
        obj = json.loads(json.dumps(obj))
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta["resourceVersion"] = str(len(self.requests) + 1)
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        self.objects[(plural, namespace, meta["name"])] = obj
        return obj

    def answer(self, req: Request) -> tuple[int, dict]:
        m = _NS_PATH.match(req.path)
        if m:  # a Namespace object (cluster scoped, path /api/v1/namespaces/NAME)
            plural, ns, name = "namespaces", None, m["name"]
        else:
            m = _PATH.match(req.path)
            if not m:
                return 404, _status(404, f"no route {req.path}")
            plural, ns, name = m["plural"], m["ns"], m["name"]
        key = (plural, ns, name)
        with self.lock:
            if req.method == "PATCH":
                if req.content_type != "application/apply-patch+yaml":
                    return 415, _status(415, f"stub only supports server-side apply, got {req.content_type}")
                if "fieldManager" not in req.query:
                    return 422, _status(422, "fieldManager is required for apply patch")
                if req.query.get("dryRun") == ["All"]:
                    return 200, req.body
                return 200, self.put(plural, ns, req.body)
            if req.method == "GET" and name:
                obj = self.objects.get(key)
                return (200, obj) if obj else (404, _status(404, f'{plural} "{name}" not found'))
            if req.method == "GET":
                selector = dict(kv.split("=", 1) for kv in req.query.get("labelSelector", [""])[0].split(",") if kv)
                items = [o for (p, n, _), o in sorted(self.objects.items()) if p == plural and n == ns
                         and all(o["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())]
                return 200, {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}
            if req.method == "DELETE":
                obj = self.objects.get(key)
                if obj is None:
                    return 404, _status(404, f'{plural} "{name}" not found')
                if self.on_delete:
                    self.on_delete(plural, ns, name)
                del self.objects[key]
                return 200, obj
        return 405, _status(405, f"{req.method} not supported by the stub")


def _status(code: int, message: str) -> dict:
    reason = {404: "NotFound", 405: "MethodNotAllowed", 415: "UnsupportedMediaType", 422: "Invalid"}.get(code, "")
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def pod(name: str, namespace: str, labels: dict, ready: bool = True, restarts: int = 0, node: str = "node-a") -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "spd-serve:0.1.0"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": "main", "ready": ready, "restartCount": restarts,
                                              "image": "spd-serve:0.1.0", "imageID": "", "started": True}]}}
