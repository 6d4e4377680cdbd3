"""The deploy tool's API calls, made by the real `kubernetes` client over HTTP to a loopback stub of
the API server (tests/k8s_stub.py), which records them. No cluster is involved: this checks what
is sent (verbs, paths, query parameters, content types, bodies, order) and that replies are
understood, not how a real API server or its controllers would react."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import threading

import pytest

from k8s_stub import StubAPIServer, pod
from spd.cli import main as spd_main
from spd.k8s import deploy
from spd.k8s.render import RenderConfig, render

CFG = RenderConfig(n=3)
PLURAL = {"Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps",
          "Service": "services", "StatefulSet": "statefulsets", "Deployment": "deployments",
          "PodDisruptionBudget": "poddisruptionbudgets", "NetworkPolicy": "networkpolicies"}
PREFIX = {"v1": "/api/v1", "apps/v1": "/apis/apps/v1", "policy/v1": "/apis/policy/v1",
          "networking.k8s.io/v1": "/apis/networking.k8s.io/v1"}


def path_of(obj: dict) -> str:
    if obj["kind"] == "Namespace":
        return f"/api/v1/namespaces/{obj['metadata']['name']}"
    return f"{PREFIX[obj['apiVersion']]}/namespaces/{obj['metadata']['namespace']}/{PLURAL[obj['kind']]}/{obj['metadata']['name']}"


@pytest.fixture
def stub(tmp_path):
    with StubAPIServer() as s:
        s.kubeconfig_path = str(s.kubeconfig(tmp_path / "kubeconfig"))
        yield s


def spd(argv: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = spd_main(argv)
    return rc, buf.getvalue()


def test_apply_is_a_server_side_apply_of_every_rendered_object_in_order(stub):
    rc, out = spd(["k8s", "apply", "--n", "3", "--kubeconfig", stub.kubeconfig_path])
    assert rc == 0
    objs = render(CFG)
    assert [(q.method, q.path) for q in stub.requests] == [("PATCH", path_of(o)) for o in objs]
    for q, obj in zip(stub.requests, objs):
        assert q.content_type == "application/apply-patch+yaml"
        assert q.query == {"fieldManager": ["spd-k8s"], "force": ["true"]}
        assert q.authorization == "Bearer stub-token"
        assert q.body == obj  # exactly the rendered manifest (JSON is YAML)
    assert len(stub.objects) == len(objs) and out.count("applied ") == len(objs)


def test_apply_dry_run_asks_the_server_not_to_persist(stub):
    rc, _ = spd(["k8s", "apply", "--n", "3", "--dry-run", "--kubeconfig", stub.kubeconfig_path])
    assert rc == 0 and all(q.query.get("dryRun") == ["All"] for q in stub.requests)
    assert not stub.objects


def _seed_pods(stub, ready_stages: int, orchestrator: bool = True):
    for k in range(CFG.n):
        stub.put("pods", "spd", pod(f"spd-stage-{k}", "spd", CFG.labels("stage"), ready=k < ready_stages, restarts=k))
    stub.put("pods", "spd", pod("spd-drafter-7d4b9-x2x", "spd", CFG.labels("drafter")))
    if orchestrator:
        stub.put("pods", "spd", pod("spd-orchestrator-5c6f-abcde", "spd", CFG.labels("orchestrator")))
    stub.put("pods", "spd", pod("someone-else", "spd", {"app": "other"}))  # not ours: never listed


def test_status_lists_pods_per_role_with_readiness(stub):
    deploy.apply(deploy.api_client(stub.kubeconfig_path), render(CFG), out=lambda *_: None)
    _seed_pods(stub, ready_stages=2)
    stub.requests.clear()
    rc, out = spd(["k8s", "status", "--n", "3", "--kubeconfig", stub.kubeconfig_path])
    assert rc == 1  # stage 3 is not ready
    lines = out.splitlines()
    assert lines[0].split() == ["ROLE", "POD", "READY", "PHASE", "RESTARTS", "NODE"]
    assert [line.split()[:4] for line in lines[1:4]] == [["stage", "1", "spd-stage-0", "yes"],
                                                         ["stage", "2", "spd-stage-1", "yes"],
                                                         ["stage", "3", "spd-stage-2", "no"]]
    assert "someone-else" not in out
    assert lines[-1] == "stage 2/3 ready, drafter 1/1 ready, orchestrator 1/1 ready: pipeline NOT READY"
    (listing,) = [q for q in stub.requests if q.path == "/api/v1/namespaces/spd/pods"]
    assert listing.method == "GET"
    assert listing.query["labelSelector"] == ["app.kubernetes.io/name=spd,app.kubernetes.io/instance=spd"]
    assert {q.path for q in stub.requests} >= {"/apis/apps/v1/namespaces/spd/statefulsets/spd-stage",
                                               "/apis/apps/v1/namespaces/spd/deployments/spd-drafter"}

    stub.put("pods", "spd", pod("spd-stage-2", "spd", CFG.labels("stage")))
    rc, out = spd(["k8s", "status", "--n", "3", "--json", "--kubeconfig", stub.kubeconfig_path])
    st = json.loads(out)
    assert rc == 0 and st["pipeline_ready"] and st["ready"] == {"stage": 3, "drafter": 1, "orchestrator": 1}
    assert st["expected"] == {"stage": 3, "drafter": 1, "orchestrator": 1}


def test_status_of_nothing_deployed_is_not_ready(stub):
    rc, out = spd(["k8s", "status", "--n", "3", "--kubeconfig", stub.kubeconfig_path])
    assert rc == 1 and "stage 0/0 ready" in out


def test_delete_removes_in_reverse_order_keeps_the_namespace_and_tolerates_absence(stub):
    api = deploy.api_client(stub.kubeconfig_path)
    objs = render(CFG)
    deploy.apply(api, objs, out=lambda *_: None)
    stub.requests.clear()
    rc, _ = spd(["k8s", "delete", "--n", "3", "--kubeconfig", stub.kubeconfig_path])
    assert rc == 0
    expected = [("DELETE", path_of(o)) for o in reversed(objs) if o["kind"] != "Namespace"]
    assert [(q.method, q.path) for q in stub.requests] == expected
    assert all(q.query == {"propagationPolicy": ["Background"]} for q in stub.requests)
    assert list(stub.objects) == [("namespaces", None, "spd")]
    result = deploy.delete(api, objs, keep_namespace=False, out=lambda *_: None)  # again: 404s are fine
    assert result["namespace/spd"] == "deleted" and result["statefulset/spd-stage -n spd"] == "absent"
    assert not stub.objects


def test_an_api_error_other_than_404_is_raised(stub):
    from kubernetes.client.exceptions import ApiException

    api = deploy.api_client(stub.kubeconfig_path)
    stub.answer = lambda req: (403, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                                     "reason": "Forbidden", "message": "no"})
    with pytest.raises(ApiException) as e:
        deploy.delete(api, render(CFG), out=lambda *_: None)
    assert e.value.status == 403


# ----------------------------------------------------------------------------------------------- chaos

@pytest.fixture(scope="module")
def chaos_model(tmp_path_factory):
    from spd.models.loading import resolve_model
    from spd.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("k8s-chaos") / "tiny", "llama", vocab_size=49152, num_layers=4,
                           hidden_size=64, tokenizer_from=resolve_model(None), init_std=0.5)


@pytest.mark.processes  # a real local pipeline: runs serially (scripts/test.sh)
def test_chaos_deletes_a_stage_pod_mid_stream_and_reports_a_completed_identical_stream(stub, chaos_model, tmp_path):
    """The real chaos command, the real client library, a real local pipeline (`spd up`'s Cluster)
    and a real fault: the stub API server kills the stage process that the deleted pod stands for
    (SIGKILL, like grace 0) and the supervisor restarts it, as the StatefulSet controller would."""
    from cluster_util import address, pid_of, running_cluster, supervised

    n = 2
    cfg = RenderConfig(n=n)
    with running_cluster(tmp_path, n=n, model=str(chaos_model), draft="random") as cluster, supervised(cluster):
        for k in range(n):
            stub.put("pods", "spd", pod(f"spd-stage-{k}", "spd", cfg.labels("stage")))
        killed = []

        def on_delete(plural, namespace, name):
            assert (plural, namespace) == ("pods", "spd")
            k = int(name.rsplit("-", 1)[1])
            os.kill(pid_of(cluster, f"stage-{k + 1}"), signal.SIGKILL)
            killed.append(name)
            # the controller's replacement: same name, new uid, Ready once the process is back
            threading.Timer(1.0, lambda: stub.put("pods", "spd", pod(name, "spd", cfg.labels("stage")))).start()

        stub.on_delete = on_delete
        rc, out = spd(["k8s", "chaos", "--n", str(n), "--kubeconfig", stub.kubeconfig_path, "--address", address(cluster),
                       "--prompt", "tell me a long story about a lighthouse", "--max-tokens", "120",
                       "--after-tokens", "8", "--seed", "1", "--wait-ready", "20", "--timeout", "180"])
    report = json.loads(out)
    assert rc == 0 and report["ok"]
    assert killed == [report["pod"]] and report["deleted"] and report["tokens_at_delete"] >= 8
    assert report["stage"] == int(report["pod"].rsplit("-", 1)[1]) + 1
    assert report["completed"] and report["finish_reason"] in ("stop", "length") and report["error"] is None
    assert report["identical_to_baseline"] is True  # same tokens as the fault-free run before it
    assert report["recoveries"] >= 1  # the fault landed mid-stream and the orchestrator recovered
    assert report["replaced"] is True
    (delete,) = [q for q in stub.requests if q.method == "DELETE"]
    assert delete.path == f"/api/v1/namespaces/spd/pods/{report['pod']}"
    assert delete.query == {"gracePeriodSeconds": ["0"]}


class _FakeSPD:
    """A client whose stream ends after `total` tokens (or fails after `fail_at`)."""

    def __init__(self, total: int, fail_at: int | None = None):
        self.total, self.fail_at = total, fail_at

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def generate(self, prompt, **params):
        from spd_client.client import Result

        return Result("", list(range(self.total)), "length")

    def stream(self, prompt, **params):
        from spd_client.client import Chunk, SPDError
        import grpc

        for t in range(self.total):
            if t == self.fail_at:
                raise SPDError(grpc.StatusCode.UNAVAILABLE, "pipeline failed")
            last = t == self.total - 1
            yield Chunk([t], "x", "length" if last else None, {"recoveries": 0} if last else None)


def test_chaos_reports_a_fault_that_did_not_land_and_a_failed_stream(stub):
    for k in range(CFG.n):
        stub.put("pods", "spd", pod(f"spd-stage-{k}", "spd", CFG.labels("stage")))
    api = deploy.api_client(stub.kubeconfig_path)
    early = deploy.chaos(api, CFG.resolved(), "unused", "p", after_tokens=50, seed=0, client_factory=lambda: _FakeSPD(10))
    assert not early.deleted and early.completed and not early.ok
    assert not [q for q in stub.requests if q.method == "DELETE"]
    failed = deploy.chaos(api, CFG.resolved(), "unused", "p", after_tokens=3, seed=0,
                          client_factory=lambda: _FakeSPD(10, fail_at=6))
    assert failed.deleted and not failed.completed and failed.error == "UNAVAILABLE: pipeline failed" and not failed.ok
    assert failed.pod == early.pod  # the seed picks the pod
