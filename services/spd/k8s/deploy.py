"""Apply, inspect, delete and break a rendered SPD pipeline with the `kubernetes` Python client.

- apply: server-side apply (PATCH application/apply-patch+yaml, fieldManager spd-k8s, force) of
  every rendered object, in order; the API server merges, defaults and validates.
- status: the pipeline's pods per role (stage / drafter / orchestrator) with readiness, restarts,
  node; the workloads' ready replicas.
- delete: every rendered object, in reverse order; absent ones are fine; the Namespace is kept
  unless asked (it may hold the weights PVC).
- chaos: stream one generation through the orchestrator's gRPC API and delete a random stage pod
  after a number of streamed tokens; report whether the stream completed, and whether its tokens
  equal a fault-free run of the same (greedy) request.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from spd.k8s.render import RenderConfig

if TYPE_CHECKING:
    from kubernetes.client import V1Pod
    from spd_client import Params

log = logging.getLogger(__name__)

FIELD_MANAGER = "spd-k8s"
APPLY_PATCH = "application/apply-patch+yaml"
# kind -> (API class in kubernetes.client, method suffix, namespaced)
KINDS = {
    "Namespace": ("CoreV1Api", "namespace", False),
    "ServiceAccount": ("CoreV1Api", "namespaced_service_account", True),
    "ConfigMap": ("CoreV1Api", "namespaced_config_map", True),
    "Service": ("CoreV1Api", "namespaced_service", True),
    "PersistentVolumeClaim": ("CoreV1Api", "namespaced_persistent_volume_claim", True),
    "StatefulSet": ("AppsV1Api", "namespaced_stateful_set", True),
    "Deployment": ("AppsV1Api", "namespaced_deployment", True),
    "PodDisruptionBudget": ("PolicyV1Api", "namespaced_pod_disruption_budget", True),
    "NetworkPolicy": ("NetworkingV1Api", "namespaced_network_policy", True),
}
ROLES = ("stage", "drafter", "orchestrator")


def api_client(kubeconfig: str | None = None, context: str | None = None):
    """A kubernetes.client.ApiClient: from a kubeconfig (default ~/.kube/config, $KUBECONFIG), or
    the in-cluster service account when there is no kubeconfig and we run in a pod."""
    import os

    from kubernetes import client, config

    if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST") \
            and not os.environ.get("KUBECONFIG") and not os.path.exists(os.path.expanduser("~/.kube/config")):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=kubeconfig, context=context)


def _call(api, obj: dict, verb: str, **kw):
    from kubernetes import client

    try:
        cls, suffix, namespaced = KINDS[obj["kind"]]
    except KeyError:
        raise ValueError(f"spd k8s does not handle kind {obj['kind']}") from None
    method = getattr(getattr(client, cls)(api), f"{verb}_{suffix}")
    meta = obj["metadata"]
    return method(meta["name"], meta["namespace"], **kw) if namespaced else method(meta["name"], **kw)


def _ref(obj: dict) -> str:
    ns = obj["metadata"].get("namespace")
    return f"{obj['kind'].lower()}/{obj['metadata']['name']}" + (f" -n {ns}" if ns else "")


def apply(api, objs: list[dict], dry_run: bool = False, field_manager: str = FIELD_MANAGER, out=print) -> list[str]:
    """Server-side apply every object in order; returns what was applied."""
    done = []
    for obj in objs:
        _call(api, obj, "patch", body=obj, field_manager=field_manager, force=True,
              dry_run="All" if dry_run else None, _content_type=APPLY_PATCH)
        done.append(_ref(obj))
        out(f"applied {_ref(obj)}" + (" (server dry run)" if dry_run else ""))
    return done


def delete(api, objs: list[dict], keep_namespace: bool = True, out=print) -> dict[str, str]:
    """Delete every object in reverse order (background propagation); 404 counts as deleted."""
    from kubernetes.client.exceptions import ApiException

    result = {}
    for obj in reversed(objs):
        if obj["kind"] == "Namespace" and keep_namespace:
            result[_ref(obj)] = "kept"
            continue
        try:
            _call(api, obj, "delete", propagation_policy="Background")
            result[_ref(obj)] = "deleted"
        except ApiException as e:
            if e.status != 404:
                raise
            result[_ref(obj)] = "absent"
        out(f"{result[_ref(obj)]} {_ref(obj)}")
    return result


# ----------------------------------------------------------------------------------------------- status

@dataclass
class PodStatus:
    role: str
    name: str
    ready: bool
    phase: str
    restarts: int
    node: str
    stage: int | None = None  # 1-based stage index (StatefulSet ordinal + 1)


@dataclass
class Status:
    namespace: str
    pods: list[PodStatus] = field(default_factory=list)
    expected: dict[str, int] = field(default_factory=dict)  # role -> desired replicas (0: workload absent)

    def ready(self, role: str) -> int:
        return sum(p.ready for p in self.pods if p.role == role)

    @property
    def pipeline_ready(self) -> bool:
        return all(self.expected.get(r, 0) > 0 and self.ready(r) >= self.expected[r] for r in ROLES)

    def as_dict(self) -> dict:
        return {"namespace": self.namespace, "pipeline_ready": self.pipeline_ready, "expected": self.expected,
                "ready": {r: self.ready(r) for r in ROLES}, "pods": [asdict(p) for p in self.pods]}

    def table(self) -> str:
        rows = [("ROLE", "POD", "READY", "PHASE", "RESTARTS", "NODE")]
        for p in self.pods:
            role = f"stage {p.stage}" if p.stage else p.role
            rows.append((role, p.name, "yes" if p.ready else "no", p.phase, str(p.restarts), p.node or "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        summary = ", ".join(f"{r} {self.ready(r)}/{self.expected.get(r, 0)} ready" for r in ROLES)
        lines.append(f"{summary}: pipeline {'READY' if self.pipeline_ready else 'NOT READY'}")
        return "\n".join(lines)


def _pod_status(pod, role: str, stage_set: str) -> PodStatus:
    conditions = (pod.status.conditions if pod.status else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    restarts = sum(cs.restart_count or 0 for cs in (pod.status.container_statuses or [])) if pod.status else 0
    name = pod.metadata.name
    stage = None
    if role == "stage" and name.startswith(stage_set + "-") and name.rsplit("-", 1)[1].isdigit():
        stage = int(name.rsplit("-", 1)[1]) + 1
    return PodStatus(role, name, ready, (pod.status.phase if pod.status else None) or "Unknown", restarts,
                     pod.spec.node_name if pod.spec else "", stage)


def status(api, cfg: RenderConfig) -> Status:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    selector = ",".join(f"{k}={v}" for k, v in cfg.selector().items())
    pods = core.list_namespaced_pod(cfg.namespace, label_selector=selector).items
    st = Status(cfg.namespace)
    for pod in pods:
        labels = pod.metadata.labels if pod.metadata else None
        role = (labels or {}).get("app.kubernetes.io/component", "?")
        st.pods.append(_pod_status(pod, role, cfg.stage))
    order = {r: i for i, r in enumerate(ROLES)}
    st.pods.sort(key=lambda p: (order.get(p.role, 9), p.stage or 0, p.name))
    for role, name, read in (("stage", cfg.stage, apps.read_namespaced_stateful_set),
                             ("drafter", cfg.drafter, apps.read_namespaced_deployment),
                             ("orchestrator", cfg.orchestrator, apps.read_namespaced_deployment)):
        try:
            st.expected[role] = read(name, cfg.namespace).spec.replicas or 0
        except ApiException as e:
            if e.status != 404:
                raise
            st.expected[role] = 0
    return st


# ----------------------------------------------------------------------------------------------- chaos

def _name(pod: V1Pod) -> str:
    assert pod.metadata is not None and pod.metadata.name is not None  # the API server names every pod
    return pod.metadata.name


@dataclass
class ChaosReport:
    pod: str  # the stage pod deleted (or chosen)
    stage: int  # its stage index
    after_tokens: int  # delete once this many tokens had streamed
    deleted: bool = False  # the delete call was made before the stream ended
    tokens_at_delete: int = 0
    completed: bool = False  # the stream ended normally (finish_reason stop/length)
    finish_reason: str | None = None
    tokens: int = 0
    recoveries: int | None = None  # the orchestrator's count for this request
    identical_to_baseline: bool | None = None  # None: no baseline run
    seconds: float = 0.0
    replaced: bool | None = None  # a new pod of that name became Ready (None: not waited for)
    replaced_after_s: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.deleted and self.completed and self.identical_to_baseline is not False and self.replaced is not False


def chaos(api, cfg: RenderConfig, address: str, prompt: str, max_tokens: int = 256, after_tokens: int = 16,
          seed: int | None = None, grace_s: int = 0, baseline: bool = True, wait_ready_s: float = 0.0,
          timeout_s: float = 900.0, token: str | None = None, client_factory=None) -> ChaosReport:
    """Delete a random stage pod mid-generation; did the stream complete (with the same tokens)?"""
    from kubernetes import client

    from spd_client import SPDClient, SPDError

    core = client.CoreV1Api(api)
    selector = ",".join(f"{k}={v}" for k, v in cfg.selector("stage").items())
    pods = sorted(_name(p) for p in core.list_namespaced_pod(cfg.namespace, label_selector=selector).items)
    if not pods:
        raise SystemExit(f"no stage pods ({selector}) in namespace {cfg.namespace}")
    victim = random.Random(seed).choice(pods)
    old_meta = core.read_namespaced_pod(victim, cfg.namespace).metadata
    old_uid = old_meta.uid if old_meta else None
    report = ChaosReport(victim, int(victim.rsplit("-", 1)[1]) + 1, after_tokens)
    make = client_factory or (lambda: SPDClient(address, timeout=timeout_s, token=token))
    params: Params = {"max_tokens": max_tokens, "temperature": 0.0}
    with make() as spd:
        expected = spd.generate(prompt, **params).token_ids if baseline else None
        tokens: list[int] = []
        t0 = time.monotonic()
        try:
            for chunk in spd.stream(prompt, **params):
                tokens += chunk.token_ids
                if chunk.finish_reason:
                    report.finish_reason = chunk.finish_reason
                    report.recoveries = (chunk.stats or {}).get("recoveries")
                if not report.deleted and not chunk.finish_reason and len(tokens) >= after_tokens:
                    log.warning("[chaos] deleting pod %s (stage %d) after %d tokens", victim, report.stage, len(tokens))
                    core.delete_namespaced_pod(victim, cfg.namespace, grace_period_seconds=grace_s)
                    report.deleted, report.tokens_at_delete = True, len(tokens)
            report.completed = report.finish_reason in ("stop", "length")
        except SPDError as e:
            report.error = f"{e.code.name}: {e.details}"
        report.seconds = round(time.monotonic() - t0, 3)
        report.tokens = len(tokens)
        if expected is not None:
            report.identical_to_baseline = tokens == expected
    if report.deleted and wait_ready_s > 0:
        report.replaced, report.replaced_after_s = _wait_replaced(core, victim, cfg.namespace, old_uid, wait_ready_s)
    return report


def _wait_replaced(core, name: str, namespace: str, old_uid: str | None, timeout_s: float) -> tuple[bool, float | None]:
    from kubernetes.client.exceptions import ApiException

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            pod = core.read_namespaced_pod(name, namespace)
            ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
            if pod.metadata.uid != old_uid and ready:
                return True, round(time.monotonic() - t0, 3)
        except ApiException as e:
            if e.status != 404:
                raise
        time.sleep(1.0)
    return False, None
